"""One Triton kernel for the state part of a GDN decode step: gates, causal conv update, gated delta rule.

`gdn_conv_recurrent` has the arguments and result of `ninfer.ops.reference.fused.gdn_conv_recurrent` (the
oracle: `gdn_gates`, `causal_conv1d_update`, then `fused_recurrent_gated_delta_rule` with q/k
L2-norm). Each program computes its head's gates from the raw projections a, b. Program
(b, hv, v-block) recomputes the depthwise conv of the channels it reads (its q/k head, 2 x K
channels, and its BV value channels: 4 taps each, cheap) instead of reading a conv output that a
separate launch wrote, so the step is one launch instead of three.

Conv state: read at src[b], stepped state written at dst[b]. The q/k channels of a key head are
read by every program of that head, so dst must differ from src (the decode graph's committed
slot -> provisional entry; not checked: entries are data); the v channels are read and written by
one program only. With dst None (in place), or a layout the kernel does not take, the op runs the
fast set's three kernels instead.

`gdn_conv_recurrent_steps` runs T such tokens per row in one launch (the speculative verify forward):
each program keeps its state tile and conv windows in registers across the tokens, reads the states
once at src[b] and stores them after token t at dst[b, t] (no program reads a dst entry), so every
accepted prefix finds its states at an entry of its own.

The output's gated RMSNorm stays a separate kernel, which PDL overlaps with this one's tail
(docs/performance.md, "Decision log").
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

import torch
import triton
import triton.language as tl

from ninfer.ops.reference import fused as _ref
from ninfer.ops.triton import conv as _conv, fused as _fused, gated_delta as _gated_delta, pdl
from ninfer.ops.triton.common import device_index

__all__ = ["gdn_conv_recurrent", "gdn_conv_recurrent_steps"]

# NOTE: the fallback's composition: the fast gates, conv update and delta rule, states in place (as the
#       fast op set calls them).
_THREE_KERNELS = SimpleNamespace(
    gdn_gates=_fused.gdn_gates,
    causal_conv1d_update=functools.partial(_conv.causal_conv1d_update, gather_final_state=False),
    fused_recurrent_gated_delta_rule=functools.partial(_gated_delta.fused_recurrent_gated_delta_rule,
                                                       gather_final_state=False))

@triton.jit
def _conv_window(w, cs_src, ch, m):
    """Channels ch's three past conv inputs at src and four taps (fp32): nothing this step writes."""
    s0 = pdl.load_input(cs_src + ch * 3 + 0, m, 0.0).to(tl.float32)
    s1 = pdl.load_input(cs_src + ch * 3 + 1, m, 0.0).to(tl.float32)
    s2 = pdl.load_input(cs_src + ch * 3 + 2, m, 0.0).to(tl.float32)
    w0 = tl.load(w + ch * 4 + 0, mask=m, other=0.0).to(tl.float32)
    w1 = tl.load(w + ch * 4 + 1, mask=m, other=0.0).to(tl.float32)
    w2 = tl.load(w + ch * 4 + 2, mask=m, other=0.0).to(tl.float32)
    w3 = tl.load(w + ch * 4 + 3, mask=m, other=0.0).to(tl.float32)
    return s0, s1, s2, w0, w1, w2, w3


@triton.jit
def _conv_step(x_row, s0, s1, s2, w0, w1, w2, w3, cs_dst, ch, m, WRITE: tl.constexpr, OUT_TY: tl.constexpr):
    """silu(conv) of channels ch (rounded to the activation dtype like the unfused op), state stepped at dst."""
    xt = tl.load(x_row + ch, mask=m, other=0.0).to(tl.float32)
    acc = w0 * s0 + w1 * s1 + w2 * s2 + w3 * xt
    acc = acc / (1.0 + tl.exp(-acc))
    if WRITE:
        ty = cs_dst.dtype.element_ty
        tl.store(cs_dst + ch * 3 + 0, s1.to(ty), mask=m)
        tl.store(cs_dst + ch * 3 + 1, s2.to(ty), mask=m)
        tl.store(cs_dst + ch * 3 + 2, xt.to(ty), mask=m)
    return acc.to(OUT_TY).to(tl.float32)


