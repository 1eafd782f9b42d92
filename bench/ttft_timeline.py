"""Where a single request's TTFT goes inside the Engine (in process, synthetic weights): for each
staged-prefill chunk size, a warm-up request and then --reps requests of --prompt-len random ids one
at a time, each printed as a timeline relative to submit: every scheduler unit (from the Engine's
trace hook), every Program.prefill stage (host wall, with the GPU synchronised at its end so the stage's
own GPU work is inside it), the context-cache captures, the decode-graph replays, and the first token.
A measurement probe: besides the public trace hook it wraps methods of the Engine's internal Program and
resource manager (private attributes), and its synchronisation serialises stages it would overlap.

    PYTHONPATH=$PWD python3 bench/ttft_timeline.py --identity qwen3_6-27b --prompt-len 1024 --chunks 512 8192
"""
from __future__ import annotations

import argparse
import gc
import random
import statistics
import threading
import time

import torch

from ninfer.bench.common import sync
from ninfer.bench.serve import _prompt, engine_request


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--identity", default="qwen3_6-27b")
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--chunks", nargs="+", type=int, default=[512, 8192])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-prefix-cache", action="store_true")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    from ninfer.engine.facade import Engine
    from ninfer.config import EngineConfig

    cuda = a.device.startswith("cuda")
    rng = random.Random(0)
    for chunk in a.chunks:
        log: list[tuple[float, str]] = []
        lock = threading.Lock()

        def note(what: str) -> None:
            with lock:
                log.append((time.perf_counter(), what))

        def trace(what: str, info: dict) -> None:
            if what == "unit":
                note(f"unit {info['kind'].value} rows {len(info['rows'])}")
            elif what in ("active", "enqueue"):
                note(what)

        cfg = EngineConfig(load_format="dummy", identity=a.identity, device=a.device, max_concurrency=4,
                           max_model_len=a.prompt_len + 64, prefill_chunk_tokens=chunk,
                           prefix_cache=not a.no_prefix_cache)
        engine = Engine.from_config(cfg, trace=trace)
        core = prog = rm = wrap = None
        try:
            avail = engine.wait_ready(600)
            if not avail.ready:
                raise SystemExit(f"engine not ready: {avail.reason}")
            core = engine._core
            prog, rm = core.program, core.rm

            def wrap(obj, name: str, label, do_sync: bool = False):
                fn = getattr(obj, name)

                def wrapped(*args, **kw):
                    t0 = time.perf_counter()
                    out = fn(*args, **kw)
                    if do_sync:
                        sync(a.device)
                    note(f"{label(args)} {(time.perf_counter() - t0) * 1e3:.1f} ms")
                    return out
                setattr(obj, name, wrapped)

            wrap(prog, "prefill", lambda args: f"prefill stage of {args[1]} tokens (synced):", do_sync=True)
            wrap(prog, "_graph_step", lambda args: f"decode-graph step B={len(args[0])}:")
            wrap(rm, "capture", lambda args: "context-cache capture:", do_sync=True)
            ttfts = []
            for rep in range(a.reps + 1):
                log.clear()
                t0 = time.perf_counter()
                r = engine_request(engine, _prompt(rng, a.prompt_len), 4)
                if rep == 0:
                    print(f"[{a.identity} chunk {chunk}] warm-up TTFT {r['ttft_ms']:.1f} ms", flush=True)
                    continue
                ttfts.append(r["ttft_ms"])
                print(f"[{a.identity} chunk {chunk}] request {rep}: TTFT {r['ttft_ms']:.1f} ms", flush=True)
                with lock:
                    for t, what in log:
                        print(f"    +{(t - t0) * 1e3:8.1f} ms  {what}", flush=True)
            print(f"[{a.identity} chunk {chunk}] TTFT median {statistics.median(ttfts):.1f} ms over {a.reps}",
                  flush=True)
        finally:
            engine.close()
            # NOTE: the wrappers above hold the Program: drop every reference before the next Engine
            #       sizes its KV pool from the free memory.
            del engine, core, prog, rm, wrap
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
