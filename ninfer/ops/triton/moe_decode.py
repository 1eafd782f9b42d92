"""MoE routed experts at decode sizes (Triton): a grouped GEMV in two launches, no host sync.

    act[t·k + j] = silu(gate_up[e_tj, :I] @ x[t]) * (gate_up[e_tj, I:] @ x[t])   [T·k, I] x.dtype  grid (T, I/BN)
    out[t] = Σ_j w[t, j] · down[e_tj] @ act[t·k + j]                            [T, H] x.dtype    grid (T, H/BN)
             (+ sigmoid(shared.gate[t]) · shared.down @ silu_mul(shared.gate_up[t]))

Each program handles all k experts of one token: its weight tiles are one [KB, BN, BK] load (KB =
next_pow2(k) experts' rows at once), so the bytes in flight per SM are what a streaming read of HBM
needs; registers bound them, which is what the tiles (`DecodeConfig`) trade. The second kernel loads
the shared expert's tile in the same step and applies the routing weights, the shared sigmoid gate and
the sum in registers (fp32), so no [T·k, H] intermediate, torch sum or cast is left. With router logits
instead of a routing, every gate|up program of token t runs `topk_of_row` on its E logits and the
programs of n-block 0 store the weights and ids for the down kernel (one launch less). Expert ids stay
on the GPU (CUDA-graph capturable).

The tiles come from the tuning table `ninfer/ops/configs/moe_decode.json` (`bench/moe_decode.py --write`):
one set for one token, another from `many_from` tokens.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ninfer.ops import tuning
from ninfer.ops.triton import pdl
from ninfer.ops.triton.moe_routing import topk_of_row

__all__ = ["DecodeConfig", "DecodeTable", "decode_table", "decode_config", "decode", "rows"]


class DecodeConfig(NamedTuple):
    """Tiles of the decode kernels. Gate|up: program (t, n-block) streams [KB, up_bn, up_bk] gate and up
    tiles (KB = next_pow2(k) experts at once) per step over H; down: program (t, n-block) streams a
    [KB, down_bn, down_bk] tile of the routed experts and [down_bn, down_bk] of the shared one per
    step over I. `bench/moe_decode.py --sweep` times alternatives."""
    up_bn: int = 1
    up_bk: int = 512
    up_warps: int = 4
    down_bn: int = 2
    down_bk: int = 512
    down_warps: int = 4


class DecodeTable(NamedTuple):
    """The decode tiles of one device kind: `one_token` below `many_from` tokens, `many_tokens` from there."""
    one_token: DecodeConfig
    many_tokens: DecodeConfig
    many_from: int


def parse_table(entry: dict) -> DecodeTable:
    """A `moe_decode.json` entry -> DecodeTable (ValueError on a malformed one)."""
    try:
        return DecodeTable(DecodeConfig(**entry["one_token"]), DecodeConfig(**entry["many_tokens"]),
                           int(entry["many_from"]))
    except (KeyError, TypeError) as e:
        raise ValueError(f"moe_decode tuning entry: expected one_token, many_tokens (DecodeConfig fields) and "
                         f"many_from, got {entry!r} ({e})") from e


@functools.cache
def decode_table(kind: str | None = None) -> DecodeTable:
    """The decode tiles of device `kind` (None: this process's CUDA device) from `moe_decode.json`."""
    return parse_table(tuning.load_entry("moe_decode", kind))


def decode_config(tokens: int) -> DecodeConfig:
    """The decode tiles for `tokens` rows (the one place the choice is made)."""
    t = decode_table()
    return t.one_token if tokens < t.many_from else t.many_tokens


_TILE = 8192          # max elements of one expert-stacked weight tile per load (per gate / up / down)


def rows(t: torch.Tensor) -> torch.Tensor:
    """t with a unit last stride (itself when it has one)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _shared_args(shared, act: torch.Tensor, width_if_none: int):
    """(Is, (gate_up, gate, down), their row strides) of the shared expert for the down kernel; without
    one, `act` stands in for the (unread) pointers with zero strides and Is = width_if_none."""
    if shared is None:
        return width_if_none, (act, act, act), (0, 0, 0)
    sgu, sg, sdown = rows(shared.gate_up), shared.gate, rows(shared.down)
    return sdown.shape[1], (sgu, sg, sdown), (sgu.stride(0), sg.stride(0), sdown.stride(0))


@triton.jit
def _experts_gate_up_kernel(x, logits, ids, rw, w, act, E, I, H, stride_x, stride_l, stride_we, stride_wn,
                            stride_act, TOPK: tl.constexpr, KB: tl.constexpr, ROUTE: tl.constexpr,
                            BE: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN: tl.constexpr,
                            PDL: tl.constexpr = False):
    """act[t·TOPK + j, n] = silu(Σ_h w[e_tj, n, h] x[t, h]) · Σ_h w[e_tj, I + n, h] x[t, h] for all j.
    ROUTE: e_t (and the weights) from the router logits of token t (`topk_of_row`); programs of
    n-block 0 store them to ids / rw [T, TOPK] for the down kernel. Otherwise e_t is read from ids."""
    pdl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    nb = tl.program_id(1)
    o_j = tl.arange(0, KB)
    mj = o_j < TOPK
    if ROUTE:
        wv, e = topk_of_row(logits + t * stride_l, E, TOPK, BE, KB)
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
def _experts_down_kernel(act, ids, rw, down, out, sgu, sg, sdown, H, I, Is, KMAX,
                         stride_act, stride_de, stride_dn, stride_out, stride_sgu, stride_sg, stride_sdn,
                         TOPK: tl.constexpr, KB: tl.constexpr, HAS_SHARED: tl.constexpr, BN: tl.constexpr,
                         BK: tl.constexpr, EVEN: tl.constexpr, ONE_BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """out[t, n] = Σ_j rw[t, j] Σ_i down[ids[t, j], n, i] act[t·TOPK + j, i]
                   (+ sigmoid(sg[t]) Σ_i sdown[n, i] silu(sgu[t, i]) sgu[t, Is + i]); KMAX = max(I, Is).
    ONE_BLOCK (KMAX <= BK): no K loop."""
    pdl.enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    o_n = tl.program_id(1) * BN + tl.arange(0, BN)
    mn = o_n < H
    o_j = tl.arange(0, KB)
    mj = o_j < TOPK
    o_k = tl.arange(0, BK)
    e = tl.load(ids + t * TOPK + o_j, mask=mj, other=0).to(tl.int64)
    wj = tl.load(rw + t * TOPK + o_j, mask=mj, other=0.0).to(tl.float32)
    dp = down + e[:, None, None] * stride_de + o_n[None, :, None].to(tl.int64) * stride_dn + o_k[None, None, :]
    ap = act + (t * TOPK + o_j)[:, None] * stride_act + o_k[None, :]
    acc = tl.zeros([KB, BN], dtype=tl.float32)
    sacc = tl.zeros([BN], dtype=tl.float32)
    if HAS_SHARED:
        gl = tl.load(sg + t * stride_sg).to(tl.float32)
        sp = sdown + o_n[:, None].to(tl.int64) * stride_sdn + o_k[None, :]
        gp = sgu + t * stride_sgu + o_k
    else:
        gl = 0.0
        sp = dp
        gp = dp
    if ONE_BLOCK:
        # NOTE: one K block (KMAX <= BK, the 35B-A3B tiles) without a loop: the loop (one trip) would take
        #       far more registers on sm_90.
        d, sv, g, u = _down_weights(dp, sp, gp, 0, I, Is, mj, mn, o_k, HAS_SHARED, EVEN)
        acc, sacc = _down_products(acc, sacc, d, sv, g, u, ap, 0, I, mj, o_k, HAS_SHARED, EVEN)
    else:
        for k0 in range(0, KMAX, BK):
            d, sv, g, u = _down_weights(dp, sp, gp, k0, I, Is, mj, mn, o_k, HAS_SHARED, EVEN)
            acc, sacc = _down_products(acc, sacc, d, sv, g, u, ap, k0, I, mj, o_k, HAS_SHARED, EVEN)
    res = tl.sum(acc * wj[:, None], 0)
    if HAS_SHARED:
        res += sacc / (1.0 + tl.exp(-gl))
    tl.store(out + t * stride_out + o_n, res.to(out.dtype.element_ty), mask=mn)


@triton.jit
def _down_weights(dp, sp, gp, k0, I, Is, mj, mn, o_k, HAS_SHARED: tl.constexpr, EVEN: tl.constexpr):
    """One K block's loads of the down kernel bar act: the routed experts' [KB, BN, BK] weights, the
    shared expert's [BN, BK] weights and its gate / up inputs (fp32; zeros without a shared expert)."""
    if EVEN:
        d = tl.load(dp + k0, eviction_policy="evict_first")
    else:
        mk = o_k < I - k0
        d = tl.load(dp + k0, mask=mj[:, None, None] & mn[None, :, None] & mk[None, None, :], other=0.0,
                    eviction_policy="evict_first")
    if HAS_SHARED:
        if EVEN:
            s = tl.load(sp + k0, eviction_policy="evict_first")
            g = tl.load(gp + k0).to(tl.float32)
            u = tl.load(gp + Is + k0).to(tl.float32)
        else:
            ms = o_k < Is - k0
            s = tl.load(sp + k0, mask=mn[:, None] & ms[None, :], other=0.0, eviction_policy="evict_first")
            g = tl.load(gp + k0, mask=ms, other=0.0).to(tl.float32)
            u = tl.load(gp + Is + k0, mask=ms, other=0.0).to(tl.float32)
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


def decode(x, gate_up, down, shared, k, *, ids=None, weights=None, logits=None, config=None):
    """Routed (+ shared) experts at decode sizes, two launches. Either ids/weights [T, k] (a routing)
    or logits [T, E] (routing inside the gate|up kernel). x [T, H], gate_up [E, 2I, H], down [E, H, I]
    (unit last strides); shared: `SharedExpert` or None; config: the tiles (default `decode_config(T)`).
    Returns (out [T, H], weights, ids)."""
    T, H = x.shape
    cfg = config or decode_config(T)
    E, I = down.shape[0], down.shape[-1]
    KB = triton.next_power_of_2(k)
    dev = x.device
    route = logits is not None
    if route:
        weights = torch.empty(T, k, dtype=logits.dtype, device=dev)
        ids = torch.empty(T, k, dtype=torch.int64, device=dev)
        lg, stride_l = logits, logits.stride(0)
    else:
        lg, stride_l = weights, 0                    # unused (ROUTE=False)
    bn1 = min(cfg.up_bn, triton.next_power_of_2(I))
    act = torch.empty(T * k, I, dtype=x.dtype, device=dev)
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
    _experts_down_kernel[(T, triton.cdiv(H, bn2))](
        act, ids, weights, down, out, *s_args, H, I, Is, kmax,
        act.stride(0), down.stride(0), down.stride(1), out.stride(0), *s_strides,
        TOPK=k, KB=KB, HAS_SHARED=shared is not None, BN=bn2, BK=bk2,
        EVEN=KB == k and H % bn2 == 0 and I == Is and I % bk2 == 0, ONE_BLOCK=kmax <= bk2,
        num_warps=cfg.down_warps, **pdl.launch())
    return out, weights, ids
