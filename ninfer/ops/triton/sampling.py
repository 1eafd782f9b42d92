"""Fast (CUDA, Triton) sampler: `sample` is `ninfer.ops.reference.sampling.sample` with steps 6-9 in the
kernels below (`fused_draw`) whenever every row with a top-k cut has top_k <= CANDIDATES (otherwise the
torch draw); no host sync:

`topk_values(x, k)`: the k largest values of each row of a wide [B, V] fp32 matrix, for small k (`MAX_K`),
in two launches.

`nucleus(x, vals, top_k, top_p)`: where steps 6-7 cut each row, (v, n) as `ninfer.ops.reference.sampling._nucleus`
returns them, from the row's candidates vals [B, C] (C <= MAX_CANDIDATES): one launch over slices of the
rows (the top-k normaliser and the count of ties at the k-th value, per slice) and one program per row
for the rest (the cumulative mass over the C candidates and the cut rule, in registers).

`top_p_cut(x, m, top_k, top_p, v, n)`: the same (v, n) for the rows that cut by top-p without a top-k cut,
whose kept prefix can reach far past any candidates, from the whole row without sorting it: PASSES launches
each fix 4 more bits of the cut value's order-preserving key from the masses of the 16 buckets of the
prefix fixed so far (summed per slice), then one program per row turns the key into v and n.

`race(x, noise, v, n, m, min_p)`: the draw over the kept tokens of (v, n): the first token of the largest
exp(x - m) / noise (m = each row's largest value), which orders the row as p / noise does (p =
softmax of the kept tokens: the normaliser is one per row); removed tokens never win. One launch over
slices (each slice's best kept token above v, its ties at v and their best), one program per row that
counts the ties at v in id order across the slices (the first n are kept) and rescans the one slice
where that count crosses n. So the cut row, its softmax and the race over [B, V] are never materialised.

These kernels spread the row over slices: a one-program-per-row form of the cut takes too much GPU time
(docs/performance.md, "Decision log"). torch.topk on one vocabulary-wide row runs as one block, longer
than sorting the row. Here

    stage 1  grid (B, V / BLOCK): each program keeps its slice in registers and takes k rounds of
             (max, lowest index of it, mask that lane out): the slice's k largest values, descending
    stage 2  grid (B,): the same k rounds over the B rows' V / BLOCK * k stage-1 values

The values (not the ids) are the result: the multiset of a row's k largest values is the k largest of the
union of its slices' k largest (a value of the row's top k is in its slice's top k), ties included, so
`ninfer.ops.reference.sampling._nucleus` gets the same values as from torch.topk.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ninfer.ops.reference import sampling as _ref
from ninfer.ops.reference.sampling import CANDIDATES, SampleResult, SamplingTensors

__all__ = ["MAX_K", "MAX_CANDIDATES", "topk_values", "nucleus", "top_p_cut", "race", "fused_draw", "sample",
           "apply_token_bitmask_"]

MAX_K = 64               # the largest k served here (k rounds per program); above it, torch.topk
BLOCK = 4096             # the slice of a row per stage-1 program (and per nucleus / race slice program)
MAX_CANDIDATES = 1024    # the widest candidate row `nucleus` holds in registers (>= ninfer.ops.reference.sampling.CANDIDATES)


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



# ------------------------------------------------------------------------------------------------
# the cut (steps 6-7) from the candidates
# ------------------------------------------------------------------------------------------------
@triton.jit
def _kth(vals, top_k, b, C, V, stride_v):
    """The row's k-th largest value (-inf without a top-k cut: k = 0 or k >= V) and its largest."""
    k = tl.load(top_k + b)
    has_k = (k > 0) & (k < V)
    kv = tl.load(vals + b * stride_v + tl.minimum(tl.maximum(k, 1), C) - 1)
    return tl.where(has_k, kv, float("-inf")), tl.load(vals + b * stride_v), has_k


