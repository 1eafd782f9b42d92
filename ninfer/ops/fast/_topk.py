"""The MoE routing's top-k of one row of router logits, in registers (a Triton device function shared by
the routing kernels of `ninfer.ops.fast.moe` and the router epilogue of `ninfer.ops.fast.gemv`)."""
from __future__ import annotations

import triton
import triton.language as tl

from ninfer.ops.fast import _pdl

__all__ = ["_topk_of_row"]


@triton.jit
def _topk_of_row(row, E, K: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr, CG: tl.constexpr = False):
    """Top-K of one row of E router logits: (renormalised weights [BK] fp32, ids [BK] int64), slots >= K
    hold 0. fp32 softmax over all E; by decreasing probability, the lowest id wins a tie. CG: the row
    is read past L1 (other programs of the same launch wrote it)."""
    o_e = tl.arange(0, BE)
    me = o_e < E
    lg = _pdl.load_input(row + o_e, me, float("-inf"), CG).to(tl.float32)
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
