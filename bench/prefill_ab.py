"""In-process A/B of prefill variants on the real prefill path (`Program.prefill`, as `ninfer bench prefill`
times it): one Program (synthetic weights) per identity; the variants' prompts run interleaved (variant
order repeated --reps times, the first round untimed), so the card's clock and power drift falls on every
variant alike. A variant is what bench/step_ab.py takes (`set:MOD.ATTR=V`, GEMV overlays, `op:NAME=FILE`,
'+'-joined; `base` = nothing changed). Each variant's first sampled token (greedy) is printed beside its
time, and with --profile the kernel time of one more prompt per variant (torch.profiler: the sum of the
kernels' durations, beside the wall time: more than the wall where kernels overlap). --phases prints each
prompt's host / CUDA-event / wall times and allocator calls; --pause S idles S seconds after each timed
prompt (an isolated request's TTFT: back to back the card sits at its power limit, bench/NOTES.md session 27).

    PYTHONPATH=$PWD python3 bench/prefill_ab.py --identity qwen3_6-27b --tokens 8192 \\
        --variants base set:ninfer.targets.qwen3_6.program.model.SIDE_PREFILL_ROWS=0
"""
from __future__ import annotations

import argparse
import collections
import importlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from torch.profiler import record_function  # noqa: E402

from ninfer.bench.common import json_line  # noqa: E402
from ninfer.contract.program import Refusal, SamplingParams, SequenceRequest  # noqa: E402
from ninfer.targets.dummy_weights import DummyWeights  # noqa: E402
from ninfer.targets.qwen3_6.program.config import ProgramConfig  # noqa: E402

PAGE = 64


