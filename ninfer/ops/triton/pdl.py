"""Programmatic dependent launch (PDL, Hopper+) for the decode-path Triton kernels; on by default on a
GPU of compute capability >= 9 (`NINFER_PDL=0` turns it off).

With PDL on, each of these kernels is launched with
Triton's `launch_pdl` option and starts with `griddepcontrol.wait` (nothing is read or written
before the previous kernel of the stream has completed and its writes are visible) followed by
`griddepcontrol.launch_dependents` (the next kernel may be scheduled now). What overlaps is the
launch of kernel i+1 with the tail of kernel i, which matters in a decode step of several hundred
short kernels (docs/performance.md, "Decision log"). Graph == eager with and without it
(tests/gpu/test_cuda_graphs_gpu.py). A kernel may read, before `enter`, memory no
earlier kernel of the stream writes (weights: the GEMV loads its first weight block there), and memory
last written before its predecessor started (`load_input`: the GDN decode state step's entries and
states): every PDL kernel here waits before it lets the next one launch, and a
kernel that is not PDL-aware lets it launch only at its completion, so when a kernel starts, every
kernel before its predecessor has completed.
Correctness across kernels that are not PDL-aware (cuBLAS, torch): such a kernel is launched with
ordinary stream order (it starts after its predecessor completes), and a PDL kernel after it waits
for its completion in `griddepcontrol.wait`; every kernel completes only after its predecessor has, so
each one sees all earlier writes. The kernels are unchanged while the switch is off (`PDL` is a
constexpr: no instruction is emitted).
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

__all__ = ["enabled", "launch", "enter", "load_input"]


@functools.cache
def enabled() -> bool:
    if os.environ.get("NINFER_PDL", "1") == "0" or not torch.cuda.is_available():
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


@triton.jit
def load_input(ptrs, mask, other):
    """A load, issued before `enter`, of what an earlier kernel of the stream wrote: past L1 (.cg).

    Before `enter` a kernel may read what was written before its predecessor started: a PDL kernel
    is scheduled only once every program of its predecessor has passed that one's own wait (`enter`
    waits first, then lets the next kernel launch; a kernel that is not PDL-aware lets it launch at its
    completion), i.e. once everything before the predecessor has completed."""
    return tl.load(ptrs, mask=mask, other=other, cache_modifier=".cg")
