"""Where a decode round's time over its graph replay goes (B=1, ctx 1000, synthetic weights, one identity
per process):

  1. the replay (CUDA events) and the host time of the graph launch call (median of 30, GPU idle
     before): alone, after an eager kernel + D2H sync (what a round does between launches), and with
     the synchronize (what a round waits for the graph);
  2. a `Program.decode` round split by host stamps at the graph launch and the sampler;
  3. with --profile, a torch.profiler trace (CPU runtime calls + CUDA activity on one clock) of a few
     rounds: per round, when the first graph kernel starts after cudaGraphLaunch began, the launch call's
     length, the GPU span of the graph, and the gaps after it (argmax, D2H). The profiler's hooks make
     the launch call itself look several times slower than it is (bench/NOTES.md pass 5).

    PYTHONPATH=$PWD python3 bench/round_timeline.py --identity qwen3_6-27b [--profile]
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ninfer.bench.common import graph_replay_ms
from ninfer.contract.program import SamplingParams, SequenceRequest
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.program.config import ProgramConfig

CUDA = torch.autograd.DeviceType.CUDA


def timed(fn, before=None, n: int = 30) -> float:
    """Median host wall (ms) of fn() with the GPU idle before each call (`before()` runs first, untimed)."""
    ts = []
    for _ in range(n):
        if before is not None:
            before()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(ts)


def round_breakdown(prog, hs, n: int = 20) -> dict:
    """Median host stamps of a round: start -> graph run entry -> replay returned -> sampler entry ->
    sampler exit (waits for the GPU) -> round returned."""
    st: dict[str, float] = {}
    graphs, sampler = prog.graphs, prog._sampler
    run, greedy = graphs.run, sampler.greedy_tokens

    def t_run(*a, **k):
        st["run0"] = time.perf_counter()
        out = run(*a, **k)
        st["run1"] = time.perf_counter()
        return out

    def t_greedy(logits):
        st["s0"] = time.perf_counter()
        out = greedy(logits)
        st["s1"] = time.perf_counter()
        return out

    graphs.run, sampler.greedy_tokens = t_run, t_greedy
    rows = []
    try:
        for i in range(n + 5):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            b = prog.decode(hs)
            t1 = time.perf_counter()
            prog.abort_pending(b)
            if i >= 5:
                rows.append({"pre": st["run0"] - t0, "launch": st["run1"] - st["run0"],
                             "to_sampler": st["s0"] - st["run1"], "sampler": st["s1"] - st["s0"],
                             "post": t1 - st["s1"], "round": t1 - t0})
    finally:
        del graphs.run, sampler.greedy_tokens
    return {k: statistics.median(r[k] for r in rows) * 1e3 for k in rows[0]}


def timeline(prog, hs, rounds: int = 4) -> None:
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(rounds):
            b = prog.decode(hs)
            prog.abort_pending(b)
        torch.cuda.synchronize()
    evs = sorted(p.events(), key=lambda e: e.time_range.start)
    launches = [e for e in evs if e.device_type != CUDA and e.name == "cudaGraphLaunch"]
    gpu = [e for e in evs if e.device_type == CUDA]
    for i, L in enumerate(launches):
        nxt = launches[i + 1].time_range.start if i + 1 < len(launches) else float("inf")
        mine = [e for e in gpu if L.time_range.start <= e.time_range.start < nxt]
        if not mine:
            continue
        ker = [e for e in mine if "emcpy" not in e.name and "emset" not in e.name]
        first = ker[0]
        # the graph's kernels: until the first gap > 50 us (the eager argmax after the host wakes)
        last = first
        for e in ker[1:]:
            if e.time_range.start - last.time_range.end > 50:
                break
            last = e
        after = [e for e in mine if e.time_range.start >= last.time_range.end]
        gaps = sorted(((b.time_range.start - a.time_range.end, a.name[:40], b.name[:40])
                       for a, b in zip(ker, ker[1:]) if b.time_range.start <= last.time_range.end), reverse=True)[:3]
        print(f"  round {i}: launch call {L.time_range.end - L.time_range.start:7.1f} us; first kernel "
              f"+{first.time_range.start - L.time_range.start:7.1f} us after the call began ({first.name[:40]}); "
              f"graph span {(last.time_range.end - first.time_range.start) / 1e3:.3f} ms; then "
              + ", ".join(f"{e.name[:28]} +{e.time_range.start - last.time_range.end:.1f}us"
                          f" ({e.time_range.end - e.time_range.start:.1f}us)" for e in after[:3])
              + "; largest gaps in the graph: " + ", ".join(f"{g:.1f}us before {b}" for g, _, b in gaps), flush=True)
    pre = [e for e in evs if e.device_type != CUDA and e.name.startswith("cuda")]
    agg: dict[str, list[float]] = {}
    for e in pre:
        agg.setdefault(e.name, []).append(e.time_range.end - e.time_range.start)
    print("  runtime calls (per round): " + ", ".join(
        f"{k} {len(v) / rounds:.0f} x {statistics.median(v):.1f}us" for k, v in sorted(agg.items(), key=lambda kv: -sum(kv[1]))[:8]),
        flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--identity", default="qwen3_6-27b")
    ap.add_argument("--profile", action="store_true", help="also the torch.profiler timeline of 4 rounds")
    a = ap.parse_args()
    ident = a.identity
    w = DummyWeights(ident, device="cuda", dtype=torch.bfloat16, seed=1)
    pkg = importlib.import_module(w.package.module)
    cfg = ProgramConfig(device="cuda", dtype="bf16", page_size=64, num_pages=64, num_slots=8,
                        max_model_len=1088, max_batch=1, max_steps=1)
    prog = pkg.create_program(w, cfg)
    req = SequenceRequest(prompt_token_ids=tuple(range(10, 1010)), max_output_tokens=64,
                          sampling=SamplingParams(temperature=0.0))
    h = prog.start_materialize(prog.plan_materialize(req)).sequence
    prog.commit(prog.prefill(h, 1000).pending, [1])
    hs = [h]
    prog.abort_pending(prog.decode(hs))               # the round's inputs into the static buffers
    g = prog.graphs._graphs[1].graph
    small = torch.zeros(248320, device="cuda")
    print(f"[{ident} B=1] replay (events) {graph_replay_ms(g):.3f} ms; host time of the replay call: alone "
          f"{timed(g.replay):.3f} ms, after argmax + D2H {timed(g.replay, lambda: small.argmax().tolist()):.3f} ms; "
          f"replay + synchronize {timed(lambda: (g.replay(), torch.cuda.synchronize())):.3f} ms", flush=True)
    print(f"[{ident} B=1] Program.decode round (ms, medians): " +
          ", ".join(f"{k} {v:.3f}" for k, v in round_breakdown(prog, hs).items()), flush=True)
    if a.profile:
        timeline(prog, hs)


if __name__ == "__main__":
    main()