def first_token(prog, prompt: tuple[int, ...], phases: bool = False, chunk: int = 0) -> tuple[float, int]:
    """(ms from materialize to the first sampled token, that token); the sequence is released. `phases`:
    print when the host got `prefill` back, the CUDA-event time, the wall, and the allocator's device calls.
    chunk > 0: the prompt in stages of that many tokens (as the Engine stages a long prompt)."""
    req = SequenceRequest(prompt_token_ids=prompt, max_output_tokens=2, sampling=SamplingParams(temperature=0.0))
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    m0 = torch.cuda.memory_stats() if phases else {}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    e0.record()
    with record_function("ab.plan_materialize"):
        plan = prog.plan_materialize(req)
    if isinstance(plan, Refusal):
        raise SystemExit(f"prefill_ab: prompt of {len(prompt)} tokens refused: {plan.reason}")
    with record_function("ab.start_materialize"):
        h = prog.start_materialize(plan).sequence
    step = None
    try:
        with record_function("ab.prefill"):
            step = prog.prefill(h, chunk or len(prompt))
            while step.pending is None:
                step = prog.prefill(h, chunk)
        t1 = time.perf_counter()
        e1.record()
        tok = step.pending.rows[0].tokens[0]
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        if phases:
            m1 = torch.cuda.memory_stats()
            # NOTE: the caching allocator's device calls in this prompt (cudaMalloc / cudaFree, and the
            #       retries that free its cache and synchronise), to tell allocator warm-up from the card's.
            moved = " ".join(f"{k} +{m1.get(k, 0) - m0.get(k, 0)}" for k in
                             ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams"))
            print(f"      prefill returned at {(t1 - t0) * 1e3:.1f} ms, GPU events {e0.elapsed_time(e1):.1f} ms, "
                  f"wall {ms:.1f} ms at t={time.time():.2f}; {moved}; reserved {m1.get('reserved_bytes.all.current', 0) / 2**30:.2f} GiB",
                  flush=True)
    finally:
        if step is not None and step.pending is not None and not step.pending.consumed:
            prog.abort_pending(step.pending)
        prog.release(h)
    return ms, tok


def kernel_ms(prog, prompt, chunk: int = 0) -> tuple[float, list[tuple[str, float]], list[str]]:
    """(the kernels' summed time, the 12 largest kernels by time, notes: the span from the first kernel's
    start to the last one's end, the idle time in it and its 6 largest gaps, the host runtime calls of
    over 0.5 ms (synchronisations), each `ab.` phase's time, and the host ops before the first kernel and
    past the last one)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        first_token(prog, prompt, chunk=chunk)
    per = collections.Counter()
    spans, slow_calls = [], []
    for e in p.events():
        if e.device_type.name == "CUDA" and e.device_time > 0:
            per[e.name[:60]] += e.device_time / 1e3
            spans.append((e.time_range.start, e.time_range.end, e.name[:40]))
        elif e.device_type.name == "CPU" and e.name.startswith("cuda") and e.time_range.elapsed_us() > 500:
            slow_calls.append(f"{e.name} {e.time_range.elapsed_us() / 1e3:.2f} ms")
    spans.sort()
    gaps, end, idle = [], spans[0][1] if spans else 0, 0.0
    for (s0, e0, n0), (s1, e1, n1) in zip(spans, spans[1:]):
        if s1 > end:
            idle += s1 - end
            gaps.append(((s1 - end) / 1e3, n0, n1))
        end = max(end, e1)
    notes = [f"kernel span {(end - spans[0][0]) / 1e3:.1f} ms, idle in it {idle / 1e3:.2f} ms" if spans else "no kernels"]
    notes += [f"gap {g:.2f} ms after {a} before {b}" for g, a, b in sorted(gaps, reverse=True)[:6]]
    notes += slow_calls[:10]
    # NOTE: the host's part of the wall time: top-level host ops (no parent) before the first kernel and
    #       after the last one, in the profiler's clock.
    tops = sorted((e for e in p.events() if e.device_type.name == "CPU" and (
        e.cpu_parent is None or e.cpu_parent.name.startswith("ab.")) and not e.name.startswith("ab.")),
        key=lambda e: e.time_range.start)
    for e in p.events():
        if e.device_type.name == "CPU" and e.name.startswith("ab.") and spans:
            notes.append(f"{e.name}: {e.time_range.elapsed_us() / 1e3:.2f} ms, starts "
                         f"{(e.time_range.start - spans[0][0]) / 1e3:.2f} ms after the first kernel")
    if tops and spans:
        k0, k1 = spans[0][0], end
        notes.append(f"host: first op {(k0 - tops[0].time_range.start) / 1e3:.2f} ms before the first kernel, "
                     f"last op ends {(max(e.time_range.end for e in tops) - k1) / 1e3:.2f} ms after the last kernel")
        for where, outside in (("before the first kernel", lambda e: e.time_range.start < k0),
                               ("past the last kernel", lambda e: e.time_range.end > k1)):
            per_op = collections.Counter()
            for e in filter(outside, tops):
                per_op[e.name[:50]] += e.time_range.elapsed_us() / 1e3
            notes += [f"{where}: {n} {t:.2f} ms" for n, t in per_op.most_common(8)]
    return sum(per.values()), per.most_common(12), notes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--identity", nargs="+", default=["qwen3_6-27b"])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variants", nargs="+", default=["base"])
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--phases", action="store_true",
                    help="per prompt: host return time, CUDA-event time, wall, the allocator's device calls")
    ap.add_argument("--chunk", type=int, default=0,
                    help="prefill stage size (0: the whole prompt in one stage)")
    ap.add_argument("--pause", type=float, default=0.0,
                    help="seconds the card idles after each timed prompt (0: back to back)")
    a = ap.parse_args()
    if a.chunk < 0:
        ap.error(f"--chunk must be >= 0, got {a.chunk}")
    if not torch.cuda.is_available():
        print("prefill_ab: no CUDA device; nothing measured")
        return 0
    from bench.step_ab import applied        # imports Triton
    for ident in a.identity:
        w = DummyWeights(ident, device="cuda", dtype=torch.bfloat16, seed=0)
        pkg = importlib.import_module(w.package.module)
        cfg = ProgramConfig(device="cuda", dtype="bf16", page_size=PAGE, num_pages=a.tokens // PAGE + 8, num_slots=2,
                            max_model_len=a.tokens + 16, max_batch=1, max_steps=1)
        prog = pkg.create_program(w, cfg)
        rng = torch.Generator().manual_seed(0)
        prompt = tuple(torch.randint(0, w.dims.vocab_size, (a.tokens,), generator=rng).tolist())
        times = {v: [] for v in a.variants}
        toks = {}
        for rep in range(a.reps + 1):
            for v in a.variants:
                with applied("" if v == "base" else v, prog):
                    ms, tok = first_token(prog, prompt, a.phases, a.chunk)
                toks[v] = tok
                if rep:
                    times[v].append(ms)
                    time.sleep(a.pause)                              # the card idles between prompts
                else:
                    print(f"[{ident}] {v}: untimed first prompt {ms:.1f} ms", flush=True)
        for v in a.variants:
            med = statistics.median(times[v])
            line = f"[{ident}] {a.tokens} tokens  {v:60s} median {med:8.2f} ms  (" + \
                   " ".join(f"{t:.1f}" for t in times[v]) + f")  token {toks[v]}"
            if a.profile:
                with applied("" if v == "base" else v, prog):
                    total, top, notes = kernel_ms(prog, prompt, a.chunk)
                line += f"  kernels {total:.1f} ms"
                print(line, flush=True)
                for name, t in top:
                    print(f"      {t:8.2f}  {name}")
                for n in notes:
                    print(f"      {n}")
            else:
                print(line, flush=True)
            json_line("prefill_ab", {"identity": ident, "tokens": a.tokens, "variant": v, "median_ms": med, "all_ms": times[v],
                       "token": toks[v]})
        del prog, w
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
