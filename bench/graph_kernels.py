"""CUDA kernels per decode step: one eager run of the captured region (`decode_body`) under
torch.profiler, per identity and B; the graph replays exactly these launches (its node count).
Also GPU time of one graph replay (CUDA events, median of 20).

    PYTHONPATH=$PWD python3 bench/graph_kernels.py --identity qwen3_6-tiny-dense qwen3_6-27b --batches 1 8
"""
from __future__ import annotations

import argparse
import collections
import importlib

import torch

from ninfer.bench.common import graph_replay_ms
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.program.config import ProgramConfig
from ninfer.targets.qwen3_6.program.cuda_graphs import decode_body


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--identity", nargs="+", default=["qwen3_6-tiny-dense", "qwen3_6-27b"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    a = ap.parse_args()
    rows = []
    for ident in a.identity:
        w = DummyWeights(ident, device="cuda", dtype=torch.bfloat16, seed=1)
        pkg = importlib.import_module(w.package.module)
        prog = pkg.create_program(w, ProgramConfig(device="cuda", dtype="bf16", page_size=64, num_pages=160,
                                                   num_slots=8, max_model_len=2048, max_batch=max(a.batches),
                                                   max_steps=1))
        gs = prog.graphs
        for B in a.batches:
            g = gs._graphs[B]
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as p:
                decode_body(prog.model, prog._state, g)
                torch.cuda.synchronize()
            names = collections.Counter(e.name for e in p.events()
                                        if e.device_type == torch.autograd.DeviceType.CUDA)
            n = sum(names.values())
            ms = graph_replay_ms(g.graph, n=20, skip=3)
            layers = prog.dims.num_hidden_layers
            rows.append((ident, B, n, n / layers, ms))
            print(f"{ident} B={B}: {n} kernels per step ({n / layers:.1f} per layer), replay "
                  f"{ms:.3f} ms; top: {names.most_common(12)}", flush=True)
        del prog, gs, w
        torch.cuda.empty_cache()
    print("\n      identity  B  kernels  per_layer  replay_ms")
    for r in rows:
        print(f"{r[0]:>14}  {r[1]}  {r[2]:7d}  {r[3]:9.1f}  {r[4]:9.3f}")


if __name__ == "__main__":
    main()
