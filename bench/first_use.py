"""What a prompt length the serve warmup did not cover costs the first time: an Engine (synthetic
weights, the server's defaults) runs its serve warmup (`Engine.warm_up`, default lengths or
--warmup-lengths), then for each --lengths L two requests of fresh random prompts of L tokens one after
another (2 output tokens, the context cache on as in `ninfer serve`), and prints the first and the second
TTFT: their difference is first-use work (Triton compiles of a new specialisation, graph captures,
autotuning, library plans) that a server's first request of that length would wait for.
Meaningful only with a compile cache that holds no earlier run's kernels (TRITON_CACHE_DIR fresh; the
autotuning results may be kept).

    PYTHONPATH=$PWD python3 bench/first_use.py --identity qwen3_6-35b-a3b --lengths 5 100 1023 4001 8000
"""
from __future__ import annotations

import argparse
import json
import random
import time

from ninfer.bench.serve import _prompt, engine_request


def _log_compiles() -> list[str]:
    """The Triton kernels this process compiles (or loads from the disk cache) from now on, by name and
    argument specialisation (Triton's post-compile hook)."""
    out: list[str] = []
    try:
        from triton import knobs
    except ImportError:
        return out
    knobs.runtime.jit_post_compile_hook = lambda **kw: out.append(kw["repr"].split("[", 1)[0] + "(" +
                                                                  kw["repr"].split("](", 1)[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--identity", default="qwen3_6-35b-a3b")
    ap.add_argument("--lengths", nargs="+", type=int, default=[5, 100, 1023, 4001, 8000])
    ap.add_argument("--warmup-lengths", nargs="*", type=int, default=None,
                    help="Engine.warm_up lengths (default: the Program's own)")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    from ninfer.engine import Engine
    from ninfer.types import EngineConfig

    t0 = time.perf_counter()
    engine = Engine.from_config(EngineConfig(load_format="dummy", identity=a.identity, device=a.device,
                                             max_model_len=a.max_model_len))
    rows, done = [], []
    try:
        avail = engine.wait_ready(900)
        if not avail.ready:
            raise SystemExit(f"engine not ready: {avail.reason}")
        ready = time.perf_counter() - t0
        done = engine.warm_up(a.warmup_lengths)
        print(f"[{a.identity}] ready in {ready:.1f} s; warmup {sum(t for _, t in done):.1f} s over "
              f"{[n for n, _ in done]}", flush=True)
        rng = random.Random(0)
        compiled = _log_compiles()
        for L in a.lengths:
            compiled.clear()
            first = engine_request(engine, _prompt(rng, L), 2)["ttft_ms"]
            second = engine_request(engine, _prompt(rng, L), 2)["ttft_ms"]
            rows.append(dict(prompt=L, first_ms=first, second_ms=second, first_use_ms=first - second,
                             compiled=list(compiled)))
            print(f"  prompt {L:5d}: first TTFT {first:9.1f} ms, second {second:7.1f} ms, "
                  f"first use {first - second:8.1f} ms; {len(compiled)} Triton kernels compiled or loaded", flush=True)
            for c in compiled[:6]:
                print(f"      {c[:160]}", flush=True)
    finally:
        engine.close()
    print("JSON " + json.dumps(dict(bench="first_use", identity=a.identity, warmup_lengths=a.warmup_lengths,
                                    warmup=[list(d) for d in done], rows=rows)))


if __name__ == "__main__":
    main()
