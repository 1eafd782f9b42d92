"""Fast row norms (CUDA, Triton): one program per row (gated: a block of rows), fp32 math, same casts as the reference.

    rms_norm         x [..., D], w [D] zero-centred   -> (x̂ · (1 + w)).to(x.dtype)
    gated_rms_norm   o, z [..., D], w [D] plain        -> (w · x̂.to(o.dtype)) · silu(z), cast to o.dtype
Same arguments and results as `ninfer.ops.reference.norms` (the oracle).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.ops.reference import norms as _ref
from ninfer.ops.triton import pdl

__all__ = ["rms_norm", "gated_rms_norm"]


@triton.jit
def _rms_norm_kernel(x, w, y, D, stride_x, eps, BD: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    i = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BD)
    m = o < D
    xv = tl.load(x + i * stride_x + o, mask=m, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(xv * xv, 0) / D + eps)
    wv = tl.load(w + o, mask=m, other=0.0).to(tl.float32)
    tl.store(y + i * D + o, (xv * r * (1.0 + wv)).to(y.dtype.element_ty), mask=m)


@triton.jit
def _gated_rms_norm_kernel(o_ptr, z_ptr, w, y, R, H, D, so0, so1, sz0, sz1, eps, BR: tl.constexpr,
                           BD: tl.constexpr, ROUND_WN: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    # NOTE: BR rows (one head each) per program; row r is head r % H of token r // H.
    r = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
    n = (r // H)[:, None]
    h = (r % H)[:, None]
    c = tl.arange(0, BD)[None, :]
    m = (r < R)[:, None] & (c < D)
    ov = tl.load(o_ptr + n * so0 + h * so1 + c, mask=m, other=0.0).to(tl.float32)
    rs = tl.rsqrt(tl.sum(ov * ov, 1) / D + eps)[:, None]
    nv = (ov * rs).to(y.dtype.element_ty).to(tl.float32)
    wn = tl.load(w + c, mask=c < D, other=0.0).to(tl.float32) * nv
    if ROUND_WN:
        wn = wn.to(y.dtype.element_ty).to(tl.float32)
    zv = tl.load(z_ptr + n * sz0 + h * sz1 + c, mask=m, other=0.0).to(tl.float32)
    out = wn * (zv / (1.0 + tl.exp(-zv)))
    tl.store(y + r[:, None] * D + c, out.to(y.dtype.element_ty), mask=m)


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """See `ninfer.ops.reference.norms.rms_norm`."""
    D = x.shape[-1]
    if x.numel() == 0 or D > 16384:
        return _ref.rms_norm(x, weight, eps)
    x2 = _rows(x)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    BD = triton.next_power_of_2(D)
    _rms_norm_kernel[(x2.shape[0],)](x2, weight.contiguous(), y, D, x2.stride(0), float(eps), BD=BD,
                                     num_warps=max(1, min(16, BD // 512)), **pdl.launch())
    return y.view(x.shape)


def _heads(x: torch.Tensor) -> torch.Tensor:
    """[..., D] -> [N, H, D] with unit last stride (a view for [N, H, D] strided heads, e.g. z)."""
    if x.dim() == 3 and x.stride(-1) == 1:
        return x
    return _rows(x).unsqueeze(1)


def gated_rms_norm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """See `ninfer.ops.reference.norms.gated_rms_norm`. o, z [..., D] ([N, H, D] head views at any row/head
    stride are read in place); several rows per program at large row counts."""
    D = o.shape[-1]
    if o.numel() == 0 or D > 16384 or z.shape != o.shape:
        return _ref.gated_rms_norm(o, z, weight, eps)
    o3, z3 = _heads(o), _heads(z)
    N, H = o3.shape[:2]
    R = N * H
    y = torch.empty((R, D), dtype=o.dtype, device=o.device)
    BD = triton.next_power_of_2(D)
    # NOTE: one row per program up to ~1k rows (decode keeps its parallelism); past that, rows
    #       are packed up to 4k elements per program (prefill: 393k rows of 128 at 8192 x 48 heads).
    BR = max(1, min(4096 // BD, triton.next_power_of_2(triton.cdiv(R, 1024))))
    # NOTE: the reference multiplies w · n in the promoted dtype: rounded to o.dtype unless w is wider.
    round_wn = torch.promote_types(weight.dtype, o.dtype) == o.dtype and o.dtype != torch.float32
    _gated_rms_norm_kernel[(triton.cdiv(R, BR),)](
        o3, z3, weight.contiguous(), y, R, H, D, o3.stride(0), o3.stride(1), z3.stride(0), z3.stride(1),
        float(eps), BR=BR, BD=BD, ROUND_WN=round_wn, num_warps=max(1, min(16, BR * BD // 512)), **pdl.launch())
    return y.view(o.shape)
