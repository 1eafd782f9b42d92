"""Fast (CUDA, Triton) part of the sampler's cut: the k largest values of each row of a wide [B, V] fp32
matrix, for small k (`MAX_K`), in two launches and no sync.

The cut itself stays in torch: a one-program-per-row Triton form of it took the cut's host time from
~1.5 to 0.08 ms but used 0.25-0.56 ms of GPU time, and served tokens got slower (bench/NOTES.md, session 12).

torch.topk on one 248k-wide row runs as one block and took 64 us on the H200 (bench/NOTES.md, session 12),
longer than sorting the row. Here

    stage 1  grid (B, V / BLOCK): each program keeps its slice in registers and takes k rounds of
             (max, lowest index of it, mask that lane out): the slice's k largest values, descending
    stage 2  grid (B,): the same k rounds over the B rows' V / BLOCK * k stage-1 values

The values (not the ids) are the result: the multiset of a row's k largest values is the k largest of the
union of its slices' k largest (a value of the row's top k is in its slice's top k), ties included, so
`ninfer.ops.sampling._nucleus` gets the same values as from torch.topk.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["MAX_K", "topk_values"]

MAX_K = 64               # the largest k served here (k rounds per program); above it, torch.topk
BLOCK = 4096             # the slice of a row per stage-1 program


@triton.jit
def _rounds(v, lane, out, K: tl.constexpr):
    """k rounds of (max, mask out its first lane) over v (lane = arange over v); the maxima to out[0..K),
    descending."""
    for j in range(K):
        m = tl.max(v, 0)
        i = tl.argmax(v, 0)
        tl.store(out + j, m)
        v = tl.where(lane == i, float("-inf"), v)


@triton.jit
def _slice_topk_kernel(x, part, V, stride_x, NB, K: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    lane = tl.arange(0, BLOCK)
    offs = blk * BLOCK + lane
    v = tl.load(x + b * stride_x + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
    _rounds(v, lane, part + (b * NB + blk) * K, K)


@triton.jit
def _merge_topk_kernel(part, out, N, K: tl.constexpr, BN: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BN)
    v = tl.load(part + b * N + offs, mask=offs < N, other=float("-inf"))
    _rounds(v, offs, out + b * K, K)


def topk_values(x: torch.Tensor, k: int) -> torch.Tensor:
    """x [B, V] fp32 (rows may be strided, unit stride along V), 1 <= k <= min(MAX_K, V) -> [B, k] fp32,
    each row's k largest values in descending order (the values of torch.topk(x, k).values)."""
    B, V = x.shape
    if not 1 <= k <= min(MAX_K, V):
        raise ValueError(f"k must be in 1..{min(MAX_K, V)}, got {k}")
    if x.dtype != torch.float32 or x.stride(1) != 1:
        raise ValueError(f"x must be fp32 with unit stride along V, got {x.dtype}, strides {x.stride()}")
    nb = triton.cdiv(V, BLOCK)
    part = torch.empty(B, nb * k, dtype=torch.float32, device=x.device)
    out = torch.empty(B, k, dtype=torch.float32, device=x.device)
    if B:
        _slice_topk_kernel[(B, nb)](x, part, V, x.stride(0), nb, K=k, BLOCK=BLOCK, num_warps=8)
        _merge_topk_kernel[(B,)](part, out, nb * k, K=k, BN=triton.next_power_of_2(nb * k), num_warps=8)
    return out

