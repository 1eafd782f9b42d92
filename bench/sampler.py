"""Time of one sampler call (`ninfer.ops.sampling.sample`, drawn rows as the decode loop passes them) over
the Qwen3.6 vocabulary, per sampling configuration and batch size: the device time (CUDA events via
do_bench; wall clock on the CPU) and the host time of the call alone (no sync), so a change to the cut
(top-k / top-p) can be measured without a model.

    configurations: greedy (T 0), T 1 with no cut, top_k 20 + top_p 0.95 (the checkpoints' default: the
    top-k candidates) and the same through the full sort (candidates = 0), top_p 0.95 alone (full sort)

    PYTHONPATH=$PWD python3 bench/sampler.py [--batch 1 8] [--vocab 248320] [--device cuda]
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from _common import bench_ms, env_record, json_line, print_table
from ninfer.bench.common import default_device, sync
from ninfer.ops.sampling import SamplingTensors, drawing_rows, rng_state_from_seed, sample

CONFIGS = {
    "greedy": dict(temperature=0.0),
    "T1": dict(temperature=1.0),
    "top_k20_p0.95": dict(temperature=1.0, top_k=20, top_p=0.95),
    "top_k20_p0.95_sorted": dict(temperature=1.0, top_k=20, top_p=0.95),
    "top_p0.95": dict(temperature=1.0, top_p=0.95),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--device", default="")
    args = ap.parse_args()
    dev = args.device or default_device()
    print(f"env: {env_record()}", flush=True)
    rows, out = [], []
    for B in args.batch:
        logits = torch.randn(B, args.vocab, device=dev, generator=torch.Generator(dev).manual_seed(0)) * 3
        for name, cfg in CONFIGS.items():
            st = SamplingTensors.build(vocab_size=args.vocab, device=dev, **{k: [v] * B for k, v in cfg.items()})
            if name.endswith("_sorted"):
                st = dataclasses.replace(st, candidates=0)
            states = [rng_state_from_seed(i, dev) for i in range(B)]
            drawn = drawing_rows([cfg["temperature"]] * B)

            def call():
                return sample(logits, st, states, 0, drawn=drawn)

            dev_ms = bench_ms(call, device=dev)
            call()
            sync(dev)
            n, t0 = 20, time.perf_counter()
            for _ in range(n):
                call()
            host_ms = (time.perf_counter() - t0) / n * 1e3
            sync(dev)
            rows.append([B, name, st.candidates, f"{dev_ms:.4f}", f"{host_ms:.4f}"])
            out.append({"batch": B, "config": name, "candidates": st.candidates, "device_ms": dev_ms,
                        "host_ms": host_ms})
    print_table(["B", "config", "candidates", "device_ms", "host_ms (no sync; CPU: the call)"], rows)
    json_line("sampler", {"device": dev, "vocab": args.vocab, "results": out})


if __name__ == "__main__":
    main()
