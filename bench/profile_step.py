"""Where the GPU time of one step goes: per-kernel durations (CUPTI, torch.profiler) of

  * a decode graph replay (real sizes, synthetic weights): kernel time vs the replay's span, so the
    launch gaps between kernels are measured apart from what the kernels themselves take;
    with --pdl also the replay time of graphs captured with programmatic dependent launch switched
    the other way (NINFER_PDL) in the same process;
  * one prefill of an L-token prompt (eager, as the Engine runs it), grouped by kernel.

NOTE: the decode graphs replay the static inputs of their capture (B copies of token 0, context 1):
      at B > 1 every row of an MoE picks the same experts, so a 35B-A3B replay there reads fewer
      expert bytes than a real round (bench/decode_round.py times the replay after a real round).
      With PDL on, a kernel's duration includes its wait in griddepcontrol.wait: take per-kernel
      breakdowns with NINFER_PDL=0.

    PYTHONPATH=$PWD python3 bench/profile_step.py --decode qwen3_6-27b qwen3_6-35b-a3b --batches 1 --pdl \
        --prefill qwen3_6-27b:8192
"""
from __future__ import annotations

import argparse
import collections
import gc
import importlib
import os
import re
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ninfer.bench.common import graph_replay_ms
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.program.config import ProgramConfig
from ninfer.targets.qwen3_6.program.cuda_graphs import DecodeGraphs

CUDA = torch.autograd.DeviceType.CUDA


def short(name: str) -> str:
    name = re.sub(r"<.*", "", name)
    return name[:70]


def kernels(p) -> list:
    evs = [e for e in p.events() if e.device_type == CUDA]
    return sorted(evs, key=lambda e: e.time_range.start)


def table(evs: list, per: int, top: int, total_ms: float | None = None) -> None:
    agg = collections.defaultdict(lambda: [0, 0.0])
    for e in evs:
        a = agg[short(e.name)]
        a[0] += 1
        a[1] += e.time_range.end - e.time_range.start
    rows = sorted(agg.items(), key=lambda kv: -kv[1][1])
    ksum = sum(v[1] for v in agg.values()) / per / 1e3
    print(f"  {'kernel':70s} {'n':>6s} {'ms':>9s} {'us/call':>8s} {'%':>5s}")
    for name, (n, us) in rows[:top]:
        print(f"  {name:70s} {n / per:6.0f} {us / per / 1e3:9.3f} {us / n:8.2f} {100 * us / per / 1e3 / ksum:5.1f}")
    rest = rows[top:]
    if rest:
        print(f"  {'(' + str(len(rest)) + ' more names)':70s} {sum(v[0] for _, v in rest) / per:6.0f} "
              f"{sum(v[1] for _, v in rest) / per / 1e3:9.3f}")
    print(f"  kernel time per step {ksum:.3f} ms" + (f"; wall {total_ms:.3f} ms" if total_ms else ""))


