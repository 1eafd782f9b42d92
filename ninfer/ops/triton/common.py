"""Helpers the fast kernel modules share.

`device_index`: index tensors used as given when they are already integer tensors on the kernel's
device (the kernels load int32 or int64 alike), converted otherwise; a `.to(torch.int32)` per op and
layer would be one copy kernel each.
`fround`: inside a kernel, round fp32 to a dtype and back (what a separate op in that dtype stores).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["device_index", "fround"]


def device_index(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if t.device == device and t.dtype in (torch.int32, torch.int64):
        return t
    return t.to(device=device, dtype=torch.int64)


@triton.jit
def fround(x, dtype: tl.constexpr):
    """Round fp32 x to `dtype` and back (what a separate op in that dtype would store)."""
    return x.to(dtype).to(tl.float32)
