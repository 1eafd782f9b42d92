"""MoE routed experts at prefill sizes (Triton): a grouped GEMM over the (token, expert) pairs sorted by
expert, no host sync.

`sort_pairs` (a stable sort by expert: below CHUNKED_SORT_MIN_PAIRS one launch of a counting sort, one
program per expert; from there two launches, per chunk of pairs a histogram and a sort of its keys, then a
scatter) writes the sorted pairs, the per-expert offsets and the block -> expert table on the GPU; the
grid is an upper bound on the number of row blocks (E + P // BM); surplus programs exit at once:

    a_s[m] = silu(gate_up[e] x[tok_m] | gate) * up     rows m sorted by expert       [P, I] x.dtype
    y[p_m] = w_m · down[e] @ a_s[m]                     scattered back to pair order  [P, H] x.dtype
    out    = Σ_j y[t·k + j]  (+ sigmoid(g) · shared)    one combine launch           [T, H] x.dtype
             (with `residual`: residual += that sum, in place)

The shared expert's down projection is one cuBLAS GEMM over its SwiGLU'd gate|up rows. With the routing
that is six launches (seven with the chunked sort) and a GEMM per MoE layer. Each weighted contribution
is rounded to x.dtype as in the reference; accumulation is fp32. Token batches above PREFILL_CHUNK are
processed in chunks (bounds the [P, H] buffer to 256 MiB in bf16). fp32 inputs use IEEE fp32 dots (no
TF32) so the fp32 Program stays close to the reference.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ninfer.ops.reference.fused import Residual
from ninfer.ops.triton.fused import silu_mul_halves

__all__ = ["PREFILL_CHUNK", "CHUNKED_SORT_MIN_PAIRS", "PrefillTiles", "prefill_tiles", "sort_pairs",
           "chunked_sort_ok", "prefill_routed", "grouped_gate_up", "grouped_down", "prefill"]

PREFILL_CHUNK = 8192     # tokens per grouped-GEMM pass


# NOTE: not specialised on P and NB: P = 8 T is divisible by 16 only for even T, and an odd eager stage
#       over a prefix would pay a compile on first use.
@triton.jit(do_not_specialize=["P", "NB"])
def _sort_pairs_kernel(ids, weights, starts, block_expert, order, sorted_tok, sorted_w, P, E, NB,
                       K: tl.constexpr, BM: tl.constexpr, CH: tl.constexpr, BT: tl.constexpr):
    """Program e: expert e's part of a stable counting sort of the P (token, expert) pairs by expert.
    One pass over ids counts the pairs of lower experts (starts[e]) and of e; a second writes e's pairs,
    in pair order, at starts[e] + rank (order: pair index, sorted_tok: its token, sorted_w: its weight).
    Then e's entries of the block table: expert e's row blocks of BM rows are the blocks
    e + starts[e] // BM + j (j < ceil(count / BM)); they never overlap the next expert's, which start at
    e + 1 + starts[e + 1] // BM, and the blocks in between (and, for the last expert, up to NB) are set
    to E (surplus: their programs exit). So the table needs no cumulative sum over the experts."""
    e = tl.program_id(0)
    o = tl.arange(0, CH)
    less = tl.sum(tl.zeros([CH], dtype=tl.int32), 0)
    cnt = tl.sum(tl.zeros([CH], dtype=tl.int32), 0)
    for c0 in range(0, P, CH):
        v = tl.load(ids + c0 + o, mask=c0 + o < P, other=E)
        less += tl.sum((v < e).to(tl.int32), 0)
        cnt += tl.sum((v == e).to(tl.int32), 0)
    tl.store(starts + e, less)
    if e == E - 1:
        tl.store(starts + E, less + cnt)
    if cnt > 0:
        run = less
        for c0 in range(0, P, CH):
            pair = c0 + o
            v = tl.load(ids + pair, mask=pair < P, other=E)
            hit = v == e
            pos = run + tl.cumsum(hit.to(tl.int32), 0) - 1
            tl.store(order + pos, pair.to(tl.int64), mask=hit)
            tl.store(sorted_tok + pos, (pair // K).to(tl.int64), mask=hit)
            tl.store(sorted_w + pos, tl.load(weights + pair, mask=hit, other=0.0), mask=hit)
            run += tl.sum(hit.to(tl.int32), 0)
    _table_entries(block_expert, e, less, cnt, E, NB, BM, BT)


@triton.jit
def _table_entries(block_expert, e, less, cnt, E, NB, BM: tl.constexpr, BT: tl.constexpr):
    """Expert e's entries of the block table (`_sort_pairs_kernel`'s layout): its row blocks e + less // BM + j
    (j < ceil(cnt / BM)) get e, the blocks after them up to the next expert's first (for the last expert, NB)
    get E (surplus). less: the pairs of lower experts, cnt: e's."""
    first = e + less // BM
    used = first + (cnt + BM - 1) // BM
    last = (e == E - 1).to(tl.int32)
    nxt = last * NB + (1 - last) * (e + 1 + (less + cnt) // BM)
    for b0 in range(first, nxt, BT):
        ob = b0 + tl.arange(0, BT)
        tl.store(block_expert + ob, tl.where(ob < used, e, E), mask=ob < nxt)


@triton.jit(do_not_specialize=["P"])
def _chunk_sort_kernel(ids, hist, skeys, P, E, CH: tl.constexpr, EP: tl.constexpr):
    """Program c, pairs [c·CH, (c+1)·CH): hist[c, e] = how many of them go to expert e, and skeys[c] = the
    keys e·CH + i (i the pair's index in the chunk) in increasing order, i.e. the chunk's pairs sorted by
    expert and, within an expert, in pair order (the keys are distinct). Pairs past P get the key E·CH + i
    (after every real one) and are not counted."""
    c = tl.program_id(0)
    o = tl.arange(0, CH)
    pair = c * CH + o
    valid = pair < P
    v = tl.load(ids + pair, mask=valid, other=E).to(tl.int32)
    tl.store(hist + c * EP + tl.arange(0, EP), tl.histogram(v, EP, mask=valid))
    tl.store(skeys + c * CH + o, tl.sort(v * CH + o))


@triton.jit(do_not_specialize=["P", "NB", "NC"])
def _chunk_scatter_kernel(hist, skeys, weights, starts, block_expert, order, sorted_tok, sorted_w, P, E, NB, NC,
                          K: tl.constexpr, BM: tl.constexpr, CH: tl.constexpr, EP: tl.constexpr,
                          NCP: tl.constexpr, BT: tl.constexpr):
    """Program c: writes its chunk's pairs at their sorted rows. Every program reads the whole [NC, E]
    histogram (L2): starts[e] = pairs of lower experts, before[e] = expert e's pairs in earlier chunks,
    seg[e] = the chunk's pairs of lower experts, so the chunk's p-th sorted pair (expert e) goes to row
    starts[e] + before[e] + p - seg[e]: a stable sort by expert. Program 0 stores starts; program c the
    block table entries (as `_sort_pairs_kernel` lays them out) of experts c, c + NC, ..."""
    c = tl.program_id(0)
    oe = tl.arange(0, EP)
    oc = tl.arange(0, NCP)
    hall = tl.load(hist + oc[:, None] * EP + oe[None, :], mask=(oc < NC)[:, None], other=0)
    tot = tl.sum(hall, 0)
    start_v = tl.cumsum(tot, 0) - tot
    before = tl.sum(tl.where((oc < c)[:, None], hall, 0), 0)
    row = tl.load(hist + c * EP + oe)
    base = start_v + before - (tl.cumsum(row, 0) - row)
    sk = tl.load(skeys + c * CH + tl.arange(0, CH))
    e = sk // CH
    ok = e < E
    pair = (c * CH + sk % CH).to(tl.int64)
    dest = tl.gather(base, tl.minimum(e, EP - 1), 0) + tl.arange(0, CH)
    tl.store(order + dest, pair, mask=ok)
    tl.store(sorted_tok + dest, pair // K, mask=ok)
    tl.store(sorted_w + dest, tl.load(weights + pair, mask=ok, other=0.0), mask=ok)
    if c == 0:
        tl.store(starts + oe, start_v, mask=oe < E)
        tl.store(starts + E, tl.sum(tot, 0))
    for x in range(c, E, NC):
        _table_entries(block_expert, x, tl.sum(tl.where(oe == x, start_v, 0), 0), tl.sum(tl.where(oe == x, tot, 0), 0),
                       E, NB, BM, BT)


@triton.jit
def _block_rows(block_expert, starts, E, BM: tl.constexpr):
    """(expert, first row, end row) of this program's row block (`_sort_pairs_kernel`'s table); expert
    == E: surplus program."""
    b = tl.program_id(0)
    e = tl.load(block_expert + b)
    e_safe = tl.minimum(e, E - 1)
    start = tl.load(starts + e_safe)
    row0 = start + (b - e_safe - start // BM) * BM
    end = tl.load(starts + e_safe + 1)
    return e, row0, end


@triton.jit
def _grouped_gate_up_kernel(x, sorted_tok, block_expert, starts, w, act, E, I, H,
                            stride_x, stride_we, stride_wn, stride_act,
                            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr,
                            EVEN: tl.constexpr):
    # EVEN: H % BK == 0 and I % BN == 0, so only the row mask is left (no per-element K mask on the
    #       contiguous dimension: the tiles load as vectors)
    e, row0, end = _block_rows(block_expert, starts, E, BM)
    if e < E:
        o_m = row0 + tl.arange(0, BM)
        mm = o_m < end
        tok = tl.load(sorted_tok + o_m, mask=mm, other=0).to(tl.int64)
        o_n = tl.program_id(1) * BN + tl.arange(0, BN)
        mn = o_n < I
        o_k = tl.arange(0, BK)
        xp = x + tok[:, None] * stride_x + o_k[None, :]
        wg = w + e.to(tl.int64) * stride_we + o_n[None, :].to(tl.int64) * stride_wn + o_k[:, None]
        wu = wg + I * stride_wn
        accg = tl.zeros([BM, BN], dtype=tl.float32)
        accu = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(0, H, BK):
            if EVEN:
                a = tl.load(xp, mask=mm[:, None], other=0.0)
                bg = tl.load(wg)
                bu = tl.load(wu)
            else:
                mk = o_k < H - k0
                a = tl.load(xp, mask=mm[:, None] & mk[None, :], other=0.0)
                bg = tl.load(wg, mask=mk[:, None] & mn[None, :], other=0.0)
                bu = tl.load(wu, mask=mk[:, None] & mn[None, :], other=0.0)
            accg = tl.dot(a, bg, accg, input_precision=PREC)
            accu = tl.dot(a, bu, accu, input_precision=PREC)
            xp += BK
            wg += BK
            wu += BK
        h = accg / (1.0 + tl.exp(-accg)) * accu
        tl.store(act + o_m[:, None].to(tl.int64) * stride_act + o_n[None, :], h.to(act.dtype.element_ty),
                 mask=mm[:, None] & mn[None, :])


@triton.jit
def _grouped_down_kernel(act, order, sorted_w, block_expert, starts, w, y, E, H, I,
                         stride_act, stride_we, stride_wn, stride_y,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr,
                         EVEN: tl.constexpr):
    # EVEN: I % BK == 0 and H % BN == 0 (as in `_grouped_gate_up_kernel`)
    e, row0, end = _block_rows(block_expert, starts, E, BM)
    if e < E:
        o_m = row0 + tl.arange(0, BM)
        mm = o_m < end
        o_n = tl.program_id(1) * BN + tl.arange(0, BN)
        mn = o_n < H
        o_k = tl.arange(0, BK)
        ap = act + o_m[:, None].to(tl.int64) * stride_act + o_k[None, :]
        wp = w + e.to(tl.int64) * stride_we + o_n[None, :].to(tl.int64) * stride_wn + o_k[:, None]
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(0, I, BK):
            if EVEN:
                a = tl.load(ap, mask=mm[:, None], other=0.0)
                b = tl.load(wp)
            else:
                mk = o_k < I - k0
                a = tl.load(ap, mask=mm[:, None] & mk[None, :], other=0.0)
                b = tl.load(wp, mask=mk[:, None] & mn[None, :], other=0.0)
            acc = tl.dot(a, b, acc, input_precision=PREC)
            ap += BK
            wp += BK
        acc = acc * tl.load(sorted_w + o_m, mask=mm, other=0.0).to(tl.float32)[:, None]
        pair = tl.load(order + o_m, mask=mm, other=0).to(tl.int64)
        tl.store(y + pair[:, None] * stride_y + o_n[None, :], acc.to(y.dtype.element_ty),
                 mask=mm[:, None] & mn[None, :])


class PrefillTiles(NamedTuple):
    """Tiles of the prefill grouped GEMMs: BM rows of sorted pairs per block (also the sort's block
    table), gate|up (BN1 columns of each half, BK1) and down (BN2, BK2), warps and stages per kernel,
    and the sort's chunk (pairs per scan step) and warps."""
    BM: int
    BN1: int
    BK1: int
    warps1: int
    stages1: int
    BN2: int
    BK2: int
    warps2: int
    stages2: int
    sort_chunk: int = 4096
    sort_warps: int = 8


# NOTE: BM=128 once experts average >= LARGE_ROWS_PER_EXPERT rows: half the weight re-reads and larger
#       MMAs; BM=64 wastes less on the partial last block below that. Tiles chosen by a sweep of the
#       grouped GEMMs (docs/performance.md, "Decision log"). fp32 inputs (the fp32 Program of the parity tests) keep the
#       narrower large tiles: the wide ones' fp32 stages exceed the shared memory.
PREFILL_TILES_SMALL = PrefillTiles(64, 64, 64, 4, 3, 128, 64, 4, 3)
PREFILL_TILES_LARGE = PrefillTiles(128, 128, 64, 8, 4, 256, 64, 8, 4)
PREFILL_TILES_LARGE_FP32 = PrefillTiles(128, 64, 64, 8, 3, 128, 64, 8, 3)
LARGE_ROWS_PER_EXPERT = 64


def prefill_tiles(P: int, E: int, dtype: torch.dtype = torch.bfloat16) -> PrefillTiles:
    """The grouped GEMMs' tiles for P pairs over E experts with inputs of `dtype`."""
    if P < LARGE_ROWS_PER_EXPERT * E:
        return PREFILL_TILES_SMALL
    return PREFILL_TILES_LARGE_FP32 if dtype == torch.float32 else PREFILL_TILES_LARGE


# NOTE: two ways to sort the pairs. `_sort_pairs_kernel` (one launch, one program per expert) scans all P
#       pairs twice in every program: E x P work. The chunked sort (two launches: per CH-pair chunk a
#       histogram and an in-register sort of its keys, then per chunk a scatter to rows derived from all the
#       chunks' histograms) does P log CH work. It needs the [SORT_NC, E] histogram in one program's
#       registers, so it runs up to SORT_CH * SORT_NC pairs (a PREFILL_CHUNK pass at top 8) and E <= 256;
#       it is taken from CHUNKED_SORT_MIN_PAIRS pairs (docs/performance.md, "Decision log").
CHUNKED_SORT_MIN_PAIRS = 8192
SORT_CH = 1024           # pairs per chunk (one compiled form: the serve warmup's lengths cover it)
SORT_NC = 64             # chunks at most (P <= SORT_CH * SORT_NC; the histogram tile is [SORT_NC, next_pow2(E)])
SORT_MAX_CELLS = 16384


def chunked_sort_ok(P: int, E: int) -> bool:
    return 0 < P <= SORT_CH * SORT_NC and SORT_NC * triton.next_power_of_2(E) <= SORT_MAX_CELLS


def sort_pairs(ids: torch.Tensor, weights: torch.Tensor, E: int, BM: int, *, chunk: int = 4096, warps: int = 8,
               chunked: bool | None = None):
    """The pairs of a routing sorted by expert for the grouped GEMMs (no host sync):
    (starts [E + 1] int32, block_expert [NB] int32, order [P] int64, sorted_tok [P] int64, sorted_w [P]),
    NB = E + P // BM. order is torch.sort(ids.flatten(), stable=True)'s indices. chunked: the chunked sort
    (None: from CHUNKED_SORT_MIN_PAIRS pairs, where its shape fits); otherwise one launch of
    `_sort_pairs_kernel`, chunk: its pairs per scan step (a power of 2), warps: its warps."""
    T, k = ids.shape
    P = T * k
    dev = ids.device
    NB = E + P // BM
    starts = torch.empty(E + 1, dtype=torch.int32, device=dev)
    block_expert = torch.empty(NB, dtype=torch.int32, device=dev)
    order = torch.empty(P, dtype=torch.int64, device=dev)
    sorted_tok = torch.empty(P, dtype=torch.int64, device=dev)
    sorted_w = torch.empty(P, dtype=weights.dtype, device=dev)
    if chunked is None:
        chunked = P >= CHUNKED_SORT_MIN_PAIRS
    if chunked and chunked_sort_ok(P, E):
        nc, ep = triton.cdiv(P, SORT_CH), triton.next_power_of_2(E)
        ids = ids.contiguous()
        hist = torch.empty(nc, ep, dtype=torch.int32, device=dev)
        skeys = torch.empty(nc, SORT_CH, dtype=torch.int32, device=dev)
        _chunk_sort_kernel[(nc,)](ids, hist, skeys, P, E, CH=SORT_CH, EP=ep, num_warps=4)
        _chunk_scatter_kernel[(nc,)](hist, skeys, weights.contiguous(), starts, block_expert, order, sorted_tok,
                                     sorted_w, P, E, NB, nc, K=k, BM=BM, CH=SORT_CH, EP=ep, NCP=SORT_NC, BT=64,
                                     num_warps=4)
        return starts, block_expert, order, sorted_tok, sorted_w
    _sort_pairs_kernel[(E,)](ids, weights, starts, block_expert, order, sorted_tok, sorted_w, P, E, NB,
                             K=k, BM=BM, CH=chunk, BT=64, num_warps=warps)
    return starts, block_expert, order, sorted_tok, sorted_w


def _prec(x: torch.Tensor) -> str:
    return "ieee" if x.dtype == torch.float32 else "tf32"


def prefill_routed(x, ids, weights, gate_up, down, tiles: PrefillTiles | None = None):
    """Routed experts' weighted contributions y [P, H] (pair order) in x.dtype. All bookkeeping on the GPU
    (no host sync): one sort launch, the two grouped GEMMs. tiles: `prefill_tiles(P, E, x.dtype)` unless
    given (a tile sweep passes them)."""
    E = down.shape[0]
    c = tiles or prefill_tiles(ids.numel(), E, x.dtype)
    starts, block_expert, order, sorted_tok, sorted_w = sort_pairs(ids, weights, E, c.BM, chunk=c.sort_chunk,
                                                                   warps=c.sort_warps)
    act = grouped_gate_up(x, sorted_tok, block_expert, starts, gate_up, c)
    return grouped_down(act, order, sorted_w, block_expert, starts, down, c)


def grouped_gate_up(x, sorted_tok, block_expert, starts, gate_up, c: PrefillTiles) -> torch.Tensor:
    """act [P, I] = silu(gate) * up of each sorted pair's token through its expert (`sort_pairs`' outputs)."""
    E, I2, H = gate_up.shape
    I = I2 // 2
    act = torch.empty(sorted_tok.shape[0], I, dtype=x.dtype, device=x.device)
    _grouped_gate_up_kernel[(block_expert.shape[0], triton.cdiv(I, c.BN1))](
        x, sorted_tok, block_expert, starts, gate_up, act, E, I, H,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), act.stride(0),
        BM=c.BM, BN=c.BN1, BK=c.BK1, PREC=_prec(x), EVEN=H % c.BK1 == 0 and I % c.BN1 == 0,
        num_warps=c.warps1, num_stages=c.stages1)
    return act


def grouped_down(act, order, sorted_w, block_expert, starts, down, c: PrefillTiles) -> torch.Tensor:
    """y [P, H] in pair order: each sorted pair's weight x its expert's down projection of act."""
    E, H, I = down.shape
    y = torch.empty(act.shape[0], H, dtype=act.dtype, device=act.device)
    _grouped_down_kernel[(block_expert.shape[0], triton.cdiv(H, c.BN2))](
        act, order, sorted_w, block_expert, starts, down, y, E, H, I,
        act.stride(0), down.stride(0), down.stride(1), y.stride(0),
        BM=c.BM, BN=c.BN2, BK=c.BK2, PREC=_prec(act), EVEN=I % c.BK2 == 0 and H % c.BN2 == 0,
        num_warps=c.warps2, num_stages=c.stages2)
    return y


@triton.jit
def _combine_kernel(y, g, s, out, H, stride_g, stride_s, stride_out, K: tl.constexpr, HAS_SHARED: tl.constexpr,
                    BH: tl.constexpr, ADD_OUT: tl.constexpr = False):
    """out[t] = Σ_j y[t·K + j] (fp32, rounded once) [+ sigmoid(g[t]) · s[t], each rounded as a separate
    op in out's dtype would round it]. ADD_OUT: out holds the residual stream and gets out[t] + that sum,
    rounded once (what the separate add of `add_rms_norm` stores)."""
    t = tl.program_id(0).to(tl.int64)
    o = tl.program_id(1) * BH + tl.arange(0, BH)
    m = o < H
    dt: tl.constexpr = out.dtype.element_ty
    acc = tl.zeros([BH], dtype=tl.float32)
    for j in tl.static_range(K):
        acc += tl.load(y + (t * K + j) * H + o, mask=m, other=0.0).to(tl.float32)
    r = acc.to(dt)
    if HAS_SHARED:
        gv = tl.load(g + t * stride_g).to(tl.float32)
        sg = (1.0 / (1.0 + tl.exp(-gv))).to(dt).to(tl.float32)
        sv = tl.load(s + t * stride_s + o, mask=m, other=0.0).to(tl.float32)
        r = (r.to(tl.float32) + (sg * sv).to(dt).to(tl.float32)).to(dt)
    if ADD_OUT:
        r = (tl.load(out + t * stride_out + o, mask=m, other=0.0).to(tl.float32) + r.to(tl.float32)).to(dt)
    tl.store(out + t * stride_out + o, r, mask=m)



def _combine_target(residual, x):
    """The residual as [T, H] rows the combine may update in place, or None (not folded)."""
    if (residual is None or residual.dtype != x.dtype or residual.device != x.device
            or residual.numel() != x.numel() or not residual.is_contiguous()):
        return None
    return residual.view(x.shape)


def prefill(x, ids, weights, gate_up, down, shared, residual=None):
    """Grouped GEMMs in PREFILL_CHUNK-token passes; each pass's k contributions per token are summed
    (and the shared expert's added) by one combine launch into its rows of out (of `residual`, added
    in place, when it folds: `Residual(residual, None)` is returned then)."""
    T, H = x.shape
    k = ids.shape[1]
    fold = _combine_target(residual, x)
    out = fold if fold is not None else torch.empty(T, H, dtype=x.dtype, device=x.device)
    if shared is not None:
        s_all = F.linear(silu_mul_halves(shared.gate_up), shared.down)
    step = max(1, PREFILL_CHUNK)
    BH = min(1024, triton.next_power_of_2(H))
    for s0 in range(0, T, step):
        n = min(step, T - s0)
        y = prefill_routed(x[s0:s0 + n], ids[s0:s0 + n], weights[s0:s0 + n], gate_up, down)
        o = out[s0:s0 + n]
        if shared is not None:
            g, sv = shared.gate[s0:s0 + n], s_all[s0:s0 + n]
            args = (g, sv, o, H, g.stride(0), sv.stride(0), o.stride(0))
        else:
            args = (o, o, o, H, 0, 0, o.stride(0))
        _combine_kernel[(n, triton.cdiv(H, BH))](y, *args, K=k, HAS_SHARED=shared is not None, BH=BH,
                                                 ADD_OUT=fold is not None, num_warps=4)
    return out if fold is None else Residual(fold, None)
