"""Prefill-path ops at the 27B shapes of one 8192-token prompt, old vs new (CUDA events, warm-up first).

    PYTHONPATH=$PWD python3 bench/prefill_ops.py [--tokens 8192] [--skip-gdn]

Parts (per layer; the 27B has 48 GDN and 16 attention layers):
  conv      chunk_causal_conv1d over x = in_proj[:, :C] (row stride 16480), C = 10240, slot state:
            old kernel ([32 x 128] tiles, 4 shifted tile loads + state gathers per tile, output
            [T, C]) vs the new row-walking kernel with the (q, k, v) split output, plus a tile sweep.
  conv+copy old conv + the three .contiguous() of its q/k/v split (fla-core's input_guard did them)
            vs the new split conv: the GDN layer's non-GEMM cost before fla-core.
  gdn       the GDN prefill wrapper incl. copies: old (strided q/k/v, cu_seqlens given: copies +
            one device-to-host sync in fla-core's chunk indices) vs new (contiguous q/k/v, no cu_seqlens).
  attn      paged prefill attention, Hq 24 / Hkv 4 / D 256, page 64: old (K/V repeated to 24 heads,
            device row bounds: 2 syncs, output copied) vs new (enable_gqa, host row bounds, no copy).
Each line: ms per call, x 48 (or x 16) = ms per prefill, and host syncs per call (torch's sync
debug mode). The old paths are reproduced here (the ops keep only the new ones). Prints a table
and one JSON line; exits 0 without CUDA.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from ninfer.bench.common import bench_ms, env_record, json_line, print_table  # noqa: E402

GDN_LAYERS, ATTN_LAYERS = 48, 16
Q, K_, V_ = 2048, 2048, 6144                 # 27B: 16 x 128 key, 16 x 128 key, 48 x 128 value channels
C = Q + K_ + V_
PROJ = C + 48 * 128 + 2 * 48                 # in_proj output [qkv | z | b | a]
HK, HV, DK, DV = 16, 48, 128, 128
HQ, HKV, HD, PAGE = 24, 4, 256, 64


try:
    import triton
    import triton.language as tl
except ImportError:                          # NOTE: the CPU install has no Triton; main() exits first
    triton = None

if triton is not None:
    @triton.jit
    def _silu_v0(x):
        return x / (1.0 + tl.exp(-x))

    @triton.jit
    def _conv_fwd_v0(x, w, state, idx, cu, y, C, stride_x, stride_sn,
                     BT: tl.constexpr, BC: tl.constexpr, ACT: tl.constexpr):
        # NOTE: the prefill conv kernel before this change (ninfer/ops/triton/conv.py at 6af55a6).
        i_n = tl.program_id(0)
        i_t = tl.program_id(1)
        i_c = tl.program_id(2)
        bos = tl.load(cu + i_n).to(tl.int64)
        eos = tl.load(cu + i_n + 1).to(tl.int64)
        t0 = bos + i_t * BT
        if t0 >= eos:
            return
        slot = tl.load(idx + i_n).to(tl.int64)
        o_t = t0 + tl.arange(0, BT)
        o_c = i_c * BC + tl.arange(0, BC)
        mt = o_t < eos
        mc = o_c < C
        acc = tl.zeros([BT, BC], dtype=tl.float32)
        for j in tl.static_range(4):
            src = o_t - 3 + j
            in_x = src >= bos
            xv = tl.load(x + src[:, None] * stride_x + o_c[None, :],
                         mask=(mt & in_x)[:, None] & mc[None, :], other=0.0).to(tl.float32)
            sv = tl.load(state + slot * stride_sn + o_c[None, :] * 3 + (src - bos + 3)[:, None],
                         mask=(mt & (src < bos))[:, None] & mc[None, :], other=0.0).to(tl.float32)
            wj = tl.load(w + o_c * 4 + j, mask=mc, other=0.0).to(tl.float32)
            acc += (xv + sv) * wj[None, :]
        if ACT:
            acc = _silu_v0(acc)
        tl.store(y + o_t[:, None] * C + o_c[None, :], acc.to(y.dtype.element_ty), mask=mt[:, None] & mc[None, :])


def old_conv(kern, x, w, pool, idx, cu):
    """The conv before this change: [32 x 128] tiles, then the (unchanged) state kernel."""
    from ninfer.ops.triton.conv import _conv_state_kernel
    _, T, Cx = x.shape
    x2 = x.reshape(T, Cx)
    y = torch.empty(1, T, Cx, dtype=x.dtype, device=x.device)
    kern[(1, triton.cdiv(T, 32), triton.cdiv(Cx, 128))](x2, w, pool, idx, cu, y, Cx, x2.stride(0), pool.stride(0),
                                                        BT=32, BC=128, ACT=True, num_warps=4)
    _conv_state_kernel[(1, triton.cdiv(Cx, 128))](x2, pool, idx, cu, Cx, x2.stride(0), pool.stride(0), BC=128,
                                                   num_warps=4)
    return y


def syncs(fn) -> int:
    """Host syncs of one call (torch.cuda sync debug mode: one warning per synchronizing op)."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return sum("synchroniz" in str(r.message).lower() for r in rec)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--skip-gdn", action="store_true", help="skip the fla-core part (its first-call autotuning)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("prefill_ops: no CUDA device; nothing measured")
        return 0
    from ninfer.ops.triton import attention as fa
    from ninfer.ops.triton import conv as fc
    from ninfer.ops.triton import gated_delta as fg
    from ninfer.ops.reference.attention import gather_kv_paged

    torch.manual_seed(0)
    dev, T, bf = "cuda", args.tokens, torch.bfloat16
    env = env_record()
    print(f"prefill_ops: {env['gpu']}, torch {env['torch']}, triton {env['triton']}, fla-core {env['fla_core']}, "
          f"commit {env['commit']}; bf16, T = {T}", flush=True)
    rows, res = [], {}

    def add(name, old_ms, new_ms, layers, old_sync=None, new_sync=None, note=""):
        saved = (old_ms - new_ms) * layers if old_ms is not None else None
        rows.append([name, old_ms, new_ms, None if old_ms is None else old_ms * layers, new_ms * layers, saved,
                     old_sync, new_sync, note])
        res[name] = {"old_ms": old_ms, "new_ms": new_ms, "layers": layers, "saved_ms_per_prefill": saved,
                     "old_syncs": old_sync, "new_syncs": new_sync, "note": note}
        print(f"  {name}: old {old_ms} ms, new {new_ms:.4f} ms", flush=True)

    # ---- conv -------------------------------------------------------------------------------
    proj = torch.randn(T, PROJ, device=dev, dtype=bf)
    x = proj[:, :C].unsqueeze(0)
    w = (torch.randn(C, 4, device=dev) * 0.5).to(bf)
    pool = torch.randn(4, C, 3, device=dev, dtype=bf)
    idx = torch.tensor([2], device=dev)
    cu = torch.tensor([0, T], device=dev)
    v0 = _conv_fwd_v0
    split = (Q, K_, V_)
    y_old = old_conv(v0, x, w, pool.clone(), idx, cu)
    y_new = torch.cat(fc.chunk_causal_conv1d(x, w, pool.clone(), cu_seqlens=cu, state_indices=idx, split=split)[0], -1)
    err = ((y_old.float() - y_new.float()).norm() / y_old.float().norm()).item()
    gbs = lambda ms: 2 * T * C * 2 / (ms * 1e-3) / 1e9  # noqa: E731
    t_old = bench_ms(lambda: old_conv(v0, x, w, pool, idx, cu))
    t_new = bench_ms(lambda: fc.chunk_causal_conv1d(x, w, pool, cu_seqlens=cu, state_indices=idx, split=split))
    add("conv", t_old, t_new, GDN_LAYERS, note=f"GB/s old {gbs(t_old):.0f} new {gbs(t_new):.0f}; rel diff {err:.1e}")
    sweep = {}
    for bt, bc, nw in [(16, 1024, 4), (32, 1024, 4), (64, 1024, 4), (32, 1024, 8), (32, 512, 2), (32, 512, 4),
                       (64, 512, 4), (32, 256, 1), (64, 256, 2)]:
        ms = bench_ms(lambda: fc.chunk_causal_conv1d(x, w, pool, cu_seqlens=cu, state_indices=idx, split=split,
                                                     block_t=bt, block_c=bc, num_warps=nw))
        sweep[f"BT{bt}_BC{bc}_W{nw}"] = round(ms * 1e3, 1)
    res["conv_tile_sweep_us"] = sweep
    print("  conv tile sweep (us):", sweep, flush=True)

    def old_conv_copies():
        y = old_conv(v0, x, w, pool, idx, cu)
        return [t.contiguous() for t in torch.split(y, split, dim=-1)]
    t_old = bench_ms(old_conv_copies)
    add("conv+qkv copies", t_old, t_new, GDN_LAYERS, note="old: conv + 3 strided copies; new: split conv")

    # ---- attention ----------------------------------------------------------------------------
    npages = (T + PAGE - 1) // PAGE
    kc = torch.randn(npages + 2, PAGE, HKV, HD, device=dev, dtype=bf)
    vc = torch.randn_like(kc)
    bt = torch.randperm(npages + 2, device=dev)[:npages].view(1, -1).to(torch.int32)
    q = torch.randn(T, HQ, HD, device=dev, dtype=bf)
    ctx_dev, cu_dev = torch.tensor([T], device=dev), torch.tensor([0, T], device=dev)
    ctx_host, cu_host = torch.tensor([T]), torch.tensor([0, T])
    rep = HQ // HKV

    def old_attn():
        out = torch.empty_like(q)
        lens, cuh = ctx_dev.tolist(), cu_dev.tolist()                         # the 2 syncs of chunk_rows
        for b, ctx in enumerate(lens):
            s, e = cuh[b], cuh[b + 1]
            k = gather_kv_paged(kc, bt[b], ctx).transpose(0, 1).repeat_interleave(rep, dim=0).unsqueeze(0)
            v = gather_kv_paged(vc, bt[b], ctx).transpose(0, 1).repeat_interleave(rep, dim=0).unsqueeze(0)
            o = F.scaled_dot_product_attention(q[s:e].transpose(0, 1).unsqueeze(0), k, v, is_causal=True)
            out[s:e] = o[0].transpose(0, 1)
        return out

    new_attn = lambda: fa.chunk_paged_attention(q, kc, vc, bt, ctx_host, cu_host)  # noqa: E731
    o_old, o_new = old_attn(), new_attn()
    err = ((o_old.float() - o_new.float()).norm() / o_old.float().norm()).item()
    add("attn prefill", bench_ms(old_attn), bench_ms(new_attn), ATTN_LAYERS, syncs(old_attn), syncs(new_attn),
        note=f"rel diff {err:.1e}")

    # ---- GDN prefill wrapper (fla-core) ---------------------------------------------------------
    if not args.skip_gdn and fg.fla_available():
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
        u = torch.randn(1, T, C, device=dev, dtype=bf)
        qs, ks, vs = torch.split(u, split, dim=-1)
        qs, ks, vs = qs.view(1, T, HK, DK), ks.view(1, T, HK, DK), vs.view(1, T, HV, DV)
        qc, kc_, vc_ = qs.contiguous(), ks.contiguous(), vs.contiguous()
        g = -torch.rand(1, T, HV, device=dev) * 0.5
        beta = torch.rand(1, T, HV, device=dev).to(bf)
        rec = torch.randn(4, HV, DK, DV, device=dev) * 0.01

        def old_gdn():
            h0 = rec.index_select(0, idx).float()
            o, ht = fla_chunk(qs.contiguous(), ks.contiguous(), vs.contiguous(), g.float().contiguous(),
                              beta.contiguous(), initial_state=h0, output_final_state=True,
                              use_qk_l2norm_in_kernel=True, cu_seqlens=cu.to(torch.long))
            rec.index_copy_(0, idx, ht)
            return o

        def new_gdn():
            return fg.chunk_gated_delta_rule(qc, kc_, vc_, g, beta, initial_state=rec, state_indices=idx,
                                             use_qk_l2norm_in_kernel=True, cu_seqlens=cu, gather_final_state=False)[0]
        old_gdn(), new_gdn()
        # NOTE: the old path's sync is counted with a fresh cu_seqlens tensor (fla-core caches its
        #       chunk indices per tensor: one sync per forward, shared by the 48 layers).
        cu_old = cu

        def old_gdn_fresh():
            nonlocal cu
            cu = cu_old.clone()
            try:
                old_gdn()
            finally:
                cu = cu_old
        add("gdn prefill", bench_ms(old_gdn), bench_ms(new_gdn), GDN_LAYERS, syncs(old_gdn_fresh), syncs(new_gdn),
            note="incl. q/k/v copies (old) and the chunk-index sync once per forward (old)")
    else:
        print("  gdn prefill: skipped (fla-core missing or --skip-gdn)", flush=True)

    print()
    print_table(["part", "old ms", "new ms", "old ms/prefill", "new ms/prefill", "saved ms/prefill",
                 "old syncs", "new syncs", "note"], rows)
    json_line("prefill_ops", {"env": env, "tokens": T, "dtype": "bf16", "model": "qwen3_6-27b shapes", "results": res})
    return 0


if __name__ == "__main__":
    sys.exit(main())
