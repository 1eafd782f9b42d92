"""Fast MoE routing and routed experts (CUDA, Triton); no host sync on any path.

Same signatures and results as the references in `ninfer.ops.reference.moe` (the oracle), up to rounding:

`route_topk(logits, k)`: one program (one warp) per token, one launch: fp32 softmax over the E
logits, k rounds of one max over packed (probability bits, id) keys, renormalise, weights cast to
the logits' dtype, ids int64. Ties go to the lowest expert id (torch.topk leaves them unspecified).

`moe_experts(x, routing, gate_up, down, shared=None)`, decode sizes (T*k <= MAX_PAIRS), two launches:

    act[t·k + j] = silu(gate_up[e_tj, :I] @ x[t]) * (gate_up[e_tj, I:] @ x[t])   [T·k, I] x.dtype  grid (T, I/BN)
    out[t] = Σ_j w[t, j] · down[e_tj] @ act[t·k + j]                            [T, H] x.dtype    grid (T, H/BN)
             (+ sigmoid(shared.gate[t]) · shared.down @ silu_mul(shared.gate_up[t]))

Each program handles all k experts of one token: its weight tiles are one [k, BN, BK] load (k
experts' rows at once, 32-36 KiB at the 35B sizes), so the bytes in flight per SM are what a streaming
read of HBM needs. With `DecodeConfig.up_stream` tiles (measured, not a default: session 23 chose them for
2 tokens, session 24's machine ran them 0.14-0.16 ms slower) the first kernel instead runs one program
per (n-block, token, expert), grid (I/BN, T·k), streaming [BN, BK] blocks of that expert's gate and up
rows a block ahead, as the GEMV's prefetch tiles do, and the second loads its weights before the PDL
wait (`down_early`: the routing came from an earlier kernel). The second kernel loads the shared
expert's tile in the same step and applies the weights, the shared sigmoid gate and the sum in
registers (fp32), so no [T·k, H] intermediate, torch sum or cast is left. Expert ids stay on the GPU (CUDA-graph capturable).

`route_moe_experts(x, router_logits, k, gate_up, down, shared=None)`: the same, with the routing
computed inside the first kernel (every program of token t runs `_topk_of_row` on its E logits, the
programs of n-block 0 store the weights and ids for the second kernel): a decode MoE layer is the
shared_in GEMM and two expert launches.

`legacy=True` selects the previous decode kernels (one program per (pair, n-block) for gate|up, a
serial loop over the k experts for down; separate routing kernel) for bench/moe_decode.py's A/B only.

Prefill (T*k > MAX_PAIRS): a grouped GEMM over the (token, expert) pairs sorted by expert. `sort_pairs`
(a stable sort by expert: below CHUNKED_SORT_MIN_PAIRS one launch of a counting sort, one program per
expert; from there two launches, per chunk of pairs a histogram and a sort of its keys, then a scatter)
writes the sorted pairs, the per-expert offsets and the block -> expert table on the GPU; the grid is an
upper bound on the number of row blocks (E + P // BM); surplus programs exit at once, so there is no host
sync either:

    a_s[m] = silu(gate_up[e] x[tok_m] | gate) * up     rows m sorted by expert       [P, I] x.dtype
    y[p_m] = w_m · down[e] @ a_s[m]                     scattered back to pair order  [P, H] x.dtype
    out    = Σ_j y[t·k + j]  (+ sigmoid(g) · shared)    one combine launch           [T, H] x.dtype
             (with `residual`: residual += that sum, in place; see PREFILL_RESIDUAL_COMBINE)

The shared expert's down projection is one cuBLAS GEMM over its SwiGLU'd gate|up rows. With the routing
that is six launches (seven with the chunked sort) and a GEMM per MoE layer, where torch's sort /
searchsorted / cumsum / index / sum and the shared expert's elementwise ops took ~20 (bench/NOTES.md,
session 15: the 35B-A3B's 1k prefill is host bound).

Each weighted contribution is rounded to x.dtype as in the reference; accumulation is fp32. Token
batches above PREFILL_CHUNK are processed in chunks (bounds the [P, H] buffer to 256 MiB in bf16).
fp32 inputs use IEEE fp32 dots (no TF32) so the fp32 Program stays close to the reference.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ninfer.ops.triton.fused import silu_mul_halves
from ninfer.ops.triton.gemv import _gemv_block, _load_w
from ninfer.ops.reference.fused import Residual
from ninfer.ops.reference.moe import MoeRouting, SharedExpert
from ninfer.ops.triton import pdl

__all__ = ["route_topk", "moe_experts", "route_moe_experts", "DecodeConfig", "DECODE_CONFIG",
           "DECODE_CONFIG_MANY", "decode_config", "MAX_PAIRS", "PREFILL_CHUNK", "PREFILL_RESIDUAL_COMBINE",
           "CHUNKED_SORT", "PrefillTiles", "prefill_tiles"]

MAX_PAIRS = 128          # (token, expert) pairs up to which the grouped GEMV (decode) path runs
PREFILL_CHUNK = 8192     # tokens per grouped-GEMM pass


# ------------------------------------------------------------------------------------------------
# routing
# ------------------------------------------------------------------------------------------------
@triton.jit
def _topk_of_row(row, E, K: tl.constexpr, BE: tl.constexpr, BK: tl.constexpr):
    """Top-K of one row of E router logits: (renormalised weights [BK] fp32, ids [BK] int64), slots >= K
    hold 0. fp32 softmax over all E; by decreasing probability, the lowest id wins a tie."""
    o_e = tl.arange(0, BE)
    me = o_e < E
    lg = tl.load(row + o_e, mask=me, other=float("-inf")).to(tl.float32)
    ex = tl.where(me, tl.exp(lg - tl.max(lg, 0)), 0.0)
    p = ex / tl.sum(ex, 0)
    # NOTE: one max per round on a packed key: p >= 0, so its fp32 bits order like the values; the low
    #       word (BE - 1 - e) makes the lowest id win a tie. Taken and padding lanes hold -1.
    key = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (BE - 1 - o_e).to(tl.int64)
    key = tl.where(me, key, -1)
    o_k = tl.arange(0, BK)
    wv = tl.zeros([BK], dtype=tl.float32)
    iv = tl.zeros([BK], dtype=tl.int64)
    for j in tl.static_range(K):
        best = tl.max(key, 0)
        hi = best >> 32
        v = hi.to(tl.int32).to(tl.float32, bitcast=True)
        idx = BE - 1 - (best - (hi << 32))
        idx = tl.minimum(tl.maximum(idx, 0), E - 1)   # NaN logits: stay in range (no stray weight reads)
        wv = tl.where(o_k == j, v, wv)
        iv = tl.where(o_k == j, idx, iv)
        key = tl.where(key == best, -1, key)
    return wv / tl.sum(wv, 0), iv


@triton.jit
def _route_topk_kernel(logits, w_out, id_out, E, stride_l, K: tl.constexpr, BE: tl.constexpr,
                       BK: tl.constexpr, PDL: tl.constexpr = False):
    pdl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    wv, iv = _topk_of_row(logits + t * stride_l, E, K, BE, BK)
    o_k = tl.arange(0, BK)
    mk = o_k < K
    tl.store(w_out + t * K + o_k, wv.to(w_out.dtype.element_ty), mask=mk)
    tl.store(id_out + t * K + o_k, iv, mask=mk)


def route_topk(router_logits: torch.Tensor, top_k: int) -> MoeRouting:
    """See `ninfer.ops.reference.moe.route_topk`. router_logits [T, E] (rows may be strided) -> weights [T, k]
    in the logits' dtype, ids [T, k] int64, by decreasing probability."""
    T, E = router_logits.shape
    if not 0 < top_k <= E:
        raise ValueError(f"top_k must be in 1..{E}, got {top_k}")
    lg = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
    w = torch.empty(T, top_k, dtype=lg.dtype, device=lg.device)
    ids = torch.empty(T, top_k, dtype=torch.int64, device=lg.device)
    if T:
        BE = triton.next_power_of_2(E)
        _route_topk_kernel[(T,)](lg, w, ids, E, lg.stride(0), K=top_k, BE=BE,
                                 BK=triton.next_power_of_2(top_k), num_warps=1 if BE <= 1024 else 4, **pdl.launch())
    return MoeRouting(w, ids)


