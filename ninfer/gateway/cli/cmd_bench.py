"""`ninfer bench {decode,prefill,serve,kernels}`: the benchmarks of ninfer/bench/ (synthetic weights).
decode, prefill and serve drive the public Engine; the Program-level step timer (a developer tool) is
bench/program_step.py.

Each prints a table with the performance.md floor beside every figure and one `JSON {...}` line
(machine, torch/triton versions, identity, dtype, batch, lengths, commit); `--out DIR` also
writes DIR/<bench>.json, rewritten after every measured row (partial results survive a kill).
"""
from __future__ import annotations

import argparse
import importlib

SUBCOMMANDS = {
    "decode": ("ninfer.bench.decode", "decode round time (TPOT) through the Engine, B=1..8, with a transformers baseline"),
    "prefill": ("ninfer.bench.prefill", "prefill TTFT and throughput through the Engine for 1k/8k/32k prompts"),
    "serve": ("ninfer.bench.serve", "end-to-end OpenAI-API serving: TTFT, TPOT, tokens/s at concurrency 1..8"),
    "kernels": ("ninfer.bench.kernels", "every fast op vs its PyTorch reference at the 27B shapes (CUDA only)"),
}


def add_parser(p: argparse.ArgumentParser) -> None:
    from ninfer.bench import args as bench_args     # NOTE: flags only; the bench modules load when one runs
    sub = p.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name, (mod, help_) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_, description=help_)
        getattr(bench_args, f"{name}_args")(sp)


def run(args: argparse.Namespace) -> int:
    from ninfer.gateway.cli.main import CLIError

    if args.bench == "kernels":
        import torch
        if not torch.cuda.is_available():
            raise CLIError("the kernel bench needs a CUDA device (the fast ops are Triton kernels)")
    if args.bench in ("decode", "serve"):
        from ninfer.bench.args import speculative_configs
        speculative_configs(args)             # NOTE: a bad speculative flag fails before anything is built
    if getattr(args, "identity", None):
        from ninfer.targets.registry import UnknownIdentityError, lookup
        for ident in args.identity:
            try:
                lookup(ident)
            except UnknownIdentityError as e:
                raise CLIError(str(e)) from None
    return importlib.import_module(SUBCOMMANDS[args.bench][0]).run(args)
