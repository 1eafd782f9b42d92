"""Where the time of one step goes: per-kernel durations (torch.profiler; CUPTI on CUDA) of

  * decode rounds through the Program contract (`decode` + `abort_pending`, B rows at a fixed context):
    on CUDA the round replays the decode graph of B rows, and the table separates the kernels' own time
    from the gaps between them (the launch cost inside the graph);
  * one prefill of an L-token prompt (`plan_materialize`, `start_materialize`, `prefill` stages), grouped
    by kernel.

Real sizes with synthetic weights (`DummyWeights`: speed does not depend on the values). On the CPU the
same tables list the aten ops of the reference op set (a smoke run with a tiny identity).

NOTE: with programmatic dependent launch on, a kernel's recorded duration includes its wait for the
      previous one; take per-kernel breakdowns with NINFER_PDL=0 (docs/performance.md, "How to measure").

    PYTHONPATH=$PWD python3 bench/profile_step.py --decode qwen3_6-27b qwen3_6-35b-a3b --batches 1 8 \
        --prefill qwen3_6-27b:8192
    PYTHONPATH=$PWD python3 bench/profile_step.py --device cpu --decode qwen3_6-tiny-dense --prefill qwen3_6-tiny-moe:40
"""
from __future__ import annotations

import argparse
import collections
import gc
import importlib
import json
import re
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from ninfer.contract.program import Refusal, SamplingParams, SequenceRequest
from ninfer.targets.dummy_weights import DummyWeights
from ninfer.targets.qwen3_6.program.config import ProgramConfig

PAGE = 64


def short(name: str) -> str:
    return re.sub(r"<.*", "", name)[:70]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def events(p, device: str) -> list:
    """The profiled kernels on CUDA, the top-level aten ops on the CPU, in start order."""
    if device.startswith("cuda"):
        evs = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    else:
        evs = [e for e in p.events() if e.name.startswith("aten::") and e.cpu_parent is None]
    return sorted(evs, key=lambda e: e.time_range.start)


def table(evs: list, per: int, top: int) -> dict:
    """Print the kernels by total time per step (per = the steps the events cover); return the summary."""
    agg = collections.defaultdict(lambda: [0, 0.0])
    for e in evs:
        a = agg[short(e.name)]
        a[0] += 1
        a[1] += e.time_range.end - e.time_range.start
    rows = sorted(agg.items(), key=lambda kv: -kv[1][1])
    busy_ms = sum(v[1] for v in agg.values()) / per / 1e3
    print(f"  {'kernel':70s} {'n':>6s} {'ms':>9s} {'us/call':>8s} {'%':>5s}")
    for name, (n, us) in rows[:top]:
        pct = 100 * us / per / 1e3 / busy_ms if busy_ms else 0.0
        print(f"  {name:70s} {n / per:6.0f} {us / per / 1e3:9.3f} {us / n:8.2f} {pct:5.1f}")
    rest = rows[top:]
    if rest:
        print(f"  {'(' + str(len(rest)) + ' more names)':70s} {sum(v[0] for _, v in rest) / per:6.0f} "
              f"{sum(v[1] for _, v in rest) / per / 1e3:9.3f}")
    span_ms = (evs[-1].time_range.end - evs[0].time_range.start) / per / 1e3 if evs else 0.0
    print(f"  per step: {len(evs) / per:.0f} kernels, busy {busy_ms:.3f} ms, span {span_ms:.3f} ms")
    return {"kernels": len(evs) / per, "busy_ms": busy_ms, "span_ms": span_ms,
            "top": [[name, n / per, us / per / 1e3] for name, (n, us) in rows[:top]]}


