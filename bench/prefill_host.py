"""Host side of one staged prefill through the Program (synthetic weights): the wall time of a stage
(synchronised) against its GPU kernel time, then where the host time goes: Python functions (cProfile,
by own time) and torch ops (torch.profiler, self CPU time). A stage whose wall is well above its kernel
time is host bound (bench/NOTES.md pass 7: a 27B 512-token stage took ~100 ms).

    PYTHONPATH=$PWD python3 bench/prefill_host.py --identity qwen3_6-27b --tokens 512
"""
from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import pstats
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ninfer.bench.common import sync
from ninfer.contract.program import SamplingParams, SequenceRequest
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.program.config import ProgramConfig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--identity", default="qwen3_6-27b")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    cuda = a.device.startswith("cuda")
    w = DummyWeights(a.identity, device=a.device, dtype=torch.bfloat16 if cuda else torch.float32, seed=1)
    pkg = importlib.import_module(w.package.module)
    page = 64
    prog = pkg.create_program(w, ProgramConfig(device=a.device, dtype="bf16" if cuda else "fp32", page_size=page,
                                               num_pages=2 * (a.tokens // page + 2), num_slots=2,
                                               max_model_len=a.tokens + 2 * page, max_batch=1, max_steps=1))

    def stage():
        req = SequenceRequest(prompt_token_ids=tuple(range(7, 8 + a.tokens)), max_output_tokens=4,
                              sampling=SamplingParams(temperature=0.0))
        h = prog.start_materialize(prog.plan_materialize(req)).sequence
        sync(a.device)
        t0 = time.perf_counter()
        step = prog.prefill(h, a.tokens)                 # not the final stage: no first token, no pending batch
        host = time.perf_counter() - t0
        sync(a.device)
        wall = time.perf_counter() - t0
        assert step.pending is None
        prog.release(h)
        return host * 1e3, wall * 1e3

    stage()                                              # compiles / autotunes
    runs = [stage() for _ in range(a.reps)]
    print(f"[{a.identity}] prefill stage of {a.tokens} tokens: host call {statistics.median(r[0] for r in runs):.1f} ms,"
          f" wall (synced) {statistics.median(r[1] for r in runs):.1f} ms (median of {a.reps})", flush=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        stage()
    ev = prof.key_averages()
    if cuda:
        kern = sum(e.self_device_time_total for e in ev if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3
        print(f"  GPU kernel time in one stage (profiled): {kern:.1f} ms", flush=True)
    print(ev.table(sort_by="self_cpu_time_total", row_limit=a.top), flush=True)
    pr = cProfile.Profile()
    pr.enable()
    stage()
    pr.disable()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(a.top)
    print(out.getvalue(), flush=True)


if __name__ == "__main__":
    main()
