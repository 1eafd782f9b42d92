"""Fast (CUDA, Triton) parts of the sampler's top-k / top-p cut, no sync:

`topk_values(x, k)`: the k largest values of each row of a wide [B, V] fp32 matrix, for small k
(`MAX_K`), in two launches.
`cut_rows(x, vals, top_k, top_p)`: `ninfer.ops.sampling._nucleus` and the keep mask in one launch (one
program per row), instead of ~40 torch ops (each ~20-35 us of host time on the H200 machine).

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

__all__ = ["MAX_K", "topk_values", "cut_rows"]

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


@triton.jit
def _cut_kernel(x, vals, top_k, top_p, out, V, C, stride_x, stride_v, stride_o,
                BLOCK: tl.constexpr, BC: tl.constexpr):
    """One row per program: `ninfer.ops.sampling._nucleus` and the keep mask of `_truncate`, in passes
    over the row (normaliser and ties at the k-th; the candidates' mass; the count above the cut; the
    masked row with its ties ranked by id)."""
    b = tl.program_id(0).to(tl.int64)
    xr = x + b * stride_x
    vr = vals + b * stride_v
    k = tl.load(top_k + b)
    p = tl.load(top_p + b)
    has_k = (k > 0) & (k < V)
    kk = tl.minimum(tl.maximum(k, 1), C) - 1
    m = tl.load(vr)
    kth = tl.where(has_k, tl.load(vr + kk), float("-inf"))
    lane = tl.arange(0, BLOCK)
    z = 0.0
    n_tie = tl.full([], 0, tl.int64)
    for s in range(0, V, BLOCK):
        o = s + lane
        xv = tl.load(xr + o, mask=o < V, other=float("-inf"))
        z += tl.sum(tl.where(xv >= kth, tl.exp(xv - m), 0.0), 0)
        n_tie += tl.sum((xv == kth) & (o < V), 0).to(tl.int64)
    active = p < 1.0
    p_cut = tl.where(active, p, float("inf"))       # no top-p: no candidate is dropped
    cl = tl.arange(0, BC)
    carry = 0.0
    j = C
    for s in range(0, C, BC):
        o = s + cl
        vv = tl.load(vr + o, mask=o < C, other=float("-inf"))
        above = vv > kth
        sp = tl.where(above, tl.exp(vv - m), 0.0) / z
        before = carry + tl.cumsum(sp, 0) - sp
        drop = above & (before >= p_cut)
        j = tl.minimum(j, tl.min(tl.where(drop, o, C), 0))
        carry += tl.sum(sp, 0)
    found = j < C
    j = tl.maximum(j, 1)
    v_cut = tl.load(vr + tl.minimum(j, C) - 1)
    n_gt = tl.full([], 0, tl.int64)
    for s in range(0, C, BC):
        o = s + cl
        vv = tl.load(vr + o, mask=o < C, other=float("-inf"))
        n_gt += tl.sum(vv > v_cut, 0).to(tl.int64)
    p_k = tl.exp(kth - m) / z
    r = tl.maximum(tl.math.ceil((p - carry) / p_k), 0.0)
    n_tie_kept = tl.where(active, tl.minimum(r, n_tie.to(tl.float32)).to(tl.int64), n_tie)
    v = tl.where(found, v_cut, kth)
    n = tl.where(found, j - n_gt, tl.where(has_k, n_tie_kept, V))
    seen = tl.full([], 0, tl.int64)
    orow = out + b * stride_o
    for s in range(0, V, BLOCK):
        o = s + lane
        mo = o < V
        xv = tl.load(xr + o, mask=mo, other=float("-inf"))
        tie = (xv == v) & mo
        rank = seen + tl.cumsum(tie.to(tl.int64), 0)
        keep = (xv > v) | (tie & (rank <= n))
        tl.store(orow + o, tl.where(keep, xv, float("-inf")), mask=mo)
        seen += tl.sum(tie.to(tl.int64), 0)


def cut_rows(x: torch.Tensor, vals: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """`ninfer.ops.sampling._nucleus` and its keep mask in one launch: x [B, V] fp32 -> x with the tokens the
    top-k / top-p cut removes at -inf (a new tensor). vals [B, C] fp32: each row's C largest values,
    descending (the top-k candidates or the sorted row); top_k [B] int64, top_p [B] fp32."""
    B, V = x.shape
    if x.dtype != torch.float32 or vals.dtype != torch.float32 or x.stride(1) != 1 or vals.stride(1) != 1:
        raise ValueError("x and vals must be fp32 with unit stride along the row")
    C = vals.shape[1]
    out = torch.empty_like(x)
    if B:
        _cut_kernel[(B,)](x, vals, top_k, top_p, out, V, C, x.stride(0), vals.stride(0), out.stride(0),
                          BLOCK=4096, BC=min(1024, triton.next_power_of_2(C)), num_warps=8)
    return out
