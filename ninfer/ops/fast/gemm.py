"""Prefill GEMM with the SwiGLU in its epilogue: act = silu(x @ w[:I].T) * (x @ w[I:].T) in one launch.

`gate_up_swiglu(x, w)` equals `silu_mul_halves(F.linear(x, w))` (the dense MLP's fused [gate | up]
GEMM, then the fast SwiGLU kernel): each product is rounded to x's dtype, silu of the rounded gate is
rounded, and the product with the rounded up is rounded, as the two separate launches round. Only
the summation order of the products differs from cuBLAS's (a rounding of the gate or up value may
then differ by one unit in the last place).

What it saves at a long prefill: the [M, 2I] product is never written nor read back. For the 27B
at 8192 tokens that is 570 MB written and read per layer, which the separate SwiGLU kernel spends
~0.2 ms a layer on (13 ms of a 706 ms 8k TTFT, bench/NOTES.md).

Each program computes one [BM, BN] tile of act from two accumulators (the gate columns n.. and the
up columns I + n..) over the same x tile, loaded through TMA descriptors (Hopper) with a software
pipeline of `stages` K steps. Programs are ordered GROUP_M row tiles at a time per column tile, so
a column tile's weights are read from L2 by the next row tiles.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

__all__ = ["GemmConfig", "GATE_UP_CONFIG", "gate_up_swiglu", "supported"]


class GemmConfig(NamedTuple):
    bm: int = 128
    bn: int = 128        # act columns per program (two accumulators: gate and up, 2 x bn weight rows)
    bk: int = 64
    group_m: int = 8
    warps: int = 8
    stages: int = 3


GATE_UP_CONFIG = GemmConfig()


@triton.jit
def _gate_up_swiglu_kernel(x_desc, g_desc, u_desc, y_desc, M, I, K,
                           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                           STAGES: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(I, BN)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows
    pid_n = (pid % per_group) // rows
    off_m = pid_m * BM
    off_n = pid_n * BN
    accg = tl.zeros([BM, BN], dtype=tl.float32)
    accu = tl.zeros([BM, BN], dtype=tl.float32)
    for k in tl.range(0, K, BK, num_stages=STAGES):
        a = x_desc.load([off_m, k])
        g = g_desc.load([off_n, k])
        u = u_desc.load([off_n, k])
        accg = tl.dot(a, g.T, accg)
        accu = tl.dot(a, u.T, accu)
    dt: tl.constexpr = y_desc.dtype
    gr = accg.to(dt).to(tl.float32)
    ur = accu.to(dt).to(tl.float32)
    act = (gr / (1.0 + tl.exp(-gr))).to(dt).to(tl.float32)
    y_desc.store([off_m, off_n], (act * ur).to(dt))


def supported(x: torch.Tensor, w: torch.Tensor) -> bool:
    """The layouts the kernel takes: CUDA (sm_90+) bf16/fp16 x [M, K] and w [2I, K], both with unit last
    stride and 16-byte aligned rows (TMA), I a multiple of 8."""
    if not (x.is_cuda and w.is_cuda and x.dtype == w.dtype and x.dtype in (torch.bfloat16, torch.float16)):
        return False
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1] or w.shape[0] % 16:
        return False
    if torch.cuda.get_device_capability(x.device)[0] < 9:
        return False
    es = x.element_size()
    return (x.stride(1) == 1 and w.stride(1) == 1 and (x.stride(0) * es) % 16 == 0 and (w.stride(0) * es) % 16 == 0
            and x.data_ptr() % 16 == 0 and w.data_ptr() % 16 == 0)


def gate_up_swiglu(x: torch.Tensor, w: torch.Tensor, config: GemmConfig | None = None) -> torch.Tensor:
    """x [M, K], w [2I, K] (gate rows, then up rows) -> silu(x @ w[:I].T) * (x @ w[I:].T) [M, I] in x.dtype.
    The caller checks `supported(x, w)`."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    c = config or GATE_UP_CONFIG
    M, K = x.shape
    I = w.shape[0] // 2
    y = torch.empty(M, I, dtype=x.dtype, device=x.device)
    if M == 0:
        return y
    xd = TensorDescriptor.from_tensor(x, [c.bm, c.bk])
    gd = TensorDescriptor.from_tensor(w[:I], [c.bn, c.bk])
    ud = TensorDescriptor.from_tensor(w[I:], [c.bn, c.bk])
    yd = TensorDescriptor.from_tensor(y, [c.bm, c.bn])
    grid = (triton.cdiv(M, c.bm) * triton.cdiv(I, c.bn),)
    _gate_up_swiglu_kernel[grid](xd, gd, ud, yd, M, I, K, BM=c.bm, BN=c.bn, BK=c.bk, GROUP_M=c.group_m,
                                 STAGES=c.stages, num_warps=c.warps)
    return y
