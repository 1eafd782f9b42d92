"""The vision tower's 2D rotary, in place on the packed qkv rows (one kernel for q and k).

Reference: `ninfer.targets.qwen3_6.program.vision` (`_rotate`): per head, in fp32,
    out = x * cos + rotate_half(x) * sin,  rotate_half([x1 | x2]) = [-x2 | x1]
and the result rounded to qkv's dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["vision_rope_"]


@triton.jit
def _vision_rope_kernel(qkv, cos, sin, stride_row, stride_cs, QK_HEADS: tl.constexpr, D: tl.constexpr,
                        HALF: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    j = tl.arange(0, BLOCK_J)[:, None]                    # q heads, then k heads
    d = tl.arange(0, BLOCK_D)[None, :]
    m = (j < QK_HEADS) & (d < HALF)
    base = qkv + row.to(tl.int64) * stride_row + j * D + d
    x1 = tl.load(base, mask=m, other=0.0).to(tl.float32)
    x2 = tl.load(base + HALF, mask=m, other=0.0).to(tl.float32)
    dm = d < HALF
    cs = row.to(tl.int64) * stride_cs + d
    c1 = tl.load(cos + cs, mask=dm, other=0.0)
    c2 = tl.load(cos + cs + HALF, mask=dm, other=0.0)
    s1 = tl.load(sin + cs, mask=dm, other=0.0)
    s2 = tl.load(sin + cs + HALF, mask=dm, other=0.0)
    tl.store(base, (x1 * c1 - x2 * s1).to(qkv.dtype.element_ty), mask=m)
    tl.store(base + HALF, (x2 * c2 + x1 * s2).to(qkv.dtype.element_ty), mask=m)


def vision_rope_(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the q and k heads of qkv in place; v untouched.

    Args:
        qkv: [N, 3, H, D] (rows may be strided; each row's [3, H, D] contiguous), q = [:, 0], k = [:, 1].
        cos, sin: [N, D] fp32 (rows contiguous).
    Returns qkv.
    """
    N, three, H, D = qkv.shape
    if three != 3 or D % 2 or cos.shape != (N, D) or sin.shape != (N, D):
        raise ValueError(f"vision_rope_: qkv {list(qkv.shape)}, cos {list(cos.shape)}, sin {list(sin.shape)}")
    if qkv.stride(3) != 1 or qkv.stride(2) != D or qkv.stride(1) != H * D:
        raise ValueError("vision_rope_: each qkv row must be a contiguous [3, H, D] block")
    if cos.stride(1) != 1 or sin.stride() != cos.stride() or cos.dtype != torch.float32 or sin.dtype != torch.float32:
        raise ValueError("vision_rope_: cos and sin must be fp32 with contiguous rows of equal stride")
    if N:
        _vision_rope_kernel[(N,)](qkv, cos, sin, qkv.stride(0), cos.stride(0), QK_HEADS=2 * H, D=D, HALF=D // 2,
                                  BLOCK_J=triton.next_power_of_2(2 * H), BLOCK_D=triton.next_power_of_2(D // 2))
    return qkv
