"""In-process A/B of prefill variants on the real prefill path (`Program.prefill`, as `ninfer bench prefill`
times it): one Program (synthetic weights) per identity; the variants' prompts run interleaved (variant
order repeated --reps times, the first round untimed), so the card's clock and power drift falls on every
variant alike. A variant is what bench/step_ab.py takes (`set:MOD.ATTR=V`, GEMV overlays, `op:NAME=FILE`,
'+'-joined; `base` = nothing changed). Each variant's first sampled token (greedy) is printed beside its
time, and with --profile the kernel time of one more prompt per variant (torch.profiler: the sum of the
kernels' durations, beside the wall time: more than the wall where kernels overlap).

    PYTHONPATH=$PWD python3 bench/prefill_ab.py --identity qwen3_6-27b --tokens 8192 \\
        --variants base set:ninfer.targets.qwen3_6.runtime.model.SIDE_PREFILL_ROWS=0
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

from ninfer.bench.common import json_line  # noqa: E402
from ninfer.runtime.contract.types import Refusal, SamplingParams, SequenceRequest  # noqa: E402
from ninfer.targets.dummy_weights import DummyWeights  # noqa: E402
from ninfer.targets.qwen3_6.runtime.config import ProgramConfig  # noqa: E402

PAGE = 64


def first_token(prog, prompt: tuple[int, ...]) -> tuple[float, int]:
    """(ms from materialize to the first sampled token, that token); the sequence is released."""
    req = SequenceRequest(prompt_token_ids=prompt, max_output_tokens=2, sampling=SamplingParams(temperature=0.0))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    plan = prog.plan_materialize(req)
    if isinstance(plan, Refusal):
        raise SystemExit(f"prefill_ab: prompt of {len(prompt)} tokens refused: {plan.reason}")
    h = prog.start_materialize(plan).sequence
    step = None
    try:
        step = prog.prefill(h, len(prompt))
        tok = step.pending.rows[0].tokens[0]
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
    finally:
        if step is not None and step.pending is not None and not step.pending.consumed:
            prog.abort_pending(step.pending)
        prog.release(h)
    return ms, tok


def kernel_ms(prog, prompt) -> tuple[float, list[tuple[str, float]]]:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        first_token(prog, prompt)
    per = collections.Counter()
    for e in p.events():
        if e.device_type.name == "CUDA" and e.device_time > 0:
            per[e.name[:60]] += e.device_time / 1e3
    return sum(per.values()), per.most_common(12)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--identity", nargs="+", default=["qwen3_6-27b"])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variants", nargs="+", default=["base"])
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
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
                    ms, tok = first_token(prog, prompt)
                toks[v] = tok
                if rep:
                    times[v].append(ms)
                else:
                    print(f"[{ident}] {v}: untimed first prompt {ms:.1f} ms", flush=True)
        for v in a.variants:
            med = statistics.median(times[v])
            line = f"[{ident}] {a.tokens} tokens  {v:60s} median {med:8.2f} ms  (" + \
                   " ".join(f"{t:.1f}" for t in times[v]) + f")  token {toks[v]}"
            if a.profile:
                with applied("" if v == "base" else v, prog):
                    total, top = kernel_ms(prog, prompt)
                line += f"  kernels {total:.1f} ms"
                print(line, flush=True)
                for name, t in top:
                    print(f"      {t:8.2f}  {name}")
            else:
                print(line, flush=True)
            json_line("prefill_ab", {"identity": ident, "tokens": a.tokens, "variant": v, "median_ms": med, "all_ms": times[v],
                       "token": toks[v]})
        del prog, w
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