def make_program(identity: str, device: str, max_len: int, batch: int, eager: bool):
    cuda = device.startswith("cuda")
    w = DummyWeights(identity, device=device, dtype=torch.bfloat16 if cuda else torch.float32, seed=0)
    cfg = ProgramConfig(device=device, dtype="bf16" if cuda else "fp32", page_size=PAGE,
                        num_pages=batch * (max_len // PAGE + 2) + 8, num_slots=2 * batch, max_model_len=max_len,
                        max_batch=batch, max_steps=1, enforce_eager=eager or not cuda, decode_step_ahead=False)
    return importlib.import_module(w.package.module).create_program(w, cfg), w.dims


def start(prog, prompt: tuple[int, ...], max_out: int):
    req = SequenceRequest(prompt_token_ids=prompt, max_output_tokens=max_out, sampling=SamplingParams(temperature=0.0))
    plan = prog.plan_materialize(req)
    if isinstance(plan, Refusal):
        raise SystemExit(f"profile_step: a prompt of {len(prompt)} tokens was refused: {plan.reason}")
    return prog.start_materialize(plan).sequence


def prefill_all(prog, h, length: int):
    """Run a sequence's prompt to its first token; the PendingBatch of its last stage."""
    while True:
        step = prog.prefill(h, length)
        if step.pending is not None:
            return step.pending


def decode(identity: str, batches: list[int], ctx: int, rounds: int, top: int, device: str) -> list[dict]:
    B_max = max(batches)
    prog, dims = make_program(identity, device, ctx + 64, B_max, eager=False)
    rng = torch.Generator().manual_seed(0)
    handles = []
    for _ in range(B_max):
        h = start(prog, tuple(torch.randint(0, dims.vocab_size, (ctx,), generator=rng).tolist()), 32)
        prog.commit(prefill_all(prog, h, ctx), [1])
        handles.append(h)
    out = []
    for B in batches:
        hs = handles[:B]
        walls = []

        def round_() -> None:
            sync(device)
            t0 = time.perf_counter()
            batch = prog.decode(hs)
            sync(device)
            walls.append((time.perf_counter() - t0) * 1e3)
            prog.abort_pending(batch)     # the context stays fixed from round to round

        for _ in range(3):
            round_()
        walls.clear()
        acts = [ProfilerActivity.CUDA] if device.startswith("cuda") else [ProfilerActivity.CPU]
        with profile(activities=acts) as p:
            for _ in range(rounds):
                round_()
        print(f"\n[{identity} decode B={B} ctx {ctx}] round wall (under the profiler) median "
              f"{statistics.median(walls):.3f} ms", flush=True)
        row = table(events(p, device), rounds, top)
        out.append({"identity": identity, "kind": "decode", "batch": B, "ctx": ctx,
                    "round_ms": statistics.median(walls), **row})
    for h in handles:
        prog.release(h)
    prog.check_integrity()
    return out


def prefill(spec: str, top: int, device: str) -> dict:
    identity, L = spec.split(":")
    L = int(L)
    prog, dims = make_program(identity, device, L + 16, 1, eager=True)
    rng = torch.Generator().manual_seed(0)

    def once() -> float:
        h = start(prog, tuple(torch.randint(0, dims.vocab_size, (L,), generator=rng).tolist()), 2)
        sync(device)
        t0 = time.perf_counter()
        pending = prefill_all(prog, h, L)
        sync(device)
        ms = (time.perf_counter() - t0) * 1e3
        prog.abort_pending(pending)
        prog.release(h)
        return ms

    t0 = time.perf_counter()
    for _ in range(2):
        once()                                  # first-call compiles and autotuning
    print(f"\n[{identity} prefill {L}] warm-up {time.perf_counter() - t0:.1f} s", flush=True)
    ms = once()
    acts = [ProfilerActivity.CUDA] if device.startswith("cuda") else [ProfilerActivity.CPU]
    with profile(activities=acts) as p:
        ms_p = once()
    print(f"[{identity} prefill {L}] {ms:.1f} ms (under the profiler {ms_p:.1f})", flush=True)
    row = table(events(p, device), 1, top)
    prog.check_integrity()
    return {"identity": identity, "kind": "prefill", "tokens": L, "ms": ms, **row}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decode", nargs="*", default=[], metavar="IDENTITY")
    ap.add_argument("--batches", nargs="+", type=int, default=[1])
    ap.add_argument("--ctx", type=int, default=1024, help="decode: prompt tokens per row before the rounds")
    ap.add_argument("--rounds", type=int, default=5, help="decode: profiled rounds per batch size")
    ap.add_argument("--prefill", nargs="*", default=[], metavar="IDENTITY:LENGTH")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    gpu = torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu"
    print(gpu, torch.__version__, flush=True)
    rows = []
    for ident in a.decode:
        rows += decode(ident, a.batches, a.ctx, a.rounds, a.top, a.device)
        gc.collect()
    for spec in a.prefill:
        rows.append(prefill(spec, a.top, a.device))
        gc.collect()
    if a.device.startswith("cuda"):
        torch.cuda.empty_cache()
    print("JSON " + json.dumps({"bench": "profile_step", "device": gpu, "torch": torch.__version__, "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