def decode(ident: str, batches: list[int], pdl: bool, top: int, sequence: int = 0) -> None:
    w = DummyWeights(ident, device="cuda", dtype=torch.bfloat16, seed=1)
    pkg = importlib.import_module(w.package.module)
    cfg = ProgramConfig(device="cuda", dtype="bf16", page_size=64, num_pages=160, num_slots=8, max_model_len=2048,
                        max_batch=max(batches), max_steps=1)
    prog = pkg.create_program(w, cfg)
    for B in batches:
        g = prog.graphs._graphs[B]
        base = graph_replay_ms(g.graph)
        reps = 5
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(reps):
                g.graph.replay()
            torch.cuda.synchronize()
        evs = kernels(p)
        n = len(evs) // reps
        print(f"\n[{ident} B={B}] replay {base:.3f} ms; {len(evs)} kernel records over {reps} replays", flush=True)
        if n:
            spans, busy = [], []
            for r in range(reps):
                chunk = evs[r * n:(r + 1) * n]
                spans.append((chunk[-1].time_range.end - chunk[0].time_range.start) / 1e3)
                busy.append(sum(e.time_range.end - e.time_range.start for e in chunk) / 1e3)
            print(f"  per replay: {n} kernels, span {statistics.median(spans):.3f} ms, kernel busy "
                  f"{statistics.median(busy):.3f} ms, gaps {statistics.median(spans) - statistics.median(busy):.3f} ms "
                  f"({(statistics.median(spans) - statistics.median(busy)) / n * 1e3:.2f} us per kernel)")
            table(evs, reps, top, base)
            if sequence:
                chunk = evs[(reps - 1) * n:]
                t0 = chunk[0].time_range.start
                print(f"  the last replay's first {sequence} kernels: start, gap before, duration (us), name")
                prev = t0
                for e in chunk[:sequence]:
                    a, b = e.time_range.start, e.time_range.end
                    print(f"  {a - t0:8.2f} {a - prev:6.2f} {b - a:7.2f}  {short(e.name)}")
                    prev = b
    if pdl:
        from ninfer.ops.triton import _pdl
        was = _pdl.enabled()
        os.environ["NINFER_PDL"] = "0" if was else "1"
        _pdl.enabled.cache_clear()
        print(f"\n[{ident}] PDL enabled for the first graphs: {was}, for the second: {_pdl.enabled()}", flush=True)
        gs = DecodeGraphs(prog.model, prog._state, cfg.max_batch, cfg.max_model_len, cfg.page_size,
                          torch.device("cuda"))
        gs.capture()
        for B in batches:
            other = graph_replay_ms(gs._graphs[B].graph)
            first = graph_replay_ms(prog.graphs._graphs[B].graph)
            on, off = (first, other) if was else (other, first)
            print(f"[{ident} B={B}] replay without PDL {off:.3f} ms, with PDL {on:.3f} ms "
                  f"({off - on:+.3f} ms)", flush=True)
        os.environ.pop("NINFER_PDL")
        _pdl.enabled.cache_clear()
        del gs
    del prog, w
    gc.collect()
    torch.cuda.empty_cache()


def prefill(spec: str, top: int) -> None:
    from ninfer.bench.prefill import prefill_once
    ident, L = spec.split(":")
    L = int(L)
    w = DummyWeights(ident, device="cuda", dtype=torch.bfloat16, seed=0)
    pkg = importlib.import_module(w.package.module)
    cfg = ProgramConfig(device="cuda", dtype="bf16", page_size=64, num_pages=L // 64 + 8, num_slots=2,
                        max_model_len=L + 16, max_batch=1, max_steps=1, enforce_eager=True)
    prog = pkg.create_program(w, cfg)
    rng = torch.Generator().manual_seed(0)

    def prompt():
        return tuple(torch.randint(0, w.dims.vocab_size, (L,), generator=rng).tolist())

    t0 = time.perf_counter()
    for _ in range(2):
        ms = prefill_once(prog, prompt(), 0, "cuda")
    print(f"\n[{ident} prefill {L}] warm-up {time.perf_counter() - t0:.1f} s; last {ms:.1f} ms", flush=True)
    ms = prefill_once(prog, prompt(), 0, "cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        ms_p = prefill_once(prog, prompt(), 0, "cuda")
    evs = kernels(p)
    span = (evs[-1].time_range.end - evs[0].time_range.start) / 1e3 if evs else 0.0
    print(f"[{ident} prefill {L}] {ms:.1f} ms (under the profiler {ms_p:.1f}); {len(evs)} kernels, GPU span "
          f"{span:.1f} ms", flush=True)
    table(evs, 1, top, ms)
    del prog, w
    gc.collect()
    torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--decode", nargs="*", default=[])
    ap.add_argument("--batches", nargs="+", type=int, default=[1])
    ap.add_argument("--pdl", action="store_true", help="also time graphs captured with PDL switched the other way")
    ap.add_argument("--prefill", nargs="*", default=[], help="IDENTITY:LENGTH")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--sequence", type=int, default=0,
                    help="also list the first N kernels of one decode replay in order (start, gap, duration)")
    a = ap.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for ident in a.decode:
        decode(ident, a.batches, a.pdl, a.top, a.sequence)
    for spec in a.prefill:
        prefill(spec, a.top)


if __name__ == "__main__":
    main()
