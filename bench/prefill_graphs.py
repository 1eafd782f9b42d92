"""TTFT with and without the whole-stage prefill graphs (runtime/prefill_graphs.py), one process, interleaved.

    python3 bench/prefill_graphs.py [--identity qwen3_6-35b-a3b qwen3_6-27b] [--lengths 6 100 ...] [--reps 4]
        [--turns 1000:50 4000:300 ...]

Per identity, one Program (bf16 synthetic weights, decode graphs at B=1, as `ninfer serve` runs) and for each
prompt length two stagings: `one` (the whole prompt as one final stage: the context cache off, or
`ninfer bench prefill`) and `cache` (all tokens but one, then the last token through the decode graph:
what a server with the context cache does with a fresh prompt). Each is timed with the prefill graphs on
and off (`Program.prefill_graphs_enabled`), alternating, after one untimed run of each (the compiles,
captures and plans). Prints the median TTFT of each, and the captures' time and memory.

--turns R:N adds stages over a prefix: a prompt of R + N tokens prefilled as R tokens (untimed), then the
final stage of N tokens over that prefix, timed from its start to its first token. That is a chat's next
turn or a context-cache hit after the prefix's pages are adopted (the Program-level work; the Engine's
cache lookup aside).
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time

import torch

from ninfer.bench.args import prefix_turn
from ninfer.bench.prefill import PAGE, prefill_once
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.program.config import ProgramConfig


def _timed(rows, identity, label, fields, reps, prog, once) -> None:
    """Graph and eager runs of `once()`, alternating, after one untimed run of each; a row of medians."""
    times = {"graph": [], "eager": []}
    for i in range(reps + 1):
        for mode in ("graph", "eager") if i % 2 == 0 else ("eager", "graph"):
            prog.prefill_graphs_enabled = mode == "graph"
            t = once()
            if i:
                times[mode].append(t)
    g, e = statistics.median(times["graph"]), statistics.median(times["eager"])
    rows.append(dict(identity=identity, **fields, graph_ms=g, eager_ms=e, saved_ms=e - g,
                     all_graph=times["graph"], all_eager=times["eager"]))
    print(f"[{identity}] {label}: graph {g:8.2f} ms  eager {e:8.2f} ms  saved {e - g:7.2f} ms", flush=True)


def run_identity(identity: str, lengths: list[int], reps: int, turns: list[tuple[int, int]]) -> list[dict]:
    w = DummyWeights(identity, device="cuda", dtype=torch.bfloat16, seed=0)
    pkg = importlib.import_module(w.package.module)
    max_len = max(lengths + [r + n for r, n in turns]) + 16
    prog = pkg.create_program(w, ProgramConfig(device="cuda", dtype="bf16", page_size=PAGE,
                                               num_pages=max_len // PAGE + 8, num_slots=2, max_model_len=max_len,
                                               max_batch=1, max_steps=1))
    pg = prog.prefill_graphs
    rng = torch.Generator().manual_seed(0)
    V = w.dims.vocab_size
    rows = []
    reserved0 = torch.cuda.memory_reserved()
    def fresh(n):
        return tuple(torch.randint(0, V, (n,), generator=rng).tolist())
    for L in lengths:
        stagings = [("one", 0)] + ([("cache", L - 1)] if L > 1 else [])
        for name, chunk in stagings:
            _timed(rows, identity, f"prompt {L:5d} {name:5s}", dict(prompt=L, staging=name), reps, prog,
                   lambda: prefill_once(prog, fresh(L), chunk, "cuda"))
    for R, N in turns:
        _timed(rows, identity, f"turn {R:5d}+{N:<5d}", dict(prompt=R + N, staging="turn", prefix=R, new=N), reps,
               prog, lambda: prefill_once(prog, fresh(R + N), 0, "cuda", prefix=R))
    print(f"[{identity}] prefill graphs: {len(pg._graphs)} captured in {pg.capture_s:.1f} s "
          f"(buckets {sorted(pg._graphs)}), {pg.replays} replays; memory reserved "
          f"+{(torch.cuda.memory_reserved() - reserved0) / 2**20:.0f} MiB over the run", flush=True)
    del prog, w
    torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--identity", nargs="+", default=["qwen3_6-35b-a3b", "qwen3_6-27b"])
    ap.add_argument("--lengths", nargs="+", type=int, default=[6, 100, 500, 1000, 1500, 2000])
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--turns", nargs="*", type=prefix_turn, default=[], metavar="R:N",
                    help="stages of N tokens over a prefix of R tokens")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    rows = []
    for ident in a.identity:
        rows += run_identity(ident, a.lengths, a.reps, a.turns)
    print("JSON " + json.dumps({"results": rows, "wall_s": time.perf_counter() - t0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
