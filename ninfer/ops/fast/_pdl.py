"""Programmatic dependent launch (PDL, Hopper+) for the decode-path Triton kernels, off by default.

With `NINFER_PDL=1` on a GPU of compute capability >= 9, each of these kernels is launched with
Triton's `launch_pdl` option and starts with `griddepcontrol.wait` (nothing is read or written
before the previous kernel of the stream has completed and its writes are visible) followed by
`griddepcontrol.launch_dependents` (the next kernel may be scheduled now). What overlaps is the
launch of kernel i+1 with the tail of kernel i: in a decode step of ~680 short kernels those gaps
were measured at ~3.5 us per small kernel (bench/NOTES.md, decode pass 3).

NOTE: not yet measured on the GPU (no device time was left when it was written); the kernels are
      unchanged while the switch is off (`PDL` is a constexpr: no instruction is emitted).
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

__all__ = ["enabled", "launch", "enter"]


@functools.cache
def enabled() -> bool:
    if os.environ.get("NINFER_PDL", "0") != "1" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability()[0] >= 9


def launch() -> dict:
    """Extra launch arguments of a PDL-aware kernel: {} (off) or PDL=True + launch_pdl=True."""
    return {"PDL": True, "launch_pdl": True} if enabled() else {}


@triton.jit
def enter(PDL: tl.constexpr):
    """First statement of a PDL-aware kernel: wait for the previous kernel, then let the next one launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