@triton.jit
def _slice_stats_kernel(x, vals, top_k, zpart, tpart, C, V, stride_x, stride_v, NS, BLOCK: tl.constexpr):
    """Per (row, slice): Σ exp(x - m) over x >= kth (the top-k normaliser's part) and the count of x == kth."""
    b = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    offs = s * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + b * stride_x + offs, mask=offs < V, other=float("-inf"))
    k, mm, _ = _kth(vals, top_k, b, C, V, stride_v)
    inb = offs < V
    z = tl.sum(tl.where(inb & (v >= k), tl.exp(v - mm), 0.0), 0)
    t = tl.sum(tl.where(inb & (v == k), 1, 0), 0)
    tl.store(zpart + b * NS + s, z)
    tl.store(tpart + b * NS + s, t)


@triton.jit
def _at(vals, o, i):
    """vals[i] of a register row (o = its lanes)."""
    return tl.max(tl.where(o == i, vals, float("-inf")), 0)


@triton.jit
def _nucleus_kernel(vals, zpart, tpart, top_k, top_p, v_out, n_out, C, V, stride_v, NS,
                    BC: tl.constexpr, BS: tl.constexpr):
    """`ninfer.ops.reference.sampling._nucleus` for one row, from its C candidates and the slices' parts."""
    b = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BC)
    mc = o < C
    vr = tl.load(vals + b * stride_v + o, mask=mc, other=float("-inf"))
    kth, m, has_k = _kth(vals, top_k, b, C, V, stride_v)
    p = tl.load(top_p + b)
    os_ = tl.arange(0, BS)
    ms = os_ < NS
    z = tl.sum(tl.load(zpart + b * NS + os_, mask=ms, other=0.0), 0)
    n_tie = tl.sum(tl.load(tpart + b * NS + os_, mask=ms, other=0), 0).to(tl.int64)
    above = mc & (vr > kth)
    # NOTE: IEEE divisions (div_rn; Triton's `/` is approximate on the GPU), as torch divides. z is
    #       broadcast through the (finite) numerators: 0 * vr would be NaN on the -inf lanes past C.
    num = tl.where(above, tl.exp(vr - m), 0.0)
    sp = tl.math.div_rn(num, z + 0.0 * num)
    before = tl.cumsum(sp, 0) - sp
    active = p < 1.0
    # NOTE: the top-p test as a vector (before >= p, and p < 1 broadcast): a scalar bool in `&` with a vector
    #       one fails in Triton's interpreter
    drop = above & (before >= p) & ((sp * 0.0 + p) < 1.0)
    found = tl.max(drop.to(tl.int32), 0) > 0
    j = tl.maximum(tl.min(tl.where(drop, o, BC), 0), 1)
    v_cut = _at(vr, o, j - 1)
    n_cut = (j - tl.sum((mc & (vr > v_cut)).to(tl.int32), 0)).to(tl.int64)
    p_k = tl.math.div_rn(tl.exp(kth - m), z)
    r = tl.maximum(tl.ceil(tl.math.div_rn(p - tl.sum(sp, 0), p_k)), 0.0)
    kept_ties = tl.minimum(r, n_tie.to(tl.float32)).to(tl.int64)
    n_tie_kept = tl.where(active, kept_ties, n_tie)
    tl.store(v_out + b, tl.where(found, v_cut, kth))
    tl.store(n_out + b, tl.where(found, n_cut, tl.where(has_k, n_tie_kept, V.to(tl.int64))))


