"""Time of one sampler call (`ninfer.ops.reference.sampling.sample`, drawn rows as the decode loop passes them) over
the Qwen3.6 vocabulary, per sampling configuration and batch size: the device time (CUDA events via
do_bench; wall clock on the CPU) and the host time of the call alone (no sync). Each configuration runs
three times in the same process: as the decode loop calls it now (`Sampler.sample_ids`: the host facts of
`SamplingTensors.build`, no log-probs; on CUDA the fused cut and race, FUSED_DRAW), the same with the torch
cut and race ("torch": FUSED_DRAW off), and with every skip off too ("full": the sorted row, the penalty
step, the raw log-softmax), which is what the sampler did before the skips.

    configurations: greedy (T 0), T 1 with no cut, top_k 20 + top_p 0.95 (the checkpoints' default: the
    top-k candidates), top_p 0.95 alone (torch: the sorted row; fused: `top_p_cut`), and top_p 0.95 with
    min_p 0.05 (torch: the sorted row and the min-p softmax)

    PYTHONPATH=$PWD python3 bench/sampler.py [--batch 1 8] [--vocab 248320] [--device cuda] [--kernels]

--kernels (CUDA): also the GPU time of a call's kernels alone (torch.profiler, summed over 20 calls), which
the device time above hides where the call is bound by its host time.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from _common import bench_ms, env_record, json_line, print_table
from ninfer.bench.common import default_device, sync
from ninfer.ops.reference import sampling as S
from ninfer.ops.reference.sampling import SamplingTensors, drawing_rows, rng_state_from_seed, sample

CONFIGS = {
    "greedy": dict(temperature=0.0),
    "T1": dict(temperature=1.0),
    "top_k20_p0.95": dict(temperature=1.0, top_k=20, top_p=0.95),
    "top_p0.95": dict(temperature=1.0, top_p=0.95),
    "top_p0.95_min_p0.05": dict(temperature=1.0, top_p=0.95, min_p=0.05),
}


def kernel_ms(call, dev: str, n: int = 20) -> tuple[float, float]:
    """(GPU time of the kernels per call in ms, kernels per call): CUDA kernel records of n calls."""
    from torch.profiler import ProfilerActivity, profile

    sync(dev)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            call()
        sync(dev)
    ks = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.time_range.end - e.time_range.start for e in ks) / n / 1e3, len(ks) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--device", default="")
    ap.add_argument("--kernels", action="store_true", help="the kernels' GPU time per call (CUDA, torch.profiler)")
    args = ap.parse_args()
    dev = args.device or default_device()
    print(f"env: {env_record()}", flush=True)
    rows, out = [], []
    fused_default = S.FUSED_DRAW
    for B in args.batch:
        logits = torch.randn(B, args.vocab, device=dev, generator=torch.Generator(dev).manual_seed(0)) * 3
        for name, cfg in CONFIGS.items():
            now = SamplingTensors.build(vocab_size=args.vocab, device=dev, **{k: [v] * B for k, v in cfg.items()})
            full = dataclasses.replace(now, candidates=0, penalized=True)
            states = [rng_state_from_seed(i, dev) for i in range(B)]
            drawn = drawing_rows([cfg["temperature"]] * B)
            row = [B, name, now.candidates]
            rec = {"batch": B, "config": name, "candidates": now.candidates}
            for tag, st, lp, fused in (("now", now, False, True), ("torch", now, False, False), ("full", full, True, False)):
                S.FUSED_DRAW = fused

                def call(st=st, lp=lp):
                    return sample(logits, st, states, 0, drawn=drawn, logprobs=lp)

                dev_ms = bench_ms(call, device=dev)
                call()
                sync(dev)
                n, t0 = 20, time.perf_counter()
                for _ in range(n):
                    call()
                host_ms = (time.perf_counter() - t0) / n * 1e3
                sync(dev)
                row += [f"{dev_ms:.4f}", f"{host_ms:.4f}"]
                rec.update({f"{tag}_device_ms": dev_ms, f"{tag}_host_ms": host_ms})
                if args.kernels and tag != "full":
                    rec[f"{tag}_kernel_ms"], rec[f"{tag}_kernels"] = kernel_ms(call, dev)
                    row += [f"{rec[f'{tag}_kernel_ms']:.4f}", rec[f"{tag}_kernels"]]
            rows.append(row)
            out.append(rec)
            S.FUSED_DRAW = fused_default
    k = ["kernel_ms", "kernels"] if args.kernels else []
    print_table(["B", "config", "candidates", "now device_ms", "now host_ms", *["now " + c for c in k], "torch device_ms",
                 "torch host_ms", *["torch " + c for c in k], "full device_ms", "full host_ms"], rows)
    print("host_ms: the call without a sync (on the CPU: the call)")
    json_line("sampler", {"device": dev, "vocab": args.vocab, "results": out})


if __name__ == "__main__":
    main()
