"""Flags of the benchmarks (no torch import: `ninfer --help` stays fast)."""
from __future__ import annotations

import argparse
import math
from typing import Callable

from ninfer.config import MAX_CONCURRENCY as MAX_BATCH       # no torch import (see the module docstring)
from ninfer.gateway.cli.common import add_speculative_args


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in lo..hi (hi None: no upper bound); the error names the range."""
    want = f"an integer in {lo}..{hi}" if hi is not None else f"an integer >= {lo}"

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be {want}, got {v}")
        return v
    return parse


def prefix_turn(spec: str) -> tuple[int, int]:
    """An argparse type: R:N, a prefix of R tokens and a stage of N new tokens over it, both >= 1."""
    try:
        R, N = (int(x) for x in spec.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r} is not R:N (two integers, e.g. 1000:300)") from None
    if R < 1 or N < 1:
        raise argparse.ArgumentTypeError(f"{spec!r}: R and N must be at least 1")
    return R, N


def float_in(lo: float, hi: float | None = None, *, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number >= lo (> lo when lo_open) and <= hi."""
    want = (f"a number {'>' if lo_open else '>='} {lo:g}" + (f" and <= {hi:g}" if hi is not None else ""))

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {want}, got {text!r}") from None
        if not math.isfinite(v) or v < lo or (lo_open and v == lo) or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"must be {want}, got {text}")
        return v
    return parse


class DistinctList(argparse.Action):
    """A nargs="+" flag whose values may not repeat (the error names the repeated value)."""

    def __call__(self, parser, namespace, values, option_string=None):
        repeated = sorted({v for v in values if values.count(v) > 1})
        if repeated:
            raise argparse.ArgumentError(self, f"{', '.join(repeated)} given more than once")
        setattr(namespace, self.dest, list(values))


def add_common_args(ap, default_identities: list[str]) -> None:
    ap.add_argument("--identity", nargs="+", default=default_identities,
                    help=f"registered identities, synthetic weights (default: {' '.join(default_identities)})")
    ap.add_argument("--device", default=None, help="cuda | cpu (default: cuda when available)")
    ap.add_argument("--out", default=None, metavar="DIR", help="also write <DIR>/<bench>.json (rewritten as it goes)")
    ap.add_argument("--step-timeout", type=float_in(0.0), default=0.0, metavar="S",
                    help="give up a step (one identity / length / concurrency) after S seconds (0 = none)")


def add_hf_baseline_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--hf-baseline", dest="hf_baseline", action="store_true", default=None,
                    help="also time Hugging Face transformers on the same dims (default: on for CUDA runs)")
    ap.add_argument("--no-hf-baseline", dest="hf_baseline", action="store_false")


def hf_baseline_on(args: argparse.Namespace, cuda: bool) -> bool:
    """--hf-baseline / --no-hf-baseline as given, else on exactly for CUDA runs."""
    return cuda if args.hf_baseline is None else bool(args.hf_baseline)


def add_bench_speculative_args(ap: argparse.ArgumentParser) -> None:
    """`ninfer serve`'s speculative flags, --force-accept-len (a round's kept tokens on synthetic weights,
    whose drafts are otherwise almost never accepted; several values: one Engine each) and --with-plain;
    checked by `speculative_configs`."""
    g = ap.add_argument_group("speculative decoding")
    add_speculative_args(g, force_accept_len=True, force_accept_nargs="+",
                         force_accept_help="every speculative round keeps exactly L tokens (1..K+1; 0 = the "
                                           "model's own acceptance): the verify and commit run in full, so the "
                                           "round time and TPOT at acceptance length L are measured on synthetic "
                                           "weights; several values (e.g. 1 2 3 4) run one engine each")
    g.add_argument("--with-plain", action="store_true",
                   help="with speculation: also measure plain decoding (no speculation) first, in the same run")


def speculative_configs(args: argparse.Namespace) -> list:
    """The engines a bench runs per identity: [None] without speculation; else one SpeculativeConfig per
    --force-accept-len value, after None with --with-plain. A bad flag raises the CLI's one-line error."""
    from ninfer.gateway.cli.common import speculative_config

    forced = getattr(args, "force_accept_len", None)
    values = forced if isinstance(forced, list) else [forced]
    specs = [speculative_config(argparse.Namespace(**{**vars(args), "force_accept_len": v})) for v in values]
    if specs == [None]:
        if getattr(args, "with_plain", False):
            from ninfer.gateway.cli.main import CLIError
            raise CLIError("--with-plain needs --speculative-method and --num-speculative-tokens")
        return specs
    return ([None] if getattr(args, "with_plain", False) else []) + specs


