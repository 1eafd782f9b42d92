"""Where a decode round's time over its graph replay goes (B=1, ctx 1000, synthetic weights), for the
graphs with the static-input copy inside (the default) and with the pass-5 host-side copy, one process:

  1. host time of the graph launch call (median of 30, GPU idle before): alone, after an eager kernel +
     D2H sync (what a round does between launches); the pieces of `DecodeGraphs.run` (fill, copy,
     replay); a `Program.decode` round split at the graph launch and the sampler (host stamps);
  2. both layouts' rounds interleaved (4 x 20 rounds);
  3. with --profile, a torch.profiler trace (CPU runtime calls + CUDA activity on one clock) of a few rounds: per round,
     when the first graph kernel starts after cudaGraphLaunch began, the launch call's length, the GPU
     span of the graph, and the gaps after it (argmax, D2H).

    PYTHONPATH=$PWD python3 bench/round_timeline.py --identity qwen3_6-27b      (one identity per process)
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ninfer.bench.common import graph_replay_ms
from ninfer.runtime.contract.types import SamplingParams, SequenceRequest
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.runtime.config import ProgramConfig
from ninfer.targets.qwen3_6.runtime.cuda_graphs import DecodeGraphs, fill_static_inputs

CUDA = torch.autograd.DeviceType.CUDA


def timed(fn, before=None, n: int = 30) -> float:
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


def idle_replay_ms(g, n: int = 20) -> float:
    """Host wall of replay + synchronize from an idle GPU (what a round pays for the graph)."""
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def run_pieces(dg, g, args, n: int = 30) -> dict:
    """Host time of each statement of DecodeGraphs.run, as a round runs it (GPU idle at the start)."""
    rows = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g.done.synchronize()
        t1 = time.perf_counter()
        fill_static_inputs(g.host_np, dg.width, *args)
        t2 = time.perf_counter()
        if not dg.copy_in_graph:
            g.dev.copy_(g.host, non_blocking=True)
        t3 = time.perf_counter()
        g.graph.replay()
        g.done.record()
        t4 = time.perf_counter()
        torch.cuda.synchronize()
        t5 = time.perf_counter()
        rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0))
    names = ("event sync", "fill", "H2D copy", "replay call + record", "wait", "total")
    return {k: statistics.median(r[i] for r in rows) * 1e3 for i, k in enumerate(names)}


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


def report(tag: str, prog, hs, dg, args) -> None:
    g = dg._graphs[1]
    small = torch.zeros(248320, device="cuda")
    print(f"[{tag}] replay (events) {graph_replay_ms(g.graph):.3f} ms; host time "
          f"of the replay call: alone {timed(g.graph.replay):.3f} ms, after argmax + D2H "
          f"{timed(g.graph.replay, lambda: small.argmax().tolist()):.3f} ms; replay + sync from idle "
          f"{idle_replay_ms(g.graph):.3f} ms", flush=True)
    print(f"[{tag}] DecodeGraphs.run pieces (ms): " +
          ", ".join(f"{k} {v:.3f}" for k, v in run_pieces(dg, g, args).items()), flush=True)
    print(f"[{tag}] Program.decode round (ms, medians): " +
          ", ".join(f"{k} {v:.3f}" for k, v in round_breakdown(prog, hs).items()), flush=True)


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
    # the pass-5 layout (host-side H2D copy before each replay), captured before any sequence exists
    host_copy = DecodeGraphs(prog.model, prog._state, 1, cfg.max_model_len, cfg.page_size, torch.device("cuda"),
                             copy_in_graph=False)
    host_copy.capture()
    req = SequenceRequest(prompt_token_ids=tuple(range(10, 1010)), max_output_tokens=64,
                          sampling=SamplingParams(temperature=0.0))
    h = prog.start_materialize(prog.plan_materialize(req)).sequence
    prog.commit(prog.prefill(h, 1000).pending, [1])
    hs = [h]
    prog.abort_pending(prog.decode(hs))
    dg = prog.graphs
    s = prog._seq(h)
    args = ([s.tokens[-1]], [s.frontier], [s.slot], [prog._state.scratch_entry(0)], [s.holding.table.pages])
    report(f"{ident} B=1 copy in graph", prog, hs, dg, args)
    sets = {"copy in graph": dg, "host-side copy": host_copy}
    res: dict[str, list[dict]] = {m: [] for m in sets}
    for _ in range(4):
        for m, graphs in sets.items():
            prog.graphs = graphs
            prog.abort_pending(prog.decode(hs))
            res[m].append(round_breakdown(prog, hs))
    prog.graphs = dg
    for m, rows in res.items():
        print(f"[{ident} B=1] {m:14s} round (medians of 4 x 20, interleaved): " + ", ".join(
            f"{k} {statistics.median(r[k] for r in rows):.3f}" for k in rows[0]), flush=True)
    report(f"{ident} B=1 host-side copy", prog, hs, host_copy, args)
    if a.profile:
        timeline(prog, hs)


if __name__ == "__main__":
    main()