@triton.jit
def _gates(p_a, p_b, ga, gdt):
    """Gates as `ops.gdn_gates` from the raw a, b at p_a, p_b: g = -exp(A_log) * softplus(a + dt_bias)
    (torch's threshold 20, log1p kept exact for tiny exp), beta = sigmoid(b) rounded to b's dtype."""
    xa = tl.load(p_a).to(tl.float32) + gdt
    u = tl.exp(tl.minimum(xa, 20.0))
    w1 = 1.0 + u
    lp = tl.where(w1 == 1.0, u, tl.log(w1) * (u / tl.where(w1 == 1.0, 1.0, w1 - 1.0)))
    bg = -tl.exp(ga) * tl.where(xa > 20.0, xa, lp)
    bv_raw = tl.load(p_b).to(tl.float32)
    bb = (1.0 / (1.0 + tl.exp(-bv_raw))).to(p_b.dtype.element_ty).to(tl.float32)
    return bg, bb


@triton.jit
def _delta_rule(S, bq, bk, bv, bg, bb, scale):
    """One gated delta rule token on the state tile S [BK, BV] (q/k L2-normed here, q scaled) -> (S, o [BV])."""
    bq = bq * tl.rsqrt(tl.sum(bq * bq) + 1e-6) * scale
    bk = bk * tl.rsqrt(tl.sum(bk * bk) + 1e-6)
    S = S * tl.exp(bg)
    kv = tl.sum(S * bk[:, None], 0)
    delta = (bv - kv) * bb
    S = S + bk[:, None] * delta[None, :]
    return S, tl.sum(S * bq[:, None], 0)


