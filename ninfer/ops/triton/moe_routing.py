"""MoE routing (Triton): `route_topk(logits, k)` with the signature and results of
`ninfer.ops.reference.moe.route_topk`, up to rounding and ties.

One program (one warp) per token, one launch: fp32 softmax over the E logits, k rounds of one max over
packed (probability bits, id) keys, renormalise, weights cast to the logits' dtype, ids int64. Ties go
to the lowest expert id (torch.topk leaves them unspecified). `topk_of_row` is the per-row routine; the
first decode expert kernel (`moe_decode`) runs it too when it routes one token itself.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.ops.reference.moe import MoeRouting
from ninfer.ops.triton import pdl

__all__ = ["route_topk", "topk_of_row"]


@triton.jit
def topk_of_row(row, E, K: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr):
    """Top-K of one row of E router logits: (renormalised weights [BK] fp32, ids [BK] int64), slots >= K
    hold 0. fp32 softmax over all E; by decreasing probability, the lowest id wins a tie."""
    o_e = tl.arange(0, BE)
    me = o_e < E
    lg = tl.load(row + o_e, mask=me, other=float("-inf")).to(tl.float32)
    ex = tl.where(me, tl.exp(lg - tl.max(lg, 0)), 0.0)
    p = ex / tl.sum(ex, 0)
    # NOTE: one max per round on a packed key: p >= 0, so its fp32 bits order like the values; the low
    #       word (BE - 1 - e) makes the lowest id win a tie. Taken and padding lanes hold -1.
    key = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (BE - 1 - o_e).to(tl.int64)
    key = tl.where(me, key, -1)
    o_k = tl.arange(0, BK)
    wv = tl.zeros([BK], dtype=tl.float32)
    iv = tl.zeros([BK], dtype=tl.int64)
    for j in tl.static_range(K):
        best = tl.max(key, 0)
        hi = best >> 32
        v = hi.to(tl.int32).to(tl.float32, bitcast=True)
        idx = BE - 1 - (best - (hi << 32))
        idx = tl.minimum(tl.maximum(idx, 0), E - 1)   # NaN logits: stay in range (no stray weight reads)
        wv = tl.where(o_k == j, v, wv)
        iv = tl.where(o_k == j, idx, iv)
        key = tl.where(key == best, -1, key)
    return wv / tl.sum(wv, 0), iv


@triton.jit
def _route_topk_kernel(logits, w_out, id_out, E, stride_l, K: tl.constexpr, BE: tl.constexpr,
                       BK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    wv, iv = topk_of_row(logits + t * stride_l, E, K, BE, BK)
    o_k = tl.arange(0, BK)
    mk = o_k < K
    tl.store(w_out + t * K + o_k, wv.to(w_out.dtype.element_ty), mask=mk)
    tl.store(id_out + t * K + o_k, iv, mask=mk)


def route_topk(router_logits: torch.Tensor, top_k: int) -> MoeRouting:
    """See `ninfer.ops.reference.moe.route_topk`. router_logits [T, E] (rows may be strided) -> weights [T, k]
    in the logits' dtype, ids [T, k] int64, by decreasing probability."""
    T, E = router_logits.shape
    if not 0 < top_k <= E:
        raise ValueError(f"top_k must be in 1..{E}, got {top_k}")
    lg = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
    w = torch.empty(T, top_k, dtype=lg.dtype, device=lg.device)
    ids = torch.empty(T, top_k, dtype=torch.int64, device=lg.device)
    if T:
        BE = triton.next_power_of_2(E)
        _route_topk_kernel[(T,)](lg, w, ids, E, lg.stride(0), K=top_k, BE=BE,
                                 BK=triton.next_power_of_2(top_k), num_warps=1 if BE <= 1024 else 4, **pdl.launch())
    return MoeRouting(w, ids)

