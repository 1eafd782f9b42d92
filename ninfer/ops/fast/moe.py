"""Fast routed experts for decode-sized batches (CUDA, Triton): no host sync, no loop over experts.

`moe_experts(x, routing, gate_up, down)` has the reference's signature and result
(`ninfer.ops.moe.moe_experts`). For T*k <= `MAX_PAIRS` (token, expert) pairs it runs two
grouped GEMV launches over the selected experts, reading each selected expert's weights
through its id (ids stay on the GPU, so the step is CUDA-graph capturable):

    h[p]   = gate_up[e_p] @ x[t_p]                      [P, 2I] fp32     grid (P, 2I / BN)
    y[p]   = down[e_p] @ (silu(h[p, :I]) * h[p, I:])    [P, H]  fp32     grid (P, H / BN)
    out[t] = Σ_j w[t, j] · y[t·k + j]                   in fp32, cast to x.dtype once

Larger batches (prefill) fall back to the reference (a grouped GEMM over tokens sorted by expert
is the missing piece). Accumulation is fp32 throughout, so the result differs from the
reference's bf16 accumulation order by rounding only.
In the fast op set (`OpSet.moe_experts`), so the MoE leaf uses it on CUDA; decode with
T * k <= MAX_PAIRS is then free of host syncs and runs inside the decode CUDA graphs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.ops import moe as _ref
from ninfer.ops.moe import MoeRouting

__all__ = ["moe_experts", "MAX_PAIRS"]

MAX_PAIRS = 128


@triton.jit
def _expert_gemv_kernel(x, ids, w, out, N, Kdim, stride_x, stride_we, TOPK: tl.constexpr,
                        SWIGLU_IN: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """out[p, n] = Σ_k w[ids[p], n, k] · in[p, k]; in = x[p // TOPK] (plain) or silu(x[p, :K]) * x[p, K:2K]."""
    p = tl.program_id(0)
    i_n = tl.program_id(1)
    e = tl.load(ids + p).to(tl.int64)
    o_n = i_n * BN + tl.arange(0, BN)
    mn = o_n < N
    acc = tl.zeros([BN], dtype=tl.float32)
    if SWIGLU_IN:
        row = x + p.to(tl.int64) * stride_x
    else:
        row = x + (p // TOPK).to(tl.int64) * stride_x
    for k0 in range(0, Kdim, BK):
        o_k = k0 + tl.arange(0, BK)
        mk = o_k < Kdim
        if SWIGLU_IN:
            gt = tl.load(row + o_k, mask=mk, other=0.0).to(tl.float32)
            up = tl.load(row + Kdim + o_k, mask=mk, other=0.0).to(tl.float32)
            xin = gt / (1.0 + tl.exp(-gt)) * up
        else:
            xin = tl.load(row + o_k, mask=mk, other=0.0).to(tl.float32)
        wt = tl.load(w + e * stride_we + o_n[:, None] * Kdim + o_k[None, :], mask=mn[:, None] & mk[None, :],
                     other=0.0).to(tl.float32)
        acc += tl.sum(wt * xin[None, :], 1)
    tl.store(out + p.to(tl.int64) * N + o_n, acc, mask=mn)


def moe_experts(x: torch.Tensor, routing: MoeRouting, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """See `ninfer.ops.moe.moe_experts`. x [T, H]; routing ids/weights [T, k]; gate_up [E, 2I, H]; down [E, H, I]."""
    T, H = x.shape
    k = routing.ids.shape[1]
    P = T * k
    if P > MAX_PAIRS or P == 0 or not (gate_up.is_contiguous() and down.is_contiguous()):
        return _ref.moe_experts(x, routing, gate_up, down)
    I2 = gate_up.shape[1]
    ids = routing.ids.reshape(P)
    xc = x if x.stride(1) == 1 else x.contiguous()
    h = torch.empty(P, I2, dtype=torch.float32, device=x.device)
    BN, BK = 32, 128
    _expert_gemv_kernel[(P, triton.cdiv(I2, BN))](
        xc, ids, gate_up, h, I2, H, xc.stride(0), gate_up.stride(0), TOPK=k, SWIGLU_IN=False, BN=BN, BK=BK,
        num_warps=4)
    y = torch.empty(P, H, dtype=torch.float32, device=x.device)
    _expert_gemv_kernel[(P, triton.cdiv(H, BN))](
        h, ids, down, y, H, I2 // 2, h.stride(0), down.stride(0), TOPK=k, SWIGLU_IN=True, BN=BN, BK=BK,
        num_warps=4)
    out = (y.view(T, k, H) * routing.weights.float().unsqueeze(-1)).sum(1)
    return out.to(x.dtype)
