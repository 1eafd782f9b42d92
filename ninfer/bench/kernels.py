"""Kernel bench: every fast op vs its PyTorch reference at the 27B shapes, with a correctness gate.

    ninfer bench kernels [--quick] [--out DIR]   (or: python3 -m ninfer.bench.kernels)

Per case: relative RMS error vs the reference (gate: bf16 1e-2, prefill GDN 2e-2), the median
time of the fast op and of the reference (CUDA events), and the floor: max(bytes / copy bandwidth,
FLOPs / matmul rate), both ceilings measured in this run. Prints a table and one JSON line.
"""
from __future__ import annotations

import argparse
import sys

import torch

from ninfer.ops import reference as ref
from ninfer.bench.args import kernels_args as add_args
from ninfer.bench.common import Recorder, bench_ms, env_record, measure_ceilings, print_ceilings, print_table
from ninfer.ops.triton import attention as fa, conv as fc, gated_delta as fg, moe as fm, norms as fn

DEV = "cuda"
BF = torch.bfloat16
H, C, HK, HV, DK, DV, HQ, HKV, D = 5120, 10240, 16, 48, 128, 128, 24, 4, 256


def rel_rms(a, b):
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def rn(*shape, dtype=BF, scale=1.0):
    return (torch.randn(*shape, device=DEV) * scale).to(dtype)


def cases(quick: bool):
    out = []
    # --- norms -----------------------------------------------------------------------------
    for M in (8, 8192):
        x, w = rn(M, H), rn(H, scale=0.1)
        out.append((f"rms_norm [{M},{H}]", lambda x=x, w=w: fn.rms_norm(x, w), lambda x=x, w=w: ref.rms_norm(x, w),
                    2 * M * H * 2, 0, 1e-2))
    for M in (8 * HV, 8192 * HV):
        o, z, w = rn(M, DV), rn(M, DV), torch.ones(DV, device=DEV)
        out.append((f"gated_rms_norm [{M},{DV}]", lambda o=o, z=z, w=w: fn.gated_rms_norm(o, z, w),
                    lambda o=o, z=z, w=w: ref.gated_rms_norm(o, z, w), 3 * M * DV * 2, 0, 1e-2))
    # --- conv --------------------------------------------------------------------------------
    S = 24
    w = rn(C, 4, scale=0.5)
    for B in (1, 8):
        x = rn(B, C)
        pool = rn(S, C, 3)
        idx = torch.arange(B, device=DEV) * 2
        init = pool[idx].clone()
        out.append((f"conv1d_update B={B}",
                     lambda x=x, pool=pool, idx=idx: fc.causal_conv1d_update(x, w, pool, state_indices=idx,
                                                                           gather_final_state=False)[0],
                     lambda x=x, init=init: ref.causal_conv1d_update(x, w, init.clone())[0],
                     B * C * (2 + 2 + 12) + C * 8, 0, 1e-2))
    T = 8192
    x = rn(1, T, C)
    out.append((f"conv1d_prefill T={T}", lambda: fc.chunk_causal_conv1d(x, w)[0],
                lambda: ref.chunk_causal_conv1d(x, w)[0], 2 * T * C * 2, 0, 1e-2))
    # --- gated delta rule --------------------------------------------------------------------
    A_log, dtb = torch.log(torch.linspace(1, 16, HV, device=DEV)), torch.ones(HV, device=DEV)
    for B in (1, 8):
        q, k, v = rn(B, 1, HK, DK), rn(B, 1, HK, DK), rn(B, 1, HV, DV)
        g, beta = ref.gdn_gates(rn(B, 1, HV, dtype=torch.float32), rn(B, 1, HV), A_log, dtb)
        pool = rn(S, HV, DK, DV, dtype=torch.float32, scale=0.1)
        idx = torch.arange(B, device=DEV) * 2
        init = pool[idx].clone()
        out.append((f"gdn_recurrent B={B}",
                     lambda q=q, k=k, v=v, g=g, beta=beta, pool=pool, idx=idx: fg.fused_recurrent_gated_delta_rule(
                         q, k, v, g, beta, initial_state=pool, state_indices=idx, use_qk_l2norm_in_kernel=True,
                         gather_final_state=False)[0],
                     lambda q=q, k=k, v=v, g=g, beta=beta, init=init: ref.fused_recurrent_gated_delta_rule(
                         q, k, v, g, beta, initial_state=init, use_qk_l2norm_in_kernel=True)[0],
                     B * HV * DK * DV * 4 * 2, 0, 1e-2))
    T = 2048 if quick else 8192
    q, k, v = rn(1, T, HK, DK), rn(1, T, HK, DK), rn(1, T, HV, DV)
    g, beta = ref.gdn_gates(rn(1, T, HV, dtype=torch.float32), rn(1, T, HV), A_log, dtb)
    h0 = rn(1, HV, DK, DV, dtype=torch.float32, scale=0.1)
    flops = T * HV * (8 * DK * DV + 4 * 64 * (DK + DV))
    out.append((f"gdn_chunk T={T} ({'fla' if fg.fla_available() else 'REFERENCE: no fla'})",
                lambda: fg.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, use_qk_l2norm_in_kernel=True)[0],
                lambda: ref.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, use_qk_l2norm_in_kernel=True)[0],
                T * (2 * HK * DK + 2 * HV * DV) * 2 + 2 * HV * DK * DV * 4, flops, 2e-2))
    # --- paged attention ---------------------------------------------------------------------
    page = 64
    for ctx in (1024, 8192):
        for B in (1, 8):
            n = ctx // page
            P = B * n + 4
            kc, vc = rn(P, page, HKV, D), rn(P, page, HKV, D)
            bt = torch.randperm(P, device=DEV)[: B * n].view(B, n).int()
            lens = torch.full((B,), ctx, device=DEV)
            qd = rn(B, HQ, D)
            out.append((f"decode_attn B={B} ctx={ctx}",
                        lambda qd=qd, kc=kc, vc=vc, bt=bt, lens=lens: fa.decode_paged_attention(qd, kc, vc, bt, lens),
                        lambda qd=qd, kc=kc, vc=vc, bt=bt, lens=lens: ref.decode_paged_attention(qd, kc, vc, bt, lens),
                        B * ctx * HKV * D * 2 * 2, 4 * B * ctx * HQ * D, 1e-2))
    T = 2048 if quick else 8192
    n = T // page
    kc, vc = rn(n + 2, page, HKV, D), rn(n + 2, page, HKV, D)
    bt = torch.randperm(n + 2, device=DEV)[:n].view(1, n).int()
    qp = rn(T, HQ, D)
    lens = torch.tensor([T], device=DEV)
    out.append((f"prefill_attn T={T}", lambda: fa.chunk_paged_attention(qp, kc, vc, bt, lens),
                lambda: ref.chunk_paged_attention(qp, kc, vc, bt, lens), 4 * T * HQ * D * 2, 2 * T * T * HQ * D, 1e-2))
    # --- routed experts (35B-A3B shapes: E=256, top-8, H=2048, I=512) ---------------------------
    E, TOPK, HM, IM = 256, 8, 2048, 512
    gu, dn = rn(E, 2 * IM, HM, scale=0.02), rn(E, HM, IM, scale=0.02)
    for B in (1, 8):
        xm = rn(B, HM)
        routing = ref.route_topk(rn(B, E), TOPK)
        distinct = int(routing.ids.unique().numel())
        out.append((f"moe_experts B={B} ({distinct} experts)",
                    lambda xm=xm, routing=routing: fm.moe_experts(xm, routing, gu, dn),
                    lambda xm=xm, routing=routing: ref.moe_experts(xm, routing, gu, dn),
                    distinct * 3 * IM * HM * 2, 0, 1e-2))
    return out




