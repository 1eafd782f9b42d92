"""What the serve warmup's attention-plan step costs and what it saves (prompts longer than one stage).

ops   (no model) For each --max-prompt M, the stage shapes `prefix_plan_shapes` lists for --heads / --kv-heads
      / --head-dim at --stage, run in a fresh thread (PyTorch keeps cuDNN plans per thread, so a new thread
      starts with none): each shape's first call (plan + run) and second call (run), CUDA-synchronised wall.
      Prints the count, the total first-call time (what the warmup step spends with no budget) and the
      plan cost per shape (first - second: median, max).
engine (--identity) An Engine with synthetic weights and --max-model-len: its serve warmup without the plan
      step, then two fresh prompts of --before tokens (TTFT first, second), then the plan step alone
      (`EngineCore.plan_attention`: the Program's `warmup_attention_plans` on the worker, timed), then two fresh prompts
      of --after tokens. first - second is first-use work: expected ~the shapes' plans before the step, ~0
      after it (--after is chosen to need shapes --before did not make).

    PYTHONPATH=$PWD python3 bench/prefix_plan_warm.py ops --max-prompt 32768 131072
    PYTHONPATH=$PWD python3 bench/prefix_plan_warm.py engine --identity qwen3_6-27b --max-model-len 32768 \
        --before 20000 --after 24000
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time

import torch


def _in_fresh_thread(fn):
    out: list = []
    err: list = []

    def run():
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            err.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def ops(a) -> list[dict]:
    from ninfer.ops.reference import prefix_routing as pr
    from ninfer.ops.triton import attention as fa
    dev = torch.device("cuda")
    rows = []
    for M in a.max_prompt:
        shapes = pr.prefix_plan_shapes(a.heads, a.head_dim, a.stage, M)

        def measure():
            g = torch.Generator(device=dev).manual_seed(0)
            Lm, Cm = max(L for L, _ in shapes), max(C for _, C in shapes)
            q = torch.randn(Lm, a.heads, a.head_dim, device=dev, dtype=torch.bfloat16, generator=g)
            k = torch.randn(Cm, a.kv_heads, a.head_dim, device=dev, dtype=torch.bfloat16, generator=g)
            v = torch.randn_like(k)
            res = []
            for L, C in shapes:
                t = []
                for _ in range(2):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    fa.attend_over_prefix(q[:L], k[:C], v[:C], a.head_dim ** -0.5)
                    torch.cuda.synchronize()
                    t.append(time.perf_counter() - t0)
                res.append((L, C, pr.prefix_form(a.heads, a.head_dim, L, C), t[0], t[1]))
            return res

        res = _in_fresh_thread(measure)
        plan = [(f - s) * 1e3 for *_, f, s in res]
        first = sum(f for *_, f, _ in res)
        row = dict(max_prompt=M, shapes=len(res), first_total_s=round(first, 2),
                   plan_ms_median=round(statistics.median(plan), 1), plan_ms_max=round(max(plan), 1),
                   run_total_s=round(sum(s for *_, s in res), 2))
        print(f"max prompt {M:6d}: {len(res):3d} shapes, first calls {first:6.2f} s (runs {row['run_total_s']:.2f} s), "
              f"plan per shape median {row['plan_ms_median']:.1f} ms, max {row['plan_ms_max']:.1f} ms", flush=True)
        if a.verbose:
            for L, C, form, f, s in res:
                print(f"    L {L:5d} C {C:6d} {form:5s} first {f * 1e3:7.1f} ms second {s * 1e3:6.1f} ms")
        rows.append(row)
    return rows


def engine(a) -> dict:
    from ninfer.bench.serve import _prompt, engine_request
    from ninfer.engine.facade import Engine
    from ninfer.config import EngineConfig
    eng = Engine.from_config(EngineConfig(load_format="dummy", identity=a.identity, max_model_len=a.max_model_len,
                                          max_concurrency=1, kv_memory_fraction=0.8))
    try:
        if not eng.wait_ready(900).ready:
            raise SystemExit(f"engine not ready: {eng.availability.reason}")
        t0 = time.perf_counter()
        eng.warm_up(plans=False)
        out = dict(identity=a.identity, max_model_len=a.max_model_len, warmup_s=round(time.perf_counter() - t0, 1))
        rng = random.Random(0)

        def pair(n):
            return [round(engine_request(eng, _prompt(rng, n), 2)["ttft_ms"], 1) for _ in range(2)]

        out["before"] = [a.before] + pair(a.before)
        t0 = time.perf_counter()
        ran, total = eng._core.plan_attention().result()
        out["plan_step"] = dict(ran=ran, total=total, s=round(time.perf_counter() - t0, 2))
        out["after"] = [a.after] + pair(a.after)
        print(f"[{a.identity}] warmup (no plans) {out['warmup_s']} s; prompt {a.before}: TTFT first {out['before'][1]} ms, "
              f"second {out['before'][2]} ms; plan step {ran}/{total} shapes in {out['plan_step']['s']} s; "
              f"prompt {a.after}: first {out['after'][1]} ms, second {out['after'][2]} ms", flush=True)
        return out
    finally:
        eng.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("ops", "engine"))
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=256)
    ap.add_argument("--stage", type=int, default=8192)
    ap.add_argument("--max-prompt", type=int, nargs="+", default=[32767])
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--identity", default="qwen3_6-27b")
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--before", type=int, default=20000)
    ap.add_argument("--after", type=int, default=24000)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA: nothing measured")
        return
    res = ops(a) if a.what == "ops" else engine(a)
    print("JSON " + json.dumps(dict(bench="prefix_plan_warm", what=a.what, result=res)))


if __name__ == "__main__":
    main()
