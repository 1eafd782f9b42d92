"""L2 prefetch of a weight's leading columns ahead of the kernel that reads it (decode, sm_90+).

A decode step is a chain of kernels in which HBM idles during the small ones (the GDN state step,
the gated norm, paged attention) between weight streams. `prefetch_rows(w, rows)` launches one small
kernel whose threads each issue one `cp.async.bulk.prefetch.L2` of a row's first C columns (the
K range every GEMV program reads first: program n streams rows n*BN.. in K order), C chosen so
that the prefetch is at most `BUDGET_BYTES` in all. The instruction is a hint: it moves bytes into
L2 and returns at once; nothing is read into registers and no result depends on it.

PDL (see `_pdl`): the prefetches are issued before `griddepcontrol.wait` (weights are never
written by a kernel), then the next kernel may launch and the kernel waits for its predecessor to
complete, so it completes only after that predecessor does: the kernel after it still sees every
earlier write (ordering is transitive). Issued while the previous kernel's last programs run, the
bytes arrive during its tail and the small kernels after it.

The op does nothing (returns None) when the tensor is not on a CUDA device of compute capability
>= 9, when there are more than `MAX_ROWS` token rows (prefill: the GEMMs are compute bound), or when
`BUDGET_BYTES` is 0 (`NINFER_L2_PREFETCH_MB=0`).
"""
from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ninfer.ops.fast import _pdl

__all__ = ["prefetch_rows", "BUDGET_BYTES", "MAX_ROWS", "supported", "issue"]

MAX_ROWS = 8                      # token rows up to which the op prefetches (decode batches)
BUDGET_BYTES = int(float(os.environ.get("NINFER_L2_PREFETCH_MB", "0")) * (1 << 20))
_LANES = 32                       # one warp per program, one weight row per thread


@functools.cache
def supported(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


@triton.jit
def issue(addr, nbytes, on):
    """One `cp.async.bulk.prefetch.L2.global` per element where `on` (addr int64, 16-byte aligned;
    nbytes int32, a multiple of 16). Returns a dummy int32 (the asm has no result)."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.s32 p, $3, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r,r", [addr, nbytes, on.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_rows_kernel(base, stride_bytes, nbytes, n_rows, LANES: tl.constexpr, PDL: tl.constexpr = False):
    r = tl.program_id(0) * LANES + tl.arange(0, LANES)
    issue(base + r.to(tl.int64) * stride_bytes, tl.full([LANES], nbytes, tl.int32), r < n_rows)
    if PDL:
        gdc_launch_dependents()
        gdc_wait()


def prefetch_rows(w: torch.Tensor, rows: int = 1) -> None:
    """Prefetch into L2 the first C columns of every row of the 2-D weight w (unit last stride), C the
    largest multiple of 16 bytes with C * w.shape[0] <= BUDGET_BYTES (whole rows when they fit), before
    a decode GEMV of `rows` token rows reads w. A hint with no effect on results (see the module)."""
    if (BUDGET_BYTES <= 0 or rows > MAX_ROWS or not w.is_cuda or w.dim() != 2 or w.stride(1) != 1
            or not supported(w.device.index or 0)):
        return None
    n, row_bytes = w.shape[0], w.shape[1] * w.element_size()
    c = min(row_bytes, BUDGET_BYTES // max(1, n)) // 16 * 16
    stride = w.stride(0) * w.element_size()
    if c == 0 or w.data_ptr() % 16 or stride % 16:
        return None
    _prefetch_rows_kernel[(triton.cdiv(n, _LANES),)](w.data_ptr(), stride, c, n, LANES=_LANES, num_warps=1,
                                                     **_pdl.launch())
    return None