def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ninfer bench kernels")
    add_args(ap)
    return run(ap.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    env = env_record()
    ceil = measure_ceilings()
    print(f"env: {env}")
    print_ceilings(ceil)
    bw, peak = ceil["copy_TBps"] * 1e12, ceil["matmul_8192_TFLOPs"] * 1e12
    rows, results = [], []
    for name, fast, slow, nbytes, flops, tol in cases(args.quick):
        err = rel_rms(fast(), slow())
        ok = err < tol
        t_fast = bench_ms(fast)
        t_ref = bench_ms(slow, warmup_ms=5, rep_ms=30)
        floor_ms = max(nbytes / bw, flops / peak) * 1e3
        rows.append([name, "ok" if ok else "FAIL", f"{err:.1e}", t_fast * 1e3, floor_ms * 1e3, t_fast / floor_ms,
                     t_ref * 1e3, t_ref / t_fast])
        results.append(dict(case=name, gate_ok=ok, rel_rms=err, fast_us=t_fast * 1e3, floor_us=floor_ms * 1e3,
                            ref_us=t_ref * 1e3, bytes=nbytes, flops=flops))
        torch.cuda.empty_cache()
    print()
    print_table(["case", "gate", "rel_rms", "fast_us", "floor_us", "x_floor", "ref_us", "speedup"], rows)
    rec = Recorder("kernels", getattr(args, "out", None),
                   {"env": env, "ceilings": ceil, "dtype": "bf16", "identity_shapes": "qwen3_6-27b"})
    rec.add(results)
    rec.finish()
    return 0 if all(r["gate_ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