def decode_args(ap: argparse.ArgumentParser) -> None:
    add_common_args(ap, ["qwen3_6-27b", "qwen3_6-35b-a3b"])
    ap.add_argument("--ctx", nargs="+", type=int_in(1), default=[1024, 8192], help="context (prompt) lengths")
    ap.add_argument("--max-model-len", type=int_in(0), default=0, metavar="N",
                    help="the Engine's max_model_len (default: largest ctx + 64, more when the decode budget of "
                         "--reps rounds needs it; a server runs at its configured limit, e.g. 8192 or 32768)")
    ap.add_argument("--reps", type=int_in(1), default=10, help="decode rounds timed per B (after 3 warm-up rounds)")
    ap.add_argument("--no-ref", action="store_true",
                    help="accepted, no effect: the Engine runs its own ops; the reference-ops comparison of the "
                         "Program's step is `python3 bench/program_step.py decode`")
    ap.add_argument("--batches", nargs="+", type=int_in(1, MAX_BATCH), default=list(range(1, 9)),
                    help="concurrent requests decoding together")
    ap.add_argument("--prefill-ref-gdn", action="store_true",
                    help="accepted, no effect: the Engine prefills with its own ops "
                         "(`python3 bench/program_step.py decode --prefill-ref-gdn` has it)")
    ap.add_argument("--enforce-eager", action="store_true",
                    help="no CUDA graphs (default: as `ninfer serve` runs, decode rounds replay CUDA graphs)")
    ap.add_argument("--host-overhead", action="store_true",
                    help="tiny dense on the GPU through the Engine: round time, graphs off and on")
    ap.add_argument("--json-schema-mask", action="store_true",
                    help="also the compile time of a 50-field JSON schema and, per ctx and B, the round with its "
                         "mask on every row beside the plain round (grammar-constrained decoding)")
    add_hf_baseline_args(ap)
    ap.add_argument("--hf-batches", nargs="+", type=int_in(1), default=[1, 8], help="batches of the HF baseline")
    add_bench_speculative_args(ap)


def prefill_args(ap: argparse.ArgumentParser) -> None:
    add_common_args(ap, ["qwen3_6-27b", "qwen3_6-35b-a3b"])
    ap.add_argument("--lengths", nargs="+", type=int_in(1), default=[1024, 8192, 32768], help="prompt lengths")
    ap.add_argument("--reps", type=int_in(1), default=3,
                    help="repetitions per length <= 8192 (first one reported apart)")
    ap.add_argument("--long-reps", type=int_in(1), default=1, help="repetitions per length > 8192")
    ap.add_argument("--chunk", type=int_in(0, 65536), default=0,
                    help="prefill stage size in tokens (0 = the whole prompt at once, up to 65536 tokens per stage)")
    ap.add_argument("--enforce-eager", action="store_true",
                    help="no CUDA graphs (default: as `ninfer serve` runs: short first stages replay a prefill graph)")
    add_hf_baseline_args(ap)


def serve_args(ap: argparse.ArgumentParser) -> None:
    add_common_args(ap, ["qwen3_6-27b", "qwen3_6-35b-a3b"])
    ap.add_argument("--concurrency", nargs="+", type=int_in(1, MAX_BATCH), default=[1, 2, 4, 8])
    ap.add_argument("--prompt-len", type=int_in(1), default=1024)
    ap.add_argument("--output-len", type=int_in(1), default=128)
    ap.add_argument("--requests-per-client", type=int_in(1), default=2)
    ap.add_argument("--temperature", type=float_in(0.0), default=0.0,
                    help="every request's temperature (default 0: greedy); > 0 draws (unseeded)")
    ap.add_argument("--top-p", type=float_in(0.0, 1.0, lo_open=True), default=1.0, help="every request's top_p")
    ap.add_argument("--top-k", type=int_in(0), default=0,
                    help="every request's top_k (default 0: off; the Qwen3.6 checkpoints' own default is 20)")
    ap.add_argument("--max-model-len", type=int_in(0), default=0, metavar="N",
                    help="the server's --max-model-len (default: prompt + output + 16; a deployment runs at its "
                         "configured limit, e.g. 8192, the engine default)")
    ap.add_argument("--startup-timeout", type=float_in(0.0, lo_open=True), default=300.0,
                    help="seconds to wait for the server's /health")
    ap.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                    help="extra `ninfer serve` argument (repeatable, e.g. --server-arg=--enforce-eager)")
    ap.add_argument("--client", nargs="+", choices=["http", "openai"], default=["http"], action=DistinctList,
                    help="http: raw streaming requests over httpx (default); openai: the official openai client, "
                         "whose per-request client CPU time then counts in the TTFT. Several (e.g. --client http "
                         "openai): each level runs once per client, in that order, against the same server")
    ap.add_argument("--in-process", action="store_true",
                    help="drive the public Engine in this process instead of `ninfer serve` (no HTTP): "
                         "the difference is what the gateway adds")
    add_bench_speculative_args(ap)


def kernels_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None, metavar="DIR", help="also write <DIR>/kernels.json")
