"""The GDN part of one long prefill at the 27B's shapes: the fast conv (q, k, v split) and fla-core's chunk
gated delta rule, with q/k L2-normalised in the conv (`l2norm_heads`, the model's path) or in fla-core
(`use_qk_l2norm_in_kernel=True`, the path before), timed interleaved and per kernel (torch.profiler).

    PYTHONPATH=$PWD python3 bench/gdn_prefill.py [--tokens 8192] [--reps 5]

x is a strided column view of an in-projection output (as the schedule passes it). Prints ms per layer
for both forms (median of --reps interleaved bench_ms runs), x48 layers, the per-kernel table of each,
the relative RMS difference of their outputs, and one JSON line; exits 0 without CUDA.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from ninfer.bench.common import bench_ms, env_record, json_line, print_table  # noqa: E402

HK, HV, D = 16, 48, 128                       # 27B: key heads, value heads, head dim
SPLIT = (HK * D, HK * D, HV * D)
C = sum(SPLIT)
PROJ = C + HV * D + 2 * HV                    # in_proj output [qkv | z | b | a]
LAYERS = 48


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gdn_prefill: no CUDA device; nothing measured")
        return 0
    from torch.profiler import ProfilerActivity, profile
    from ninfer.ops.fast.conv import chunk_causal_conv1d
    from ninfer.ops.fast.gated_delta import chunk_gated_delta_rule
    print(env_record(), flush=True)
    T, dev = args.tokens, "cuda"
    g0 = torch.Generator(device=dev).manual_seed(0)
    proj = torch.randn(T, PROJ, device=dev, generator=g0).to(torch.bfloat16)
    x = proj[:, :C].unsqueeze(0)
    w = (torch.randn(C, 4, device=dev, generator=g0) * 0.5).to(torch.bfloat16)
    conv_pool = torch.zeros(4, C, 3, dtype=torch.bfloat16, device=dev)
    rec_pool = torch.zeros(4, HV, D, D, dtype=torch.float32, device=dev)
    idx = torch.tensor([1], device=dev)
    gate = -torch.rand(1, T, HV, device=dev, generator=g0) * 0.1
    beta = torch.rand(1, T, HV, device=dev, generator=g0).to(torch.bfloat16)

    def layer(fold: bool):
        (q, k, v), _ = chunk_causal_conv1d(x, w, conv_pool, state_indices=idx, split=SPLIT,
                                           l2norm_heads=D if fold else None, gather_final_state=False)
        q, k, v = q.view(1, T, HK, D), k.view(1, T, HK, D), v.view(1, T, HV, D)
        o, _ = chunk_gated_delta_rule(q, k, v, gate, beta, initial_state=rec_pool, state_indices=idx,
                                      use_qk_l2norm_in_kernel=not fold, gather_final_state=False)
        return o

    rec_pool.zero_()
    before = layer(False).float()
    rec_pool.zero_()
    after = layer(True).float()
    err = ((after - before).norm() / before.norm()).item()
    print(f"output rel RMS (fold vs fla-core's l2norm): {err:.2e}", flush=True)
    times = {False: [], True: []}
    for _ in range(args.reps):
        for f in (False, True):
            times[f].append(bench_ms(lambda: layer(f), warmup_ms=50, rep_ms=200))
    med = {f: statistics.median(t) for f, t in times.items()}
    for f, name in ((False, "l2norm in fla-core"), (True, "l2norm in the conv")):
        print(f"{name:20s} {med[f]:.3f} ms per layer (reps {' '.join(f'{t:.3f}' for t in times[f])}), "
              f"x{LAYERS} = {LAYERS * med[f]:.1f} ms", flush=True)
    kern = {}
    for f in (False, True):
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(5):
                layer(f)
            torch.cuda.synchronize()
        agg = collections.defaultdict(lambda: [0, 0.0])
        for e in p.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                a = agg[e.name.split("<")[0].split("(")[0][:60]]
                a[0] += 1
                a[1] += e.time_range.end - e.time_range.start
        kern[f] = {n: round(us / 5, 1) for n, (c, us) in agg.items()}
        print(f"kernels, {'fold' if f else 'before'} (us per layer, kernel sum {sum(kern[f].values()):.1f}):")
        print_table(["kernel", "per layer", "us"], [[n, c // 5, f"{us / 5:.1f}"] for n, (c, us)
                                                   in sorted(agg.items(), key=lambda kv: -kv[1][1])])
    json_line("gdn_prefill", {"tokens": T, "rel_rms": err, "ms_before": round(med[False], 4),
                              "ms_fold": round(med[True], 4), "kernels_before": kern[False], "kernels_fold": kern[True]})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
