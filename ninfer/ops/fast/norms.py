"""Fast row norms (CUDA, Triton): one program per row, fp32 math, same casts as the reference.

    rms_norm         x [..., D], w [D] zero-centred   -> (x̂ · (1 + w)).to(x.dtype)
    gated_rms_norm   o, z [..., D], w [D] plain        -> (w · x̂.to(o.dtype)) · silu(z), cast to o.dtype
Same arguments and results as `ninfer.ops.norms` (the oracle).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.ops import norms as _ref

__all__ = ["rms_norm", "gated_rms_norm"]


@triton.jit
def _rms_norm_kernel(x, w, y, D, stride_x, eps, BD: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BD)
    m = o < D
    xv = tl.load(x + i * stride_x + o, mask=m, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(xv * xv, 0) / D + eps)
    wv = tl.load(w + o, mask=m, other=0.0).to(tl.float32)
    tl.store(y + i * D + o, (xv * r * (1.0 + wv)).to(y.dtype.element_ty), mask=m)


@triton.jit
def _gated_rms_norm_kernel(o_ptr, z_ptr, w, y, D, stride_o, stride_z, eps, BD: tl.constexpr,
                           ROUND_WN: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BD)
    m = c < D
    ov = tl.load(o_ptr + i * stride_o + c, mask=m, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(ov * ov, 0) / D + eps)
    n = (ov * r).to(y.dtype.element_ty).to(tl.float32)
    wn = tl.load(w + c, mask=m, other=0.0).to(tl.float32) * n
    if ROUND_WN:
        wn = wn.to(y.dtype.element_ty).to(tl.float32)
    zv = tl.load(z_ptr + i * stride_z + c, mask=m, other=0.0).to(tl.float32)
    out = wn * (zv / (1.0 + tl.exp(-zv)))
    tl.store(y + i * D + c, out.to(y.dtype.element_ty), mask=m)


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """See `ninfer.ops.norms.rms_norm`."""
    D = x.shape[-1]
    if x.numel() == 0 or D > 16384:
        return _ref.rms_norm(x, weight, eps)
    x2 = _rows(x)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    BD = triton.next_power_of_2(D)
    _rms_norm_kernel[(x2.shape[0],)](x2, weight.contiguous(), y, D, x2.stride(0), float(eps), BD=BD,
                                     num_warps=max(1, min(16, BD // 512)))
    return y.view(x.shape)


def gated_rms_norm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """See `ninfer.ops.norms.gated_rms_norm`."""
    D = o.shape[-1]
    if o.numel() == 0 or D > 16384 or z.shape != o.shape:
        return _ref.gated_rms_norm(o, z, weight, eps)
    o2, z2 = _rows(o), _rows(z)
    y = torch.empty(o2.shape, dtype=o.dtype, device=o.device)
    BD = triton.next_power_of_2(D)
    # NOTE: the reference multiplies w · n in the promoted dtype: rounded to o.dtype unless w is wider.
    round_wn = torch.promote_types(weight.dtype, o.dtype) == o.dtype and o.dtype != torch.float32
    _gated_rms_norm_kernel[(o2.shape[0],)](o2, z2, weight.contiguous(), y, D, o2.stride(0), z2.stride(0), float(eps),
                                           BD=BD, ROUND_WN=round_wn, num_warps=max(1, min(16, BD // 512)))
    return y.view(o.shape)