# ------------------------------------------------------------------------------------------------
# decode: grouped GEMV
# ------------------------------------------------------------------------------------------------
@triton.jit
def _gate_up_act_kernel(x, ids, w, act, I, H, stride_x, stride_we, stride_wn, stride_act,
                        TOPK: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
                        PDL: tl.constexpr = False):
    """act[p, n] = silu(Σ_h w[e_p, n, h] x[t_p, h]) · Σ_h w[e_p, I + n, h] x[t_p, h], t_p = p // TOPK."""
    pdl.enter(PDL)
    p = tl.program_id(0)
    o_n = tl.program_id(1) * BN + tl.arange(0, BN)
    mn = o_n < I
    e = tl.load(ids + p).to(tl.int64)
    xr = x + (p // TOPK).to(tl.int64) * stride_x
    wg = w + e * stride_we + o_n[:, None].to(tl.int64) * stride_wn
    wu = wg + I * stride_wn
    accg = tl.zeros([BN, BK], dtype=tl.float32)
    accu = tl.zeros([BN, BK], dtype=tl.float32)
    for k0 in range(0, H, BK):
        o_k = k0 + tl.arange(0, BK)
        if EVEN_K:
            xv = tl.load(xr + o_k).to(tl.float32)
            g = tl.load(wg + o_k[None, :], mask=mn[:, None], other=0.0).to(tl.float32)
            u = tl.load(wu + o_k[None, :], mask=mn[:, None], other=0.0).to(tl.float32)
        else:
            mk = o_k < H
            xv = tl.load(xr + o_k, mask=mk, other=0.0).to(tl.float32)
            g = tl.load(wg + o_k[None, :], mask=mn[:, None] & mk[None, :], other=0.0).to(tl.float32)
            u = tl.load(wu + o_k[None, :], mask=mn[:, None] & mk[None, :], other=0.0).to(tl.float32)
        accg += g * xv[None, :]
        accu += u * xv[None, :]
    gs = tl.sum(accg, 1)
    a = gs / (1.0 + tl.exp(-gs)) * tl.sum(accu, 1)
    tl.store(act + p.to(tl.int64) * stride_act + o_n, a.to(act.dtype.element_ty), mask=mn)


@triton.jit
def _down_sum_kernel(act, ids, rw, down, out, sgu, sg, sdown, H, I, Is,
                     stride_act, stride_de, stride_dn, stride_out, stride_sgu, stride_sg, stride_sdn,
                     TOPK: tl.constexpr, HAS_SHARED: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     BKS: tl.constexpr, PDL: tl.constexpr = False):
    """out[t, n] = Σ_j rw[t, j] Σ_i down[ids[t, j], n, i] act[t·TOPK + j, i]  (+ the shared expert)."""
    pdl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    o_n = tl.program_id(1) * BN + tl.arange(0, BN)
    mn = o_n < H
    acc = tl.zeros([BN], dtype=tl.float32)
    for j in tl.static_range(TOPK):
        e = tl.load(ids + t * TOPK + j).to(tl.int64)
        wj = tl.load(rw + t * TOPK + j).to(tl.float32)
        ar = act + (t * TOPK + j) * stride_act
        dr = down + e * stride_de + o_n[:, None].to(tl.int64) * stride_dn
        part = tl.zeros([BN, BK], dtype=tl.float32)
        for k0 in range(0, I, BK):
            o_k = k0 + tl.arange(0, BK)
            mk = o_k < I
            av = tl.load(ar + o_k, mask=mk, other=0.0).to(tl.float32)
            d = tl.load(dr + o_k[None, :], mask=mn[:, None] & mk[None, :], other=0.0).to(tl.float32)
            part += d * av[None, :]
        acc += wj * tl.sum(part, 1)
    if HAS_SHARED:
        gl = tl.load(sg + t * stride_sg).to(tl.float32)
        gr = sgu + t * stride_sgu
        dr = sdown + o_n[:, None].to(tl.int64) * stride_sdn
        part = tl.zeros([BN, BKS], dtype=tl.float32)
        for k0 in range(0, Is, BKS):
            o_k = k0 + tl.arange(0, BKS)
            mk = o_k < Is
            g = tl.load(gr + o_k, mask=mk, other=0.0).to(tl.float32)
            u = tl.load(gr + Is + o_k, mask=mk, other=0.0).to(tl.float32)
            d = tl.load(dr + o_k[None, :], mask=mn[:, None] & mk[None, :], other=0.0).to(tl.float32)
            part += d * (g / (1.0 + tl.exp(-g)) * u)[None, :]
        acc += tl.sum(part, 1) / (1.0 + tl.exp(-gl))
    tl.store(out + t * stride_out + o_n, acc.to(out.dtype.element_ty), mask=mn)


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _shared_args(shared, act: torch.Tensor, width_if_none: int):
    """(Is, (gate_up, gate, down), their row strides) of the shared expert for the down kernels; without
    one, `act` stands in for the (unread) pointers with zero strides and Is = width_if_none."""
    if shared is None:
        return width_if_none, (act, act, act), (0, 0, 0)
    sgu, sg, sdown = _rows(shared.gate_up), shared.gate, _rows(shared.down)
    return sdown.shape[1], (sgu, sg, sdown), (sgu.stride(0), sg.stride(0), sdown.stride(0))


def _decode_legacy(x, ids, weights, gate_up, down, shared):
    T, H = x.shape
    k = ids.shape[1]
    P, I = T * k, down.shape[-1]
    act = torch.empty(P, I, dtype=x.dtype, device=x.device)
    # NOTE: bandwidth: one selected expert is 2·I·H weights for gate|up (4 MiB at 35B: I=512, H=2048,
    #       bf16) and H·I for down (2 MiB); the vectors are noise. T=1 reads 8 experts = 48 MiB + 2 MiB
    #       shared, ~11 us at 4.8 TB/s. Kernel 1 at BN=16: (P, I/16) = 256 programs (2 per SM on 132 SMs),
    #       each streaming a 16x256 gate and up tile per step (16 KiB in flight per program, 4 MiB in all).
    #       Kernel 2 with BK=I: H/BN programs per token (BN=8 for T <= 2: 256 programs, 8 KiB tile per
    #       expert), the k expert loop unrolled so the loads of the next experts can be issued early.
    #       Not yet tuned on the H200 (no GPU where this was written): BN/BK/num_warps are the knobs.
    BN1, BK1 = 16, min(256, triton.next_power_of_2(H))
    _gate_up_act_kernel[(P, triton.cdiv(I, BN1))](
        x, ids, gate_up, act, I, H, x.stride(0), gate_up.stride(0), gate_up.stride(1), act.stride(0),
        TOPK=k, BN=BN1, BK=BK1, EVEN_K=H % BK1 == 0, num_warps=4, **pdl.launch())
    out = torch.empty(T, H, dtype=x.dtype, device=x.device)
    BN2 = 8 if T <= 2 else 16                        # T <= 2: 256+ programs, 2 per SM, for latency hiding
    BK2 = min(512, triton.next_power_of_2(I))
    Is, s_args, s_strides = _shared_args(shared, act, 1)
    _down_sum_kernel[(T, triton.cdiv(H, BN2))](
        act, ids, weights, down, out, *s_args, H, I, Is,
        act.stride(0), down.stride(0), down.stride(1), out.stride(0), *s_strides,
        TOPK=k, HAS_SHARED=shared is not None, BN=BN2, BK=BK2,
        BKS=min(512, triton.next_power_of_2(Is)), num_warps=4, **pdl.launch())
    return out


# ------------------------------------------------------------------------------------------------
# decode: all k experts of a token in one program (routing folded into the first kernel)
# ------------------------------------------------------------------------------------------------
class DecodeConfig(NamedTuple):
    """Tiles of the decode kernels. Gate|up: program (t, n-block) streams [KB, up_bn, up_bk] gate and up
    tiles (KB = next_pow2(k) experts at once) per step over H; down: program (t, n-block) streams a
    [KB, down_bn, down_bk] tile of the routed experts and [down_bn, down_bk] of the shared one per
    step over I. up_stream: gate|up program (n-block, t·k + j) streams [up_bn, up_bk] blocks of one expert
    instead. down_early: the down kernel's weights are loaded before the PDL wait (only with one K block and
    the routing from an earlier kernel; otherwise ignored). `bench/moe_decode.py --sweep` times alternatives
    per layer, `bench/step_ab.py` in the step (H200 figures in bench/NOTES.md)."""
    up_bn: int = 1
    up_bk: int = 512
    up_warps: int = 4
    down_bn: int = 2
    down_bk: int = 512
    down_warps: int = 4
    # NOTE: neither is set by a default tile set (session 24: slower at 2 tokens on its machine, a tie or a loss
    #       elsewhere; bench/NOTES.md). They stay as tested alternatives for bench/step_ab.py and moe_decode.py.
    up_stream: int = 0      # 1: one expert per gate|up program, [up_bn, up_bk] blocks prefetched a block ahead
    down_early: int = 0     # 1: the down kernel loads its weights before the PDL wait (routing from an earlier kernel)


# NOTE: measured on the H200 (bench/moe_decode.py --sweep, 35B-A3B shapes, 40 layers per graph, PDL on): T=1
#       (1, 1024, 4, 2, 512, 4) 25.98 us per layer vs 28.71 for (1, 512, ...); T=8 (1, 256, 2, 2, 512, 4) 118.0
#       vs 128.9. DECODE_CONFIG was then the one for up to 2 tokens, DECODE_CONFIG_MANY above.
#       Swept again with the 48-register down kernel (pass 8, bench/NOTES.md): in the real step
#       (bench/step_ab.py moe=...) every alternative lost to these tiles by 0.015-0.24 ms per step.
#       Session 22, with the routing apart from 2 tokens (ROUTE_APART_TOKENS), DECODE_CONFIG_MANY was
#       (1, 256, 2, 2, 512, 4); in the 35B-A3B step (bench/step_ab.py, replay ms, that vs the one below):
#       B=3 3.874 vs 3.752, B=4 4.399 vs 4.424, B=5 5.375 vs 4.800, B=6 5.715 vs 5.340, B=7 6.075 vs 5.982,
#       B=8 6.429 vs 6.294.
#       Session 23 (bench/NOTES.md): the down kernel on [KB, 1, 512] tiles with one warp (16x the programs)
#       from 2 tokens, and at 2 tokens the one-expert-per-program gate|up kernel with the down kernel's early
#       loads; 35B-A3B step replay ms (bench/step_ab.py, one process per row, old -> new): B=2 3.522 -> 3.317,
#       B=4 4.878 -> 4.546, B=5 5.340 -> 4.762, B=8 7.238 -> 6.217. FEW instead at B=2 3.364 (MANY), at
#       B=3 3.846-3.963 vs 3.682, B=4 4.324-4.350 vs 4.334, B=5 4.904, B=8 6.436. Two captures of one config
#       differ by up to 0.12 ms. At one token every alternative tried lost (2.548 base vs 2.584-2.649).
#       Session 24, another machine, at B=2 (three processes): FEW (8, 128, 4, 1, 512, 1, up_stream=1,
#       down_early=1) 3.293-3.327, the one-token tiles 3.237-3.241, MANY 3.149-3.166. So 2 tokens run MANY
#       and the FEW tier is gone; its tiles stay selectable (bench/step_ab.py set:...DECODE_CONFIG_MANY=FIELDS
#       at --batch 2 is that comparison).
DECODE_CONFIG = DecodeConfig(1, 1024, 4, 2, 512, 4)
DECODE_CONFIG_MANY = DecodeConfig(4, 256, 8, 1, 512, 1)
MANY_TOKENS = 2          # the token count from which DECODE_CONFIG_MANY applies


def decode_config(tokens: int) -> DecodeConfig:
    """The default decode tiles for `tokens` rows (the one place the choice is made)."""
    return DECODE_CONFIG if tokens < MANY_TOKENS else DECODE_CONFIG_MANY


_TILE = 8192          # max elements of one expert-stacked weight tile per load (per gate / up / down)


@triton.jit
def _experts_gate_up_kernel(x, logits, ids, rw, w, act, E, I, H, stride_x, stride_l, stride_we, stride_wn,
                            stride_act, TOPK: tl.constexpr, KB: tl.constexpr, ROUTE: tl.constexpr,
                            BE: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN: tl.constexpr,
                            PDL: tl.constexpr = False):
    """act[t·TOPK + j, n] = silu(Σ_h w[e_tj, n, h] x[t, h]) · Σ_h w[e_tj, I + n, h] x[t, h] for all j.
    ROUTE: e_t (and the weights) from the router logits of token t (`_topk_of_row`); programs of
    n-block 0 store them to ids / rw [T, TOPK] for the down kernel. Otherwise e_t is read from ids."""
    pdl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    nb = tl.program_id(1)
    o_j = tl.arange(0, KB)
    mj = o_j < TOPK
    if ROUTE:
        wv, e = _topk_of_row(logits + t * stride_l, E, TOPK, BE, KB)
        if nb == 0:
            tl.store(rw + t * TOPK + o_j, wv.to(rw.dtype.element_ty), mask=mj)
            tl.store(ids + t * TOPK + o_j, e, mask=mj)
    else:
        e = tl.load(ids + t * TOPK + o_j, mask=mj, other=0).to(tl.int64)
    o_n = nb * BN + tl.arange(0, BN)
    mn = o_n < I
    o_k = tl.arange(0, BK)
    # NOTE: the KB experts' tiles form one [KB, BN, BK] load, so all k experts' bytes are in flight at once.
    wg = w + e[:, None, None] * stride_we + o_n[None, :, None].to(tl.int64) * stride_wn + o_k[None, None, :]
    wu = wg + I * stride_wn
    xr = x + t * stride_x + o_k
    accg = tl.zeros([KB, BN], dtype=tl.float32)
    accu = tl.zeros([KB, BN], dtype=tl.float32)
    for k0 in range(0, H, BK):
        if EVEN:
            xv = tl.load(xr + k0).to(tl.float32)
            g = tl.load(wg + k0, eviction_policy="evict_first")
            u = tl.load(wu + k0, eviction_policy="evict_first")
        else:
            mk = o_k < H - k0
            m3 = mj[:, None, None] & mn[None, :, None] & mk[None, None, :]
            xv = tl.load(xr + k0, mask=mk, other=0.0).to(tl.float32)
            g = tl.load(wg + k0, mask=m3, other=0.0, eviction_policy="evict_first")
            u = tl.load(wu + k0, mask=m3, other=0.0, eviction_policy="evict_first")
        accg += tl.sum(g.to(tl.float32) * xv[None, None, :], 2)
        accu += tl.sum(u.to(tl.float32) * xv[None, None, :], 2)
    a = accg / (1.0 + tl.exp(-accg)) * accu
    tl.store(act + (t * TOPK + o_j)[:, None] * stride_act + o_n[None, :], a.to(act.dtype.element_ty),
             mask=mj[:, None] & mn[None, :])


@triton.jit
def _experts_gate_up_rows_kernel(x, ids, w, act, I, H, stride_x, stride_we, stride_wn, stride_act,
                                 TOPK: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN: tl.constexpr,
                                 PDL: tl.constexpr = False):
    """The act of `_experts_gate_up_kernel` from a routing (ids), one expert per program
    (`DecodeConfig.up_stream`): program (n-block, t·TOPK + j) streams [BN, BK] blocks of expert e_tj's gate
    rows and up rows over H with the GEMV's one-row blocks (`gemv._load_w` / `_gemv_block`: products kept
    per lane, reduced once at the end), block k+1 loaded before block k's products."""
    pdl.enter(PDL)
    nb = tl.program_id(0)
    p = tl.program_id(1).to(tl.int64)
    e = tl.load(ids + p).to(tl.int64)
    o_n = nb * BN + tl.arange(0, BN)
    # NOTE: rows past I are clamped to I - 1 (in bounds, never stored), so only K needs a mask.
    g_rows = w + e * stride_we + tl.minimum(o_n, I - 1).to(tl.int64)[:, None] * stride_wn
    u_rows = g_rows + I * stride_wn
    x_row = x + (p // TOPK) * stride_x
    accg = tl.zeros([BN, BK], dtype=tl.float32)
    accu = tl.zeros([BN, BK], dtype=tl.float32)
    offs_k = tl.arange(0, BK)
    g = _load_w(g_rows, offs_k, H, EVEN, BK)
    u = _load_w(u_rows, offs_k, H, EVEN, BK)
    for k0 in range(BK, H, BK):
        offs_next = k0 + tl.arange(0, BK)
        g_next = _load_w(g_rows, offs_next, H, EVEN, BK)
        u_next = _load_w(u_rows, offs_next, H, EVEN, BK)
        accg = _gemv_block(accg, g, x_row, offs_k, H, H, 1, False, EVEN, "ieee", False, BK, x, 0.0, False)
        accu = _gemv_block(accu, u, x_row, offs_k, H, H, 1, False, EVEN, "ieee", False, BK, x, 0.0, False)
        g, u, offs_k = g_next, u_next, offs_next
    accg = _gemv_block(accg, g, x_row, offs_k, H, H, 1, False, EVEN, "ieee", False, BK, x, 0.0, False)
    accu = _gemv_block(accu, u, x_row, offs_k, H, H, 1, False, EVEN, "ieee", False, BK, x, 0.0, False)
    a = tl.sum(accg, 1)
    a = a / (1.0 + tl.exp(-a)) * tl.sum(accu, 1)
    tl.store(act + p * stride_act + o_n, a.to(act.dtype.element_ty), mask=o_n < I)


@triton.jit
def _experts_down_kernel(act, ids, rw, down, out, sgu, sg, sdown, H, I, Is, KMAX,
                         stride_act, stride_de, stride_dn, stride_out, stride_sgu, stride_sg, stride_sdn,
                         TOPK: tl.constexpr, KB: tl.constexpr, HAS_SHARED: tl.constexpr, BN: tl.constexpr,
                         BK: tl.constexpr, EVEN: tl.constexpr, ONE_BLOCK: tl.constexpr, EARLY: tl.constexpr = False,
                         PDL: tl.constexpr = False):
    """out[t, n] = Σ_j rw[t, j] Σ_i down[ids[t, j], n, i] act[t·TOPK + j, i]
                   (+ sigmoid(sg[t]) Σ_i sdown[n, i] silu(sgu[t, i]) sgu[t, Is + i]); KMAX = max(I, Is).
    ONE_BLOCK (KMAX <= BK): no K loop. EARLY (ONE_BLOCK only, asserted; `DecodeConfig.down_early`): ids, rw, the
    shared inputs and every weight tile are loaded before the PDL wait. That is sound only when they were
    written before the previous kernel (the gate|up kernel) started: a PDL kernel is scheduled only once
    every program of its predecessor has passed its own wait, i.e. once everything before that has
    completed. They are read past L1 (.cg)."""
    if not EARLY:
        pdl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    o_n = tl.program_id(1) * BN + tl.arange(0, BN)
    mn = o_n < H
    o_j = tl.arange(0, KB)
    mj = o_j < TOPK
    o_k = tl.arange(0, BK)
    e = pdl.load_input(ids + t * TOPK + o_j, mj, 0, EARLY).to(tl.int64)
    wj = pdl.load_input(rw + t * TOPK + o_j, mj, 0.0, EARLY).to(tl.float32)
    dp = down + e[:, None, None] * stride_de + o_n[None, :, None].to(tl.int64) * stride_dn + o_k[None, None, :]
    ap = act + (t * TOPK + o_j)[:, None] * stride_act + o_k[None, :]
    acc = tl.zeros([KB, BN], dtype=tl.float32)
    sacc = tl.zeros([BN], dtype=tl.float32)
    if HAS_SHARED:
        gl = pdl.load_input(sg + t * stride_sg, None, None, EARLY).to(tl.float32)
        sp = sdown + o_n[:, None].to(tl.int64) * stride_sdn + o_k[None, :]
        gp = sgu + t * stride_sgu + o_k
    else:
        gl = 0.0
        sp = dp
        gp = dp
    if ONE_BLOCK:
        # NOTE: one K block (KMAX <= BK, the 35B-A3B tiles) without a loop: 48 registers on sm_90 at the
        #       35B-A3B tiles, where the same loop (one trip) takes 128 (`bench/kernels_sm90.py`).
        d, sv, g, u = _down_weights(dp, sp, gp, 0, I, Is, mj, mn, o_k, HAS_SHARED, EVEN, EARLY)
        if EARLY:
            pdl.enter(PDL)
        acc, sacc = _down_products(acc, sacc, d, sv, g, u, ap, 0, I, mj, o_k, HAS_SHARED, EVEN)
    else:
        tl.static_assert(not EARLY, "EARLY needs ONE_BLOCK")
        for k0 in range(0, KMAX, BK):
            d, sv, g, u = _down_weights(dp, sp, gp, k0, I, Is, mj, mn, o_k, HAS_SHARED, EVEN, False)
            acc, sacc = _down_products(acc, sacc, d, sv, g, u, ap, k0, I, mj, o_k, HAS_SHARED, EVEN)
    res = tl.sum(acc * wj[:, None], 0)
    if HAS_SHARED:
        res += sacc / (1.0 + tl.exp(-gl))
    tl.store(out + t * stride_out + o_n, res.to(out.dtype.element_ty), mask=mn)


@triton.jit
def _down_weights(dp, sp, gp, k0, I, Is, mj, mn, o_k, HAS_SHARED: tl.constexpr, EVEN: tl.constexpr,
                  EARLY: tl.constexpr):
    """One K block's loads of the down kernel bar act: the routed experts' [KB, BN, BK] weights, the
    shared expert's [BN, BK] weights and its gate / up inputs (fp32; zeros without a shared expert).
    EARLY: the inputs past L1 (.cg), as before the PDL wait."""
    if EVEN:
        d = tl.load(dp + k0, eviction_policy="evict_first")
    else:
        mk = o_k < I - k0
        d = tl.load(dp + k0, mask=mj[:, None, None] & mn[None, :, None] & mk[None, None, :], other=0.0,
                    eviction_policy="evict_first")
    if HAS_SHARED:
        if EVEN:
            s = tl.load(sp + k0, eviction_policy="evict_first")
            g = pdl.load_input(gp + k0, None, None, EARLY).to(tl.float32)
            u = pdl.load_input(gp + Is + k0, None, None, EARLY).to(tl.float32)
        else:
            ms = o_k < Is - k0
            s = tl.load(sp + k0, mask=mn[:, None] & ms[None, :], other=0.0, eviction_policy="evict_first")
            g = pdl.load_input(gp + k0, ms, 0.0, EARLY).to(tl.float32)
            u = pdl.load_input(gp + Is + k0, ms, 0.0, EARLY).to(tl.float32)
    else:
        s = d
        g = tl.zeros([o_k.shape[0]], dtype=tl.float32)
        u = g
    return d, s, g, u


@triton.jit
def _down_products(acc, sacc, d, s, g, u, ap, k0, I, mj, o_k, HAS_SHARED: tl.constexpr, EVEN: tl.constexpr):
    """acc += the routed experts' products with the act rows' K block, sacc += the shared expert's with
    silu(gate) * up."""
    if EVEN:
        a = tl.load(ap + k0)
    else:
        a = tl.load(ap + k0, mask=mj[:, None] & (o_k < I - k0)[None, :], other=0.0)
    acc += tl.sum(d.to(tl.float32) * a.to(tl.float32)[:, None, :], 2)
    if HAS_SHARED:
        sacc += tl.sum(s.to(tl.float32) * (g / (1.0 + tl.exp(-g)) * u)[None, :], 1)
    return acc, sacc


def _tile_k(kb: int, bn: int, bk: int, length: int) -> int:
    return max(16, min(bk, triton.next_power_of_2(length), _TILE // (kb * bn)))


def _decode(x, gate_up, down, shared, k, *, ids=None, weights=None, logits=None, config=None):
    """Routed (+ shared) experts at decode sizes, two launches. Either ids/weights [T, k] (a routing)
    or logits [T, E] (routing inside the gate|up kernel; with `up_stream` tiles in `route_topk`'s kernel
    first). Returns (out [T, H], weights, ids)."""
    T, H = x.shape
    cfg = config or decode_config(T)
    E, I = down.shape[0], down.shape[-1]
    KB = triton.next_power_of_2(k)
    dev = x.device
    if logits is not None and cfg.up_stream:
        # NOTE: the one-expert-per-program kernel reads ids: every program routing the token itself was
        #       measured slower (bench/NOTES.md session 23: 28.71 vs 26.66 us per layer at T=1).
        weights, ids = route_topk(logits, k)
        logits = None
    route = logits is not None
    if route:
        weights = torch.empty(T, k, dtype=logits.dtype, device=dev)
        ids = torch.empty(T, k, dtype=torch.int64, device=dev)
        lg, stride_l = logits, logits.stride(0)
    else:
        lg, stride_l = weights, 0                    # unused (ROUTE=False)
    # NOTE: bandwidth (35B-A3B, bf16, T=1): 8 selected experts = 32 MiB gate|up + 16 MiB down, plus 2 MiB
    #       of shared down: ~12 us at 4.3 TB/s. Each program issues all k experts' tiles of a step as one
    #       load. What bounds the bytes in flight is registers (`bench/kernels_sm90.py`, sm_90): gate|up
    #       [8, 1, 1024] x 2 = 32 KiB per step at 235 regs x 128 threads -> 2 programs = 64 KiB per SM (2
    #       steps over H; 512 programs per token, ~2 waves on 132 SMs); down [8, 2, 512] + shared [2, 512]
    #       = 18 KiB in one step at 48 regs (no K loop) -> up to 10 programs per SM (1024 programs per
    #       token). The routing (k max-rounds over E in registers) is recomputed by every gate|up program
    #       of the token instead of a launch of its own. Measured and not kept (pass 7, bench/NOTES.md): the
    #       down kernel routing from the logits itself to load its tiles before the PDL wait (+0.11 ms per
    #       35B-A3B step: its early programs held the SM slots of the gate|up kernel's second wave), and
    #       the post-mixer norm / residual add folded into these two kernels (no change with shared_in on
    #       the Triton GEMV); pass 8: the gate|up programs prefetching the selected experts' down weights
    #       into L2 (cp.async.bulk.prefetch, +0.09 ms per step); pass 9: the residual add in the down kernel
    #       (the next GEMV then reads its 1024 tiles' sums of squares) with shared_in's GEMV storing the
    #       normed row for these kernels, 80 launches fewer: +0.04 ms per step.
    bn1 = min(cfg.up_bn, triton.next_power_of_2(I))
    act = torch.empty(T * k, I, dtype=x.dtype, device=dev)
    if cfg.up_stream:
        bk1 = _tile_k(1, bn1, cfg.up_bk, H)
        _experts_gate_up_rows_kernel[(triton.cdiv(I, bn1), T * k)](
            x, ids, gate_up, act, I, H, x.stride(0), gate_up.stride(0), gate_up.stride(1), act.stride(0),
            TOPK=k, BN=bn1, BK=bk1, EVEN=H % bk1 == 0, num_warps=cfg.up_warps, **pdl.launch())
    else:
        bk1 = _tile_k(KB, bn1, cfg.up_bk, H)
        _experts_gate_up_kernel[(T, triton.cdiv(I, bn1))](
            x, lg, ids, weights, gate_up, act, E, I, H, x.stride(0), stride_l, gate_up.stride(0),
            gate_up.stride(1), act.stride(0), TOPK=k, KB=KB, ROUTE=route, BE=triton.next_power_of_2(E), BN=bn1,
            BK=bk1, EVEN=KB == k and I % bn1 == 0 and H % bk1 == 0, num_warps=cfg.up_warps, **pdl.launch())
    out = torch.empty(T, H, dtype=x.dtype, device=dev)
    Is, s_args, s_strides = _shared_args(shared, act, I)
    kmax = max(I, Is)
    bn2 = min(cfg.down_bn, triton.next_power_of_2(H))
    bk2 = _tile_k(KB, bn2, cfg.down_bk, kmax)
    one_block = kmax <= bk2
    _experts_down_kernel[(T, triton.cdiv(H, bn2))](
        act, ids, weights, down, out, *s_args, H, I, Is, kmax,
        act.stride(0), down.stride(0), down.stride(1), out.stride(0), *s_strides,
        TOPK=k, KB=KB, HAS_SHARED=shared is not None, BN=bn2, BK=bk2,
        EVEN=KB == k and H % bn2 == 0 and I == Is and I % bk2 == 0, ONE_BLOCK=one_block,
        EARLY=bool(cfg.down_early) and not route and one_block, num_warps=cfg.down_warps, **pdl.launch())
    return out, weights, ids


# ------------------------------------------------------------------------------------------------
# prefill: grouped GEMM over pairs sorted by expert
# ------------------------------------------------------------------------------------------------
# NOTE: not specialised on P and NB: P = 8 T is divisible by 16 only for even T, and an odd eager stage
#       over a prefix paid a ~0.4 s compile on first use (bench/NOTES.md session 19).
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
#       MMAs; BM=64 wastes less on the partial last block below that. Swept with bench/moe_prefill.py on
#       the H200, 35B-A3B sizes (bench/NOTES.md, sessions 16-17):
#       T=8192: gate|up 128-column halves with 4 stages 0.707 ms (was 0.742 with 64), down 256 columns
#       0.462 ms (0.506 with 128), the sort's 4096-pair chunks on 8 warps 109 us (152 with 1024 on 4).
#       T=1024 (32 rows per expert; weight-read bound: gate|up at 0.88 of the byte floor): the small
#       tiles were the best within 1 %, the sort 18 us (22).
#       The switch (session 17), gate|up + down per layer, small -> large tiles: T=2048 (64 rows per
#       expert) 0.537 -> 0.504 ms, 4096 0.796 -> 0.688, 6144 1.074 -> 0.946, 8000 1.315 -> 1.118; the
#       down GEMM's 4 stages beat 3 by 1-5 % at every one of these T.
#       fp32 inputs (the fp32 Program of the parity tests) keep the narrower large tiles: the wide ones'
#       fp32 stages exceed the shared memory.
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
#       pairs twice in every program: E x P work, 174 us per 35B-A3B layer at 8192 tokens (H200, session
#       30's profile: 7 ms of the 8k prefill). The chunked sort (two launches: per CH-pair chunk a histogram
#       and an in-register sort of its keys, then per chunk a scatter to rows derived from all the chunks'
#       histograms) does P log CH work. It needs the [SORT_NC, E] histogram in one program's registers, so
#       it runs up to SORT_CH * SORT_NC pairs (a PREFILL_CHUNK pass at top 8) and E <= 256; `CHUNKED_SORT`
#       (read at call time) picks it from CHUNKED_SORT_MIN_PAIRS pairs.
CHUNKED_SORT = True
CHUNKED_SORT_MIN_PAIRS = 8192
SORT_CH = 1024           # pairs per chunk (one compiled form: the serve warmup's lengths cover it)
SORT_NC = 64             # chunks at most (P <= SORT_CH * SORT_NC; the histogram tile is [SORT_NC, next_pow2(E)])
SORT_MAX_CELLS = 16384


def _chunked_sort_ok(P: int, E: int) -> bool:
    return 0 < P <= SORT_CH * SORT_NC and SORT_NC * triton.next_power_of_2(E) <= SORT_MAX_CELLS


def sort_pairs(ids: torch.Tensor, weights: torch.Tensor, E: int, BM: int, *, chunk: int = 4096, warps: int = 8,
               chunked: bool | None = None):
    """The pairs of a routing sorted by expert for the grouped GEMMs (no host sync):
    (starts [E + 1] int32, block_expert [NB] int32, order [P] int64, sorted_tok [P] int64, sorted_w [P]),
    NB = E + P // BM. order is torch.sort(ids.flatten(), stable=True)'s indices. chunked: the chunked sort
    (None: CHUNKED_SORT from CHUNKED_SORT_MIN_PAIRS pairs, where its shape fits); otherwise one launch of
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
        chunked = CHUNKED_SORT and P >= CHUNKED_SORT_MIN_PAIRS
    if chunked and _chunked_sort_ok(P, E):
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


def _prefill_routed(x, ids, weights, gate_up, down, tiles: PrefillTiles | None = None):
    """Routed experts' weighted contributions y [P, H] (pair order) in x.dtype. All bookkeeping on the GPU
    (no host sync): one sort launch, the two grouped GEMMs. tiles: `prefill_tiles(P, E, x.dtype)` unless
    given (bench/moe_prefill.py sweeps them)."""
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


def moe_experts(x: torch.Tensor, routing: MoeRouting, gate_up: torch.Tensor, down: torch.Tensor,
                *, shared: SharedExpert | None = None, legacy: bool = False,
                config: DecodeConfig | None = None, residual: torch.Tensor | None = None):
    """See `ninfer.ops.reference.moe.moe_experts`. x [T, H]; routing ids/weights [T, k]; gate_up [E, 2I, H];
    down [E, H, I]; shared: optional `SharedExpert` (gate_up [T, 2Is], gate [T, 1], down [H, Is]).
    Returns [T, H] in x.dtype. legacy / config: the decode kernels (bench/moe_decode.py A/B only).
    residual [T, H] (the schedule's residual stream, `ninfer.ops.reference.fused`): at prefill sizes the combine
    adds the result into it in place and `Residual(residual, None)` is returned (PREFILL_RESIDUAL_COMBINE);
    at decode sizes, or when it cannot (dtype, shape, layout), the plain result, the add left to the caller."""
    T, H = x.shape
    k = routing.ids.shape[1]
    if T == 0:
        return torch.zeros_like(x)
    x = _rows(x)
    gate_up, down = _rows(gate_up), _rows(down)
    ids, weights = routing.ids.contiguous(), routing.weights.contiguous()
    if T * k <= MAX_PAIRS:
        if legacy:
            return _decode_legacy(x, ids, weights, gate_up, down, shared)
        return _decode(x, gate_up, down, shared, k, ids=ids, weights=weights, config=config)[0]
    return _prefill(x, ids, weights, gate_up, down, shared, residual=residual)


# NOTE: from 2 tokens the routing runs once per token in its own kernel (`route_topk`) before the expert
#       kernels, not in each of the gate|up kernel's T x I programs before their weight loads: per 35B-A3B
#       MoE layer (bench/moe_decode.py, PDL on, session 22) T=1 25.25 us in-kernel vs 25.41 apart; T=2 46.34
#       vs 44.74, T=4 73.14 vs 71.50, T=8 119.7 vs 114.8; in the step (bench/step_ab.py) B=2 3.351 -> 3.247 ms,
#       B=8 6.676 -> 6.450.
ROUTE_APART_TOKENS = 2


def route_moe_experts(x: torch.Tensor, router_logits: torch.Tensor, top_k: int, gate_up: torch.Tensor,
                      down: torch.Tensor, *, shared: SharedExpert | None = None, legacy: bool = False,
                      config: DecodeConfig | None = None, residual: torch.Tensor | None = None):
    """See `ninfer.ops.reference.moe.route_moe_experts`: `moe_experts(x, route_topk(router_logits, top_k), ...)`.
    router_logits [T, E] (rows may be strided). For one token the routing runs inside the first expert
    kernel (two launches in all), for 2..MAX_PAIRS / top_k tokens in its own kernel before them
    (ROUTE_APART_TOKENS); legacy: the separate routing kernel and the old kernels. residual: as in
    `moe_experts` (folded at prefill sizes only)."""
    T, E = router_logits.shape
    if not 0 < top_k <= E:
        raise ValueError(f"top_k must be in 1..{E}, got {top_k}")
    if T == 0 or T * top_k > MAX_PAIRS or legacy or T >= ROUTE_APART_TOKENS:
        return moe_experts(x, route_topk(router_logits, top_k), gate_up, down, shared=shared, legacy=legacy,
                           config=config, residual=residual)
    lg = router_logits if router_logits.stride(1) == 1 else router_logits.contiguous()
    return _decode(_rows(x), _rows(gate_up), _rows(down), shared, top_k, logits=lg, config=config)[0]


# NOTE: the MoE block's output joins the residual stream in its combine (prompt stages): the next norm
#       then reads and writes one [T, H] tensor instead of two each, as the GEMMs' addmm_ fold does for the
#       mixers and the dense MLP (`gemv.PREFILL_RESIDUAL_GEMM`). Read at call time; False: the plain result.
PREFILL_RESIDUAL_COMBINE = True


def _combine_target(residual, x):
    """The residual as [T, H] rows the combine may update in place, or None (not folded)."""
    if (not PREFILL_RESIDUAL_COMBINE or residual is None or residual.dtype != x.dtype or residual.device != x.device
            or residual.numel() != x.numel() or not residual.is_contiguous()):
        return None
    return residual.view(x.shape)


def _prefill(x, ids, weights, gate_up, down, shared, residual=None):
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
        y = _prefill_routed(x[s0:s0 + n], ids[s0:s0 + n], weights[s0:s0 + n], gate_up, down)
        o = out[s0:s0 + n]
        if shared is not None:
            g, sv = shared.gate[s0:s0 + n], s_all[s0:s0 + n]
            args = (g, sv, o, H, g.stride(0), sv.stride(0), o.stride(0))
        else:
            args = (o, o, o, H, 0, 0, o.stride(0))
        _combine_kernel[(n, triton.cdiv(H, BH))](y, *args, K=k, HAS_SHARED=shared is not None, BH=BH,
                                                 ADD_OUT=fold is not None, num_warps=4)
    return out if fold is None else Residual(fold, None)