@triton.jit
def _gdn_conv_recurrent_kernel(
    x, w, conv, a, b, A_log, dt_bias, o, state, src, dst, scale,
    stride_x, stride_cs, stride_a, stride_b,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """The entries, the state tile, the conv windows and taps, A_log and dt_bias are loaded before the
    PDL wait, x, a and b (the in-projection's output) after it. Sound in the
    decode step: the entries come from the step's input copy and the states at src from earlier steps;
    no kernel of the step writes them (src is never written; dst is written here only)."""
    i_b = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    i_h = i_hv // (HV // H)
    s_src = pdl.load_input(src + i_b, None, None).to(tl.int64)
    s_dst = pdl.load_input(dst + i_b, None, None).to(tl.int64)
    x_row = x + i_b.to(tl.int64) * stride_x
    cs_src = conv + s_src * stride_cs
    cs_dst = conv + s_dst * stride_cs
    out_ty = o.dtype.element_ty
    o_k = tl.arange(0, BK)
    mk = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    mv = o_v < V
    # NOTE: the state tile (the bulk of the bytes) is loaded first, so its latency overlaps the conv and
    #       gate math below instead of following it.
    ms = mk[:, None] & mv[None, :]
    p_s = state + s_src * (HV * K * V) + i_hv * (K * V) + o_k[:, None] * V + o_v[None, :]
    S = pdl.load_input(p_s, ms, 0.0)
    ch_q = i_h * K + o_k
    ch_k = H * K + i_h * K + o_k
    ch_v = 2 * H * K + i_hv * V + o_v
    q0, q1, q2, qw0, qw1, qw2, qw3 = _conv_window(w, cs_src, ch_q, mk)
    k0, k1, k2, kw0, kw1, kw2, kw3 = _conv_window(w, cs_src, ch_k, mk)
    v0, v1, v2, vw0, vw1, vw2, vw3 = _conv_window(w, cs_src, ch_v, mv)
    ga = tl.load(A_log + i_hv).to(tl.float32)
    gdt = tl.load(dt_bias + i_hv).to(tl.float32)
    pdl.enter(PDL)
    # NOTE: one program per key head writes its q/k conv state (the first value head of the group,
    #       first V block); every program writes its own value channels.
    qk_writer = (i_v == 0) & (i_hv % (HV // H) == 0)
    if qk_writer:
        bq = _conv_step(x_row, q0, q1, q2, qw0, qw1, qw2, qw3, cs_dst, ch_q, mk, True, out_ty)
        bk = _conv_step(x_row, k0, k1, k2, kw0, kw1, kw2, kw3, cs_dst, ch_k, mk, True, out_ty)
    else:
        bq = _conv_step(x_row, q0, q1, q2, qw0, qw1, qw2, qw3, cs_dst, ch_q, mk, False, out_ty)
        bk = _conv_step(x_row, k0, k1, k2, kw0, kw1, kw2, kw3, cs_dst, ch_k, mk, False, out_ty)
    bv = _conv_step(x_row, v0, v1, v2, vw0, vw1, vw2, vw3, cs_dst, ch_v, mv, True, out_ty)
    bg, bb = _gates(a + i_b.to(tl.int64) * stride_a + i_hv, b + i_b.to(tl.int64) * stride_b + i_hv, ga, gdt)
    S, bo = _delta_rule(S, bq, bk, bv, bg, bb, scale)
    tl.store(o + (i_b.to(tl.int64) * HV + i_hv) * V + o_v, bo.to(out_ty), mask=mv)
    p_d = state + s_dst * (HV * K * V) + i_hv * (K * V) + o_k[:, None] * V + o_v[None, :]
    tl.store(p_d, S.to(state.dtype.element_ty), mask=ms)


@triton.jit
def _conv_shift(x_row, s0, s1, s2, w0, w1, w2, w3, cs_dst, ch, m, m_store, OUT_TY: tl.constexpr):
    """One conv token of channels ch from the window (s0, s1, s2) held in registers: returns silu(conv)
    (rounded to the activation dtype like the unfused op) and the stepped window, which is also stored at
    cs_dst where m_store. The new input enters the window rounded to the state's dtype, as a later
    token reads it back from the stored state."""
    ty = cs_dst.dtype.element_ty
    xt = tl.load(x_row + ch, mask=m, other=0.0).to(tl.float32)
    acc = w0 * s0 + w1 * s1 + w2 * s2 + w3 * xt
    acc = acc / (1.0 + tl.exp(-acc))
    xs = xt.to(ty).to(tl.float32)
    tl.store(cs_dst + ch * 3 + 0, s1.to(ty), mask=m_store)
    tl.store(cs_dst + ch * 3 + 1, s2.to(ty), mask=m_store)
    tl.store(cs_dst + ch * 3 + 2, xs.to(ty), mask=m_store)
    return acc.to(OUT_TY).to(tl.float32), s1, s2, xs


@triton.jit
def _gdn_conv_recurrent_steps_kernel(
    x, w, conv, a, b, A_log, dt_bias, o, state, src, dst, scale,
    stride_xb, stride_xt, stride_cs, stride_ab, stride_at, stride_bb, stride_bt, stride_src, stride_db, stride_dt,
    T: tl.constexpr, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program (b, hv, v-block) steps T tokens of row b: the state tile and the conv windows of its
    channels are read once at src[b] and stay in registers; after token t both are stored at dst[b, t].
    No program reads a dst entry, so the q/k windows that every program of a key head keeps (one of them
    stores them) need no ordering between programs. What is loaded before the PDL wait is as in
    `_gdn_conv_recurrent_kernel` (src[b], the states at src[b], the weights); the dst entries, x, a and b
    after it."""
    i_b = tl.program_id(0)
    i_hv = tl.program_id(1)
    i_v = tl.program_id(2)
    i_h = i_hv // (HV // H)
    i_b64 = i_b.to(tl.int64)
    s_src = pdl.load_input(src + i_b64 * stride_src, None, None).to(tl.int64)
    cs_src = conv + s_src * stride_cs
    out_ty = o.dtype.element_ty
    o_k = tl.arange(0, BK)
    mk = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    mv = o_v < V
    ms = mk[:, None] & mv[None, :]
    p_tile = i_hv * (K * V) + o_k[:, None] * V + o_v[None, :]
    S = pdl.load_input(state + s_src * (HV * K * V) + p_tile, ms, 0.0)
    ch_q = i_h * K + o_k
    ch_k = H * K + i_h * K + o_k
    ch_v = 2 * H * K + i_hv * V + o_v
    q0, q1, q2, qw0, qw1, qw2, qw3 = _conv_window(w, cs_src, ch_q, mk)
    k0, k1, k2, kw0, kw1, kw2, kw3 = _conv_window(w, cs_src, ch_k, mk)
    v0, v1, v2, vw0, vw1, vw2, vw3 = _conv_window(w, cs_src, ch_v, mv)
    ga = tl.load(A_log + i_hv).to(tl.float32)
    gdt = tl.load(dt_bias + i_hv).to(tl.float32)
    pdl.enter(PDL)
    # NOTE: one program per key head stores its q/k windows (the first value head of the group, first V
    #       block); every program stores its own value channels.
    qk_writer = (i_v == 0) & (i_hv % (HV // H) == 0)
    mk_store = mk & qk_writer
    for t in tl.static_range(T):
        s_dst = tl.load(dst + i_b64 * stride_db + t * stride_dt).to(tl.int64)
        cs_dst = conv + s_dst * stride_cs
        x_row = x + i_b64 * stride_xb + t * stride_xt
        bq, q0, q1, q2 = _conv_shift(x_row, q0, q1, q2, qw0, qw1, qw2, qw3, cs_dst, ch_q, mk, mk_store, out_ty)
        bk, k0, k1, k2 = _conv_shift(x_row, k0, k1, k2, kw0, kw1, kw2, kw3, cs_dst, ch_k, mk, mk_store, out_ty)
        bv, v0, v1, v2 = _conv_shift(x_row, v0, v1, v2, vw0, vw1, vw2, vw3, cs_dst, ch_v, mv, mv, out_ty)
        bg, bb = _gates(a + i_b64 * stride_ab + t * stride_at + i_hv, b + i_b64 * stride_bb + t * stride_bt + i_hv,
                        ga, gdt)
        S, bo = _delta_rule(S, bq, bk, bv, bg, bb, scale)
        tl.store(o + ((i_b64 * T + t) * HV + i_hv) * V + o_v, bo.to(out_ty), mask=mv)
        tl.store(state + s_dst * (HV * K * V) + p_tile, S.to(state.dtype.element_ty), mask=ms)


# NOTE: T is unrolled in the kernel (a constexpr); past this many tokens the op loops the one-token kernel.
_MAX_STEPS = 16


def _block_v(B: int, HV: int, V: int) -> int:
    # NOTE: BV 16 when B * HV * V / 32 would give under ~2 programs per SM (27B B=1: 384 programs instead of
    #       192; each program's q/k conv recompute is 2 x K channels, cheap next to its K x BV state tile).
    return min(16 if B * HV * triton.cdiv(V, 32) < 264 else 32, triton.next_power_of_2(V))


def gdn_conv_recurrent(qkv, conv_weight, conv_state, a, b, A_log, dt_bias, rec_state, src, dst, *, num_k_heads,
                       head_k_dim, head_v_dim):
    """See `ninfer.ops.reference.fused.gdn_conv_recurrent`. qkv [B, C] (unit last stride), a, b [B, HV] raw
    projections (column slices allowed), A_log, dt_bias [HV], conv_state [S, C, 3], rec_state
    [S, HV, K, V] fp32, src/dst [B] -> o [B, HV, V].

    With PDL on, src, dst, both states at src and the weights are read before the
    wait for the previous kernel of the stream: that kernel must not write them (in the decode step it
    is the in-projection, or its gate rows' GEMV after it, which write qkv, a, b and z only)."""
    B, C = qkv.shape
    H, K, V = num_k_heads, head_k_dim, head_v_dim
    HV = a.shape[-1]
    w = conv_weight.reshape(C, -1)
    ok = (dst is not None and w.shape[1] == 4 and w.is_contiguous() and qkv.stride(1) == 1
          and conv_state.is_contiguous() and conv_state.shape[-1] == 3 and rec_state.dtype == torch.float32
          and rec_state.is_contiguous() and HV % H == 0 and C == 2 * H * K + HV * V and K <= 256
          and a.stride(-1) == 1 and b.stride(-1) == 1 and a.dim() == 2 and b.shape == a.shape and B > 0
          and A_log.is_contiguous() and dt_bias.is_contiguous())
    if not ok:
        return _ref.gdn_conv_recurrent(qkv, conv_weight, conv_state, a, b, A_log, dt_bias, rec_state, src, dst,
                                       num_k_heads=H, head_k_dim=K, head_v_dim=V, ops=_THREE_KERNELS)
    src_i, dst_i = device_index(src, qkv.device), device_index(dst, qkv.device)
    o = torch.empty(B, HV, V, dtype=qkv.dtype, device=qkv.device)
    BK = triton.next_power_of_2(K)
    BV = _block_v(B, HV, V)
    _gdn_conv_recurrent_kernel[(B, HV, triton.cdiv(V, BV))](
        qkv, w, conv_state, a, b, A_log, dt_bias, o, rec_state, src_i, dst_i, float(K ** -0.5),
        qkv.stride(0), conv_state.stride(0), a.stride(0), b.stride(0),
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, num_warps=4, **pdl.launch())
    return o


def gdn_conv_recurrent_steps(qkv, conv_weight, conv_state, a, b, A_log, dt_bias, rec_state, src, dst, *,
                             num_k_heads, head_k_dim, head_v_dim):
    """See `ninfer.ops.reference.fused.gdn_conv_recurrent_steps`. qkv [B, T, C] (unit last stride), a, b
    [B, T, HV] raw projections (unit last stride, other strides free: column slices of a wider output),
    A_log, dt_bias [HV], conv_state [S, C, 3], rec_state [S, HV, K, V] fp32, src [B], dst [B, T] ->
    o [B, T, HV, V] in qkv.dtype. One launch; no host sync, the grid depends on shapes only.

    PDL as in `gdn_conv_recurrent`: src, both states at src and the weights are read before the wait for
    the previous kernel of the stream, which must not write them. Other layouts run the reference
    composition of the one-token op (T launches)."""
    H, K, V = num_k_heads, head_k_dim, head_v_dim
    HV = a.shape[-1]
    w = conv_weight.reshape(conv_weight.shape[0], -1)
    ok = (qkv.dim() == 3 and a.dim() == 3 and 1 <= qkv.shape[1] <= _MAX_STEPS and qkv.shape[0] > 0
          and a.shape[:2] == qkv.shape[:2] and b.shape == a.shape and src.shape == qkv.shape[:1]
          and dst.shape == qkv.shape[:2] and w.shape == (qkv.shape[-1], 4) and w.is_contiguous()
          and qkv.stride(-1) == 1 and a.stride(-1) == 1 and b.stride(-1) == 1
          and conv_state.is_contiguous() and conv_state.dim() == 3 and conv_state.shape[1:] == (qkv.shape[-1], 3)
          and rec_state.dtype == torch.float32 and rec_state.is_contiguous() and rec_state.shape[1:] == (HV, K, V)
          and HV % H == 0 and qkv.shape[-1] == 2 * H * K + HV * V and K <= 256
          and A_log.is_contiguous() and dt_bias.is_contiguous())
    if not ok:
        # NOTE: the one-token kernel reads its entries as contiguous vectors: dst's columns made so.
        dst_cols = dst.t().contiguous().t() if dst.dim() == 2 else dst
        return _ref.gdn_conv_recurrent_steps(qkv, conv_weight, conv_state, a, b, A_log, dt_bias, rec_state,
                                             src.contiguous(), dst_cols, num_k_heads=H, head_k_dim=K, head_v_dim=V,
                                             ops=_ONE_TOKEN)
    B, T, _ = qkv.shape
    src_i, dst_i = device_index(src, qkv.device), device_index(dst, qkv.device)
    o = torch.empty(B, T, HV, V, dtype=qkv.dtype, device=qkv.device)
    BV = _block_v(B, HV, V)
    _gdn_conv_recurrent_steps_kernel[(B, HV, triton.cdiv(V, BV))](
        qkv, w, conv_state, a, b, A_log, dt_bias, o, rec_state, src_i, dst_i, float(K ** -0.5),
        qkv.stride(0), qkv.stride(1), conv_state.stride(0), a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        src_i.stride(0), dst_i.stride(0), dst_i.stride(1),
        T=T, H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=BV, num_warps=4, **pdl.launch())
    return o


# NOTE: the steps op's fallback: its reference loop over the one-token op above.
_ONE_TOKEN = SimpleNamespace(gdn_conv_recurrent=gdn_conv_recurrent)
