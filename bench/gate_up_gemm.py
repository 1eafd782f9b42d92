"""The dense MLP's gate|up GEMM with the SwiGLU in its epilogue (`ninfer.ops.fast.gemm`) against cuBLAS's
F.linear + the SwiGLU kernel, at a long prefill's shapes, alone and inside the model's GEMM sequence
(the card runs at its power limit there, bench/NOTES.md session 15).

    PYTHONPATH=$PWD python3 bench/gate_up_gemm.py [--identity qwen3_6-27b] [--tokens 8192] [--seq-reps 3]
        [--configs BM,BN,BK,GROUP_M,WARPS,STAGES ...] [--gdn-kernels]

1. Correctness at each --tokens value: relative RMS error against the two-launch form and the share of
   bitwise-equal outputs (the products' summation order is the only difference).
2. Alone (bench_ms, ms per call): the two-launch form, then each config.
3. The model's GEMM sequence (bench/prefill_gemms.py's order: every layer's in/out projections, gate|up,
   down) with the MLP as the two-launch form and as the fused kernel (the first config, or the fastest
   alone), interleaved --seq-reps times, NVML clock and power beside.
--gdn-kernels: fla-core's chunk gated delta rule at the 27B's GDN shapes of one --tokens prompt, per kernel
(torch.profiler), the other large non-GEMM item of the 8k TTFT.
Prints tables and one JSON line; exits 0 without CUDA.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ninfer.bench.common import bench_ms, env_record, json_line, print_table  # noqa: E402


def _config(s: str):
    from ninfer.ops.fast.gemm import GemmConfig
    return GemmConfig(*(int(v) for v in s.split(",")))


def _two_launch(x, w):
    from ninfer.ops.fast.fused import silu_mul_halves
    return silu_mul_halves(F.linear(x, w))


def gdn_kernels(tokens: int) -> None:
    from torch.profiler import ProfilerActivity, profile
    from ninfer.ops.fast.gated_delta import chunk_gated_delta_rule
    HK, HV, D = 16, 48, 128
    dev = "cuda"
    q = torch.randn(1, tokens, HK, D, dtype=torch.bfloat16, device=dev)
    k = torch.randn(1, tokens, HK, D, dtype=torch.bfloat16, device=dev)
    v = torch.randn(1, tokens, HV, D, dtype=torch.bfloat16, device=dev)
    g = -torch.rand(1, tokens, HV, dtype=torch.float32, device=dev) * 0.1
    beta = torch.rand(1, tokens, HV, dtype=torch.bfloat16, device=dev)
    pool = torch.zeros(4, HV, D, D, dtype=torch.float32, device=dev)
    idx = torch.tensor([1], device=dev)

    def run():
        chunk_gated_delta_rule(q, k, v, g, beta, initial_state=pool, state_indices=idx, use_qk_l2norm_in_kernel=True)

    ms = bench_ms(run, warmup_ms=200, rep_ms=500)
    print(f"chunk GDN (fast op, {tokens} tokens, Hk {HK}, Hv {HV}, d {D}): {ms:.3f} ms per call, x48 = {48 * ms:.1f} ms",
          flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            run()
        torch.cuda.synchronize()
    agg = collections.defaultdict(lambda: [0, 0.0])
    for e in p.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            a = agg[e.name.split("<")[0][:60]]
            a[0] += 1
            a[1] += e.time_range.end - e.time_range.start
    rows = [[n, c // 5, f"{us / 5:.1f}"] for n, (c, us) in sorted(agg.items(), key=lambda kv: -kv[1][1])]
    print_table(["kernel", "per call", "us per call"], rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--identity", default="qwen3_6-27b")
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 2048, 1000])
    ap.add_argument("--seq-reps", type=int, default=3)
    ap.add_argument("--configs", nargs="*", default=["128,128,64,8,8,3", "128,128,64,8,8,4", "128,64,64,8,4,4",
                                                     "128,64,64,8,8,4", "64,128,64,8,4,4", "128,256,64,8,8,3"])
    ap.add_argument("--gdn-kernels", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gate_up_gemm: no CUDA device; nothing measured")
        return 0
    import prefill_gemms as pg
    from ninfer.ops.fast.gemm import gate_up_swiglu, supported
    print(env_record(), flush=True)
    d = pg._dims(args.identity)
    H, I = d.hidden_size, d.intermediate_size
    cfgs = [_config(s) for s in args.configs]
    w = torch.randn(2 * I, H, dtype=torch.bfloat16, device="cuda") * 0.02
    out: dict = {"identity": args.identity, "I": I, "H": H, "alone": {}, "check": {}}
    rows = []
    for M in args.tokens:
        x = torch.randn(M, H, dtype=torch.bfloat16, device="cuda")
        assert supported(x, w)
        ref = _two_launch(x, w).float()
        for c in cfgs:
            try:
                y = gate_up_swiglu(x, w, c).float()
            except Exception as e:                      # a config the card cannot take (shared memory)
                print(f"  config {tuple(c)} at M={M}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                continue
            err = ((y - ref).norm() / ref.norm()).item()
            eq = (y == ref).float().mean().item()
            out["check"][f"{M}:{','.join(map(str, c))}"] = [err, eq]
            if c is cfgs[0]:
                print(f"M={M}: rel RMS {err:.2e}, bitwise equal {100 * eq:.2f} %", flush=True)
        t0 = bench_ms(lambda: _two_launch(x, w), warmup_ms=100, rep_ms=300)
        row = [M, f"{t0:.3f}"]
        best = None
        for c in cfgs:
            key = f"{M}:{','.join(map(str, c))}"
            if key not in out["check"]:
                row.append("-")
                continue
            t = bench_ms(lambda: gate_up_swiglu(x, w, c), warmup_ms=100, rep_ms=300)
            out["alone"][key] = round(t, 4)
            row.append(f"{t:.3f}")
            if best is None or t < best[0]:
                best = (t, c)
        out["alone"][f"{M}:cublas+swiglu"] = round(t0, 4)
        rows.append(row)
        if M == args.tokens[0]:
            out["best"] = list(best[1]) if best else None
    print_table(["M", "cuBLAS+SwiGLU"] + [",".join(map(str, c)) for c in cfgs], rows)
    if out.get("best") is None:
        print("no config ran")
        return 1

    # the model's GEMM sequence at the first token count, MLP two ways
    M = args.tokens[0]
    best = _config(",".join(map(str, out["best"])))
    x = torch.randn(M, 17408, dtype=torch.bfloat16, device="cuda")
    weights = {}
    for name, N, K, layers in pg.shapes(args.identity):
        if name == "gate_up":
            weights[name] = (x[:, :K].contiguous(), w)
        else:
            weights[name] = (x[:, :K].contiguous(), torch.randn(N, K, dtype=torch.bfloat16, device="cuda") * 0.02)
    order = []
    attn = set(d.attention_layers)
    for li in range(d.num_hidden_layers):
        kind = "attn" if li in attn else "gdn"
        order += [f"{kind}_in", f"{kind}_out", "gate_up", "down"]

    def sequence(fused: bool) -> None:
        for name in order:
            xs, W = weights[name]
            if name == "gate_up":
                (gate_up_swiglu(xs, W, best) if fused else _two_launch(xs, W))
            else:
                F.linear(xs, W)

    for f in (False, True):
        sequence(f)
    torch.cuda.synchronize()
    times = {False: [], True: []}
    with pg._Nvml() as nv:
        for _ in range(args.seq_reps):
            for f in (False, True):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                sequence(f)
                e.record()
                e.synchronize()
                times[f].append(s.elapsed_time(e))
    a, b = statistics.median(times[False]), statistics.median(times[True])
    print(f"sequence of {len(order)} GEMMs at M={M} (config {tuple(best)}): cuBLAS+SwiGLU "
          f"{' / '.join(f'{t:.1f}' for t in times[False])} ms, fused {' / '.join(f'{t:.1f}' for t in times[True])} ms; "
          f"median {a:.1f} vs {b:.1f} ({b - a:+.1f} ms); {nv.summary()}", flush=True)
    out.update(sequence_ms={"two_launch": round(a, 2), "fused": round(b, 2)})
    if args.gdn_kernels:
        gdn_kernels(M)
    json_line("gate_up_gemm", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