def nucleus(x: torch.Tensor, vals: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """`ninfer.ops.reference.sampling._nucleus` (same arguments: x [B, V] fp32, vals [B, C] each row's C largest
    values descending, C <= MAX_CANDIDATES, top_k [B] int64, top_p [B] fp32) -> (v [B] fp32, n [B] int64).
    Two launches. The normaliser is summed over slices (torch sums the row in another order): a token whose
    mass before it lies within fp32 rounding of top_p may fall on the other side of the cut."""
    B, V = x.shape
    C = vals.shape[1]
    if not 1 <= C <= MAX_CANDIDATES or vals.shape[0] != B:
        raise ValueError(f"vals must be [{B}, 1..{MAX_CANDIDATES}], got {tuple(vals.shape)}")
    if x.dtype != torch.float32 or x.stride(1) != 1 or vals.dtype != torch.float32 or vals.stride(1) != 1:
        raise ValueError("x and vals must be fp32 with unit stride along the row")
    ns = triton.cdiv(V, BLOCK)
    dev = x.device
    top_k, top_p = top_k.contiguous(), top_p.contiguous()
    zpart = torch.empty(B, ns, dtype=torch.float32, device=dev)
    tpart = torch.empty(B, ns, dtype=torch.int32, device=dev)
    v = torch.empty(B, dtype=torch.float32, device=dev)
    n = torch.empty(B, dtype=torch.int64, device=dev)
    if B:
        _slice_stats_kernel[(B, ns)](x, vals, top_k, zpart, tpart, C, V, x.stride(0), vals.stride(0), ns, BLOCK=BLOCK,
                                     num_warps=8)
        _nucleus_kernel[(B,)](vals, zpart, tpart, top_k, top_p, v, n, C, V, vals.stride(0), ns,
                              BC=triton.next_power_of_2(C), BS=triton.next_power_of_2(ns), num_warps=4)
    return v, n


# ------------------------------------------------------------------------------------------------
# the top-p cut over the whole row (rows without a top-k cut): a radix descent over the values' keys
# ------------------------------------------------------------------------------------------------
PASSES = 8               # 4-bit digits (16 buckets per pass) of a 32-bit key
MASS_BLOCK = 2048        # the slice of a row per `top_p_cut` program (122 programs per 248k row)


@triton.jit
def _key(xv):
    """The order-preserving 32-bit key of fp32 values (as int64; -0.0 is canonicalised to +0.0 by the caller)."""
    u = xv.to(tl.int32, bitcast=True)
    return tl.where(u >= 0, u.to(tl.int64) + 2147483648, (~u).to(tl.int64))


@triton.jit
def _unkey(key):
    """The fp32 value of a key of `_key`."""
    u = tl.where(key >= 2147483648, key - 2147483648, ~key).to(tl.int32)
    return u.to(tl.float32, bitcast=True)


@triton.jit
def _active(top_k, top_p, b, V):
    """Whether row b cuts by top-p without a top-k cut (the rows `top_p_cut` decides)."""
    k = tl.load(top_k + b)
    return ((k <= 0) | (k >= V)) & (tl.load(top_p + b) < 1.0)


@triton.jit
def _step(hpart, b, j, NS, P, A, T, PASSES: tl.constexpr, BS: tl.constexpr):
    """Digit j of row b's cut from pass j's bucket masses (summed over the slices): the largest digit whose
    bucket is not empty and with which the mass reaches T (A + Σ buckets >= digit), or, where rounding
    leaves none, the lowest non-empty one (the cut then keeps the whole range, as `_nucleus` keeps the
    row when its mass never reaches top_p). Returns the prefix and the mass above its range."""
    os_ = tl.arange(0, BS)
    od = tl.arange(0, 16)
    hp = hpart + ((b * PASSES + j) * NS + os_[:, None]) * 16 + od[None, :]
    h = tl.sum(tl.load(hp, mask=(os_ < NS)[:, None], other=0.0), 0)
    S = tl.cumsum(h, 0, reverse=True)                            # S[d] = mass of the digits >= d
    full = h > 0
    reach = full & (A + S >= T)
    d = tl.where(tl.max(reach.to(tl.int32), 0) > 0, tl.max(tl.where(reach, od, -1), 0),
                 tl.min(tl.where(full, od, 15), 0))
    return P * 16 + d, A + tl.sum(tl.where(od == d + 1, S, 0.0), 0)


@triton.jit
def _mass_slice_kernel(x, m, top_k, top_p, hpart, zpart, state_p, state_a, V, stride_x, stride_m, NS, npass,
                       FIRST: tl.constexpr, PASSES: tl.constexpr, BLOCK: tl.constexpr, SUB: tl.constexpr,
                       BS: tl.constexpr):
    """Pass `npass` over one (row, slice): the masses Σ exp(x - m) of the slice's values whose key matches
    the prefix of the first npass digits, per value of the next digit (the first pass, npass == 0: also the
    slice's part of z). Digit npass - 1 is taken here from the previous pass's masses (`_step`), by every
    program of the launch alike, and program 0 stores the prefix, its mass above and (on the second pass,
    npass == 1) the target mass T = p·z in
    state [B, PASSES + 1] for the passes after it; each launch thus waits on one load of parts, not on a
    chain of them. FIRST: npass == 0."""
    b = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    if _active(top_k, top_p, b, V):
        P = b * 0
        if not FIRST:
            sp = state_p + b * (PASSES + 1)
            sa = state_a + b * (PASSES + 1)
            if npass == 1:
                os_ = tl.arange(0, BS)
                T = tl.load(top_p + b) * tl.sum(tl.load(zpart + b * NS + os_, mask=os_ < NS, other=0.0), 0)
                A = T * 0.0
            else:
                T = tl.load(sa + PASSES)
                A = tl.load(sa + npass - 1)
                P = tl.load(sp + npass - 1)
            P, A = _step(hpart, b, npass - 1, NS, P, A, T, PASSES, BS)
            if s == 0:
                tl.store(sp + npass, P)
                tl.store(sa + npass, A)
                if npass == 1:
                    tl.store(sa + PASSES, T)
        mm = tl.load(m + b * stride_m)
        shift = 28 - 4 * npass
        od = tl.arange(0, 16)
        hist = tl.zeros([16], dtype=tl.float32)
        z = 0.0
        for c in tl.static_range(0, BLOCK, SUB):
            offs = s * BLOCK + c + tl.arange(0, SUB)
            inb = offs < V
            xv = tl.load(x + b * stride_x + offs, mask=inb, other=float("-inf")) + 0.0
            key = _key(xv)
            e = tl.exp(xv - mm)
            match = inb & ((key >> (shift + 4)) == P)
            # NOTE: past the first passes most chunks hold no key of the prefix: their buckets are skipped
            if tl.max(match.to(tl.int32), 0) > 0:
                dig = ((key >> shift) & 15).to(tl.int32)
                hist += tl.sum(tl.where(match[:, None] & (dig[:, None] == od[None, :]), e[:, None], 0.0), 0)
            if FIRST:
                z += tl.sum(tl.where(inb, e, 0.0), 0)
        tl.store(hpart + ((b * PASSES + npass) * NS + s) * 16 + od, hist)
        if FIRST:
            tl.store(zpart + b * NS + s, z)


@triton.jit
def _mass_cut_kernel(m, top_k, top_p, hpart, state_p, state_a, v_out, n_out, V, stride_m, NS,
                     PASSES: tl.constexpr, BS: tl.constexpr):
    """The cut of row b from its last digit: v = the value of the key, n = the ties at v that the mass
    still needs (at least 1), or every tie when v's probability underflows."""
    b = tl.program_id(0).to(tl.int64)
    if _active(top_k, top_p, b, V):
        sa = state_a + b * (PASSES + 1)
        T = tl.load(sa + PASSES)
        P, A = _step(hpart, b, PASSES - 1, NS, tl.load(state_p + b * (PASSES + 1) + PASSES - 1),
                     tl.load(sa + PASSES - 1), T, PASSES, BS)
        v = _unkey(P)
        e_v = tl.exp(v - tl.load(m + b * stride_m))
        r = tl.maximum(tl.ceil(tl.math.div_rn(T - A, tl.where(e_v > 0, e_v, 1.0))), 1.0)
        tl.store(v_out + b, v)
        tl.store(n_out + b, tl.where(e_v > 0, tl.minimum(r, V * 1.0).to(tl.int64), V.to(tl.int64)))


def top_p_cut(x: torch.Tensor, m: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, v: torch.Tensor,
              n: torch.Tensor) -> None:
    """The top-p cut of the rows of x [B, V] fp32 that have no top-k cut (top_k <= 0 or >= V) and top_p < 1,
    as `ninfer.ops.reference.sampling._nucleus` makes it from the sorted row, written into those rows of v [B] fp32 and
    n [B] int64 (other rows are left as they are: e.g. `nucleus`'s). m [B] (may be strided): each row's
    largest value. The kept tokens are then those > v and the n lowest-id ones == v. No sort: PASSES
    launches over MASS_BLOCK-wide slices each fix 4 more bits of the cut value's key from the masses
    of the 16 buckets of the prefix fixed so far, one more the cut. The masses are summed in another order
    than torch's cumulative sum: a token whose mass before it lies within fp32 rounding of top_p may fall
    on the other side of the cut."""
    B, V = x.shape
    if x.dtype != torch.float32 or x.stride(1) != 1:
        raise ValueError(f"x must be fp32 with unit stride along V, got {x.dtype}, strides {x.stride()}")
    if v.shape != (B,) or n.shape != (B,) or v.dtype != torch.float32 or n.dtype != torch.int64:
        raise ValueError(f"v and n must be [{B}] fp32 and int64")
    ns = triton.cdiv(V, MASS_BLOCK)
    dev = x.device
    top_k, top_p = top_k.contiguous(), top_p.contiguous()
    hpart = torch.empty(B, PASSES, ns, 16, dtype=torch.float32, device=dev)
    zpart = torch.empty(B, ns, dtype=torch.float32, device=dev)
    state_p = torch.empty(B, PASSES + 1, dtype=torch.int64, device=dev)
    state_a = torch.empty(B, PASSES + 1, dtype=torch.float32, device=dev)
    bs = triton.next_power_of_2(ns)
    if B:
        for i in range(PASSES):
            _mass_slice_kernel[(B, ns)](x, m, top_k, top_p, hpart, zpart, state_p, state_a, V, x.stride(0),
                                        m.stride(0), ns, i, FIRST=i == 0, PASSES=PASSES, BLOCK=MASS_BLOCK,
                                        SUB=min(MASS_BLOCK, 512), BS=bs, num_warps=8)
        _mass_cut_kernel[(B,)](m, top_k, top_p, hpart, state_p, state_a, v, n, V, m.stride(0), ns, PASSES=PASSES,
                               BS=bs, num_warps=8)


# ------------------------------------------------------------------------------------------------
# the race (step 9) over the kept tokens
# ------------------------------------------------------------------------------------------------
@triton.jit
def _score(xv, u, mm, min_p, b, HAS_MIN_P: tl.constexpr):
    """The race's score of values xv with noise u: exp(xv - mm) / u, -1 (never wins) where the exp is 0
    or, with min-p, below min_p[b] (step 8: p < min_p · max p, the normaliser cancelling)."""
    e = tl.exp(xv - mm)
    kept = e > 0
    if HAS_MIN_P:
        kept = kept & (e >= tl.load(min_p + b))
    return tl.where(kept, e / tl.maximum(u, 1e-30), -1.0)


@triton.jit
def _first_best(score, idx, BIG: tl.constexpr):
    """(max score, lowest idx holding it)."""
    best = tl.max(score, 0)
    return best, tl.min(tl.where(score == best, idx, BIG), 0)


@triton.jit
def _race_slice_kernel(x, noise, v, m, min_p, best_a, idx_a, cnt, best_t, idx_t, V, stride_x, stride_u, stride_m,
                       NS, HAS_MIN_P: tl.constexpr, BLOCK: tl.constexpr):
    """Per (row, slice): the best kept token above v (score exp(x - m) / noise, -1 where that is 0), the
    number of ties at v, and the best of those ties."""
    b = tl.program_id(0).to(tl.int64)
    s = tl.program_id(1)
    offs = s * BLOCK + tl.arange(0, BLOCK)
    inb = offs < V
    xv = tl.load(x + b * stride_x + offs, mask=inb, other=float("-inf"))
    u = tl.load(noise + b * stride_u + offs, mask=inb, other=1.0)
    vv = tl.load(v + b)
    score = _score(xv, u, tl.load(m + b * stride_m), min_p, b, HAS_MIN_P)
    a, ia = _first_best(tl.where(inb & (xv > vv), score, -1.0), offs, 2147483647)
    tie = inb & (xv == vv)
    t, it = _first_best(tl.where(tie, score, -1.0), offs, 2147483647)
    o = b * NS + s
    tl.store(best_a + o, a)
    tl.store(idx_a + o, ia)
    tl.store(cnt + o, tl.sum(tie.to(tl.int32), 0))
    tl.store(best_t + o, t)
    tl.store(idx_t + o, it)


@triton.jit
def _race_pick_kernel(x, noise, v, m, min_p, n, best_a, idx_a, cnt, best_t, idx_t, out, V, stride_x, stride_u,
                      stride_m, NS, HAS_MIN_P: tl.constexpr, BS: tl.constexpr, BLOCK: tl.constexpr):
    """Per row: the ties at v are kept in id order up to n; a slice whose ties are all kept offers its best
    tie, the slice where the count crosses n is rescanned for the best of its first ones; the winner is the
    best score, the lowest id among equal ones (torch.argmax's rule)."""
    b = tl.program_id(0).to(tl.int64)
    os_ = tl.arange(0, BS)
    ms = os_ < NS
    o = b * NS + os_
    a = tl.load(best_a + o, mask=ms, other=-1.0)
    ia = tl.load(idx_a + o, mask=ms, other=2147483647)
    c = tl.load(cnt + o, mask=ms, other=0).to(tl.int64)
    t = tl.load(best_t + o, mask=ms, other=-1.0)
    it = tl.load(idx_t + o, mask=ms, other=2147483647)
    nn = tl.load(n + b)
    before = tl.cumsum(c, 0) - c
    full = ms & (c > 0) & (before + c <= nn)
    better = full & ((t > a) | ((t == a) & (it < ia)))
    a = tl.where(better, t, a)
    ia = tl.where(better, it, ia)
    best, idx = _first_best(a, ia, 2147483647)
    # the slice where the kept ties end inside it (at most one): its first nn - before ties
    cross = ms & (before < nn) & (before + c > nn)
    if tl.max(cross.to(tl.int32), 0) > 0:
        s = tl.min(tl.where(cross, os_, BS), 0)
        left = nn - tl.sum(tl.where(os_ == s, before, 0), 0)
        offs = s * BLOCK + tl.arange(0, BLOCK)
        inb = offs < V
        xv = tl.load(x + b * stride_x + offs, mask=inb, other=float("-inf"))
        u = tl.load(noise + b * stride_u + offs, mask=inb, other=1.0)
        score = _score(xv, u, tl.load(m + b * stride_m), min_p, b, HAS_MIN_P)
        tie = inb & (xv == tl.load(v + b))
        rank = tl.cumsum(tie.to(tl.int64), 0)                    # 1-based among the slice's ties
        tb, ti = _first_best(tl.where(tie & (rank <= left), score, -1.0), offs, 2147483647)
        take = (tb > best) | ((tb == best) & (ti < idx))
        best = tl.where(take, tb, best)
        idx = tl.where(take, ti, idx)
    tl.store(out + b, idx.to(tl.int64))


def race(x: torch.Tensor, noise: torch.Tensor, v: torch.Tensor, n: torch.Tensor, m: torch.Tensor,
         min_p: torch.Tensor | None = None) -> torch.Tensor:
    """The drawn token of each row of x [B, V] fp32 over its kept tokens (those > v[b] and the n[b] lowest-id
    ones == v[b], from `nucleus` / `top_p_cut`): argmax of exp(x - m) / max(noise, 1e-30) over the kept
    tokens with a nonzero exp (m [B], rows may be strided: the row's largest value, e.g. vals[:, 0]), the
    lowest id among equal scores. min_p [B] fp32 (optional, step 8): a kept token also needs
    exp(x - m) >= min_p[b]. noise [B, V] fp32 (the rows' Exp(1) draws). Returns [B] int64. Two launches."""
    B, V = x.shape
    if noise.shape != (B, V) or noise.dtype != torch.float32 or noise.stride(1) != 1 or x.stride(1) != 1:
        raise ValueError(f"noise must be fp32 [{B}, {V}] with unit stride along V (x too)")
    ns = triton.cdiv(V, BLOCK)
    dev = x.device
    f = torch.empty(2, B, ns, dtype=torch.float32, device=dev)
    i = torch.empty(3, B, ns, dtype=torch.int32, device=dev)
    out = torch.empty(B, dtype=torch.int64, device=dev)
    if B:
        mp = v if min_p is None else min_p.contiguous()          # (unused without min-p)
        _race_slice_kernel[(B, ns)](x, noise, v, m, mp, f[0], i[0], i[1], f[1], i[2], V, x.stride(0),
                                    noise.stride(0), m.stride(0), ns, HAS_MIN_P=min_p is not None, BLOCK=BLOCK,
                                    num_warps=8)
        _race_pick_kernel[(B,)](x, noise, v, m, mp, n, f[0], i[0], i[1], f[1], i[2], out, V, x.stride(0),
                                noise.stride(0), m.stride(0), ns, HAS_MIN_P=min_p is not None,
                                BS=triton.next_power_of_2(ns), BLOCK=BLOCK, num_warps=8)
    return out


def _top_values(x: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest values of each row of x [B, V] fp32, descending: `topk_values` for k up to MAX_K,
    else torch.topk."""
    return topk_values(x, k) if k <= MAX_K else x.topk(k, dim=1).values


def fused_draw(xs: torch.Tensor, st: SamplingTensors, noise: torch.Tensor) -> torch.Tensor:
    """Steps 6-9 of the sampler (a `ninfer.ops.reference.sampling.Draw`) on temperature-scaled logits xs
    [B, V] fp32: the cut (v, n) of each row (`nucleus` from the top-k candidates, `top_p_cut` for the rows
    that cut by top-p alone), then `race` (min-p inside it). Needs st.top_k_max in 0..CANDIDATES."""
    V = xs.shape[1]
    if st.top_k_max > 0:
        vals = _top_values(xs, st.top_k_max)
        cut, top = nucleus(xs, vals, st.top_k, st.top_p), vals[:, 0]
    else:
        cut, top = (torch.full_like(st.temperature, float("-inf")), torch.full_like(st.top_k, V)), xs.amax(dim=1)
    if st.top_p_only:
        top_p_cut(xs, top, st.top_k, st.top_p, *cut)              # the rows without a top-k cut, in place
    return race(xs, noise, *cut, top, st.min_p if st.min_p_any else None)


def sample(logits: torch.Tensor, st: SamplingTensors, rng_states: Sequence[torch.Tensor | None],
           num_logprobs: int = 0, drawn: Sequence[int] | None = None, logprobs: bool = True) -> SampleResult:
    """`ninfer.ops.reference.sampling.sample` (same arguments and results) with `fused_draw`, unless some
    row cuts by a top-k above CANDIDATES (or the bound is not known): then the torch draw."""
    fused = not st.truncates or 0 <= st.top_k_max <= CANDIDATES
    return _ref.sample(logits, st, rng_states, num_logprobs, drawn, logprobs, draw=fused_draw if fused else None)


@triton.jit
def _bitmask_kernel(x, mask, V, W, stride_x, stride_m, BLOCK_V: tl.constexpr):
    b = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    inside = offs < V
    words = tl.load(mask + b * stride_m + offs // 32, mask=inside & (offs // 32 < W), other=0)
    banned = ((words >> (offs % 32)) & 1) == 0
    tl.store(x + b * stride_x + offs, tl.full([BLOCK_V], float("-inf"), x.dtype.element_ty), mask=inside & banned)


def apply_token_bitmask_(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`ninfer.ops.reference.sampling.apply_token_bitmask_` in one launch: logits [B, V] (unit stride in V),
    mask [B, W] int32; only the banned entries are written. Shapes only: safe inside a CUDA graph."""
    B, V = logits.shape
    W = mask.shape[1]
    if mask.shape[0] != B or W * 32 < V or logits.stride(1) != 1 or mask.stride(1) != 1:
        raise ValueError(f"mask {tuple(mask.shape)} does not cover logits {tuple(logits.shape)}")
    block = 4096
    _bitmask_kernel[(B, triton.cdiv(V, block))](logits, mask, V, W, logits.stride(0), mask.stride(0),
                                                  BLOCK_V=block)
    return logits
