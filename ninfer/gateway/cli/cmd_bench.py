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
        if args.bench in ("decode", "prefill", "serve"):
            check_memory(args.identity, getattr(args, "device", None))
    return importlib.import_module(SUBCOMMANDS[args.bench][0]).run(args)


def check_memory(identities: list[str], device: str | None) -> None:
    """Refuse, before anything is built, an identity whose weights do not fit on the device (the benchmarks run
    the real sizes on synthetic weights, on the CPU where there is no CUDA); the Engine's own check at each
    step then covers the KV cache of the lengths measured."""
    from ninfer.config import EngineConfig
    from ninfer.engine.facade import DeviceUnavailableError, InsufficientMemoryError, check_model
    from ninfer.gateway.cli.main import CLIError

    for ident in identities:
        cfg = EngineConfig(load_format="dummy", identity=ident, device=device or "auto", max_concurrency=1,
                           max_model_len=2 * EngineConfig.page_size, prefill_chunk_tokens=256)
        try:
            check_model(None, cfg)
        except DeviceUnavailableError as e:
            raise CLIError(f"--device {device}: {str(e).partition(': ')[2]}") from None
        except InsufficientMemoryError as e:
            raise CLIError(f"{e.facts}: pass --identity qwen3_6-tiny-dense (and --device cpu) for a run of the "
                           f"wiring, or run on a CUDA device with more memory") from None
