"""The GDN part of one long prefill at the 27B's shapes, per kernel: the fast conv (q, k, v split) and
fla-core's chunk gated delta rule (q/k L2-normalised inside it), as the model runs them.

    PYTHONPATH=$PWD python3 bench/gdn_prefill.py [--tokens 8192] [--reps 5]

x is a strided column view of an in-projection output (as the schedule passes it). Prints ms per layer
(median of --reps bench_ms runs; the first runs can be host bound), x48 layers, the per-kernel table
(torch.profiler), the output's relative RMS error against the fp32 reference ops on the same inputs,
and one JSON line; exits 0 without CUDA.
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
    from ninfer.ops import reference as ref
    from ninfer.ops.triton.conv import chunk_causal_conv1d
    from ninfer.ops.triton.gated_delta import chunk_gated_delta_rule
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

    def layer():
        (q, k, v), _ = chunk_causal_conv1d(x, w, conv_pool, state_indices=idx, split=SPLIT, gather_final_state=False)
        q, k, v = q.view(1, T, HK, D), k.view(1, T, HK, D), v.view(1, T, HV, D)
        o, _ = chunk_gated_delta_rule(q, k, v, gate, beta, initial_state=rec_pool, state_indices=idx,
                                      use_qk_l2norm_in_kernel=True, gather_final_state=False)
        return o

    conv_pool.zero_()
    rec_pool.zero_()
    out = layer().float()
    (rq, rk, rv), _ = ref.chunk_causal_conv1d(x.float(), w.float(), torch.zeros(1, C, 3, device=dev), split=SPLIT)
    ro, _ = ref.chunk_gated_delta_rule(rq.view(1, T, HK, D), rk.view(1, T, HK, D), rv.view(1, T, HV, D), gate,
                                       beta.float(), initial_state=torch.zeros(1, HV, D, D, device=dev),
                                       use_qk_l2norm_in_kernel=True)
    err = ((out - ro.float()).norm() / ro.float().norm()).item()
    times = [bench_ms(layer, warmup_ms=50, rep_ms=200) for _ in range(args.reps)]
    ms = statistics.median(times)
    print(f"output rel RMS vs the fp32 reference: {err:.2e}", flush=True)
    print(f"GDN prefill part: {ms:.3f} ms per layer (reps {' '.join(f'{t:.3f}' for t in times)}), "
          f"x{LAYERS} = {LAYERS * ms:.1f} ms", flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            layer()
        torch.cuda.synchronize()
    agg = collections.defaultdict(lambda: [0, 0.0])
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            a = agg[e.name.split("<")[0].split("(")[0][:60]]
            a[0] += 1
            a[1] += e.time_range.end - e.time_range.start
    kern = {n: round(us / 5, 1) for n, (c, us) in agg.items()}
    print(f"kernels (us per layer, kernel sum {sum(kern.values()):.1f}):")
    print_table(["kernel", "per layer", "us"], [[n, c // 5, f"{us / 5:.1f}"] for n, (c, us)
                                               in sorted(agg.items(), key=lambda kv: -kv[1][1])])
    json_line("gdn_prefill", {"tokens": T, "rel_rms_ref": err, "ms": round(ms, 4), "kernels_us": kern})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
