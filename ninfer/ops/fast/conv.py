"""Fast causal depthwise conv1d (CUDA, Triton) over dense or slot-indexed conv state.

Same arguments, state convention and results as `ninfer.ops.conv` (the oracle), for the model's
kernel width K = 4 (other widths fall back to the reference), plus `gather_final_state` (see
`ninfer.ops.fast.gated_delta`).

    chunk_causal_conv1d    x [B, T, C] or packed [1, T_total, C] + cu_seqlens [N+1]; weight [C, 4]
                           state [S|N, C, 3] (oldest first)
    causal_conv1d_update   x [B, C] or [B, T, C] (small T); same state
Compute in fp32, output in x.dtype. Prefill is two launches: the outputs (every program reads
the old state) and then the state update, so no program overwrites state another still reads.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.ops import conv as _ref
from ninfer.ops.fast._index import device_index

__all__ = ["chunk_causal_conv1d", "causal_conv1d_update"]


@triton.jit
def _silu(x):
    return x / (1.0 + tl.exp(-x))


@triton.jit
def _conv_fwd_kernel(x, w, state, idx, cu, y, C, stride_x, stride_sn,
                     BT: tl.constexpr, BC: tl.constexpr, ACT: tl.constexpr):
    i_n = tl.program_id(0)
    i_t = tl.program_id(1)
    i_c = tl.program_id(2)
    bos = tl.load(cu + i_n).to(tl.int64)
    eos = tl.load(cu + i_n + 1).to(tl.int64)
    t0 = bos + i_t * BT
    if t0 >= eos:
        return
    slot = tl.load(idx + i_n).to(tl.int64)
    o_t = t0 + tl.arange(0, BT)
    o_c = i_c * BC + tl.arange(0, BC)
    mt = o_t < eos
    mc = o_c < C
    acc = tl.zeros([BT, BC], dtype=tl.float32)
    for j in tl.static_range(4):
        src = o_t - 3 + j
        in_x = src >= bos
        xv = tl.load(x + src[:, None] * stride_x + o_c[None, :],
                     mask=(mt & in_x)[:, None] & mc[None, :], other=0.0).to(tl.float32)
        sv = tl.load(state + slot * stride_sn + o_c[None, :] * 3 + (src - bos + 3)[:, None],
                     mask=(mt & (src < bos))[:, None] & mc[None, :], other=0.0).to(tl.float32)
        wj = tl.load(w + o_c * 4 + j, mask=mc, other=0.0).to(tl.float32)
        acc += (xv + sv) * wj[None, :]
    if ACT:
        acc = _silu(acc)
    tl.store(y + o_t[:, None] * C + o_c[None, :], acc.to(y.dtype.element_ty), mask=mt[:, None] & mc[None, :])


@triton.jit
def _conv_state_kernel(x, state, idx, cu, C, stride_x, stride_sn, BC: tl.constexpr):
    i_n = tl.program_id(0)
    i_c = tl.program_id(1)
    bos = tl.load(cu + i_n).to(tl.int64)
    eos = tl.load(cu + i_n + 1).to(tl.int64)
    slot = tl.load(idx + i_n).to(tl.int64)
    o_c = i_c * BC + tl.arange(0, BC)
    mc = o_c < C
    base = state + slot * stride_sn + o_c * 3
    # NOTE: new state column i is input eos-3+i: from x when inside this chunk, else from the old state
    #       (chunks shorter than 3). All three are loaded before any is stored.
    v0 = _state_col(x, base, bos, eos - 3, stride_x, o_c, mc)
    v1 = _state_col(x, base, bos, eos - 2, stride_x, o_c, mc)
    v2 = _state_col(x, base, bos, eos - 1, stride_x, o_c, mc)
    tl.store(base + 0, v0.to(state.dtype.element_ty), mask=mc)
    tl.store(base + 1, v1.to(state.dtype.element_ty), mask=mc)
    tl.store(base + 2, v2.to(state.dtype.element_ty), mask=mc)


@triton.jit
def _state_col(x, base, bos, src, stride_x, o_c, mc):
    from_x = src >= bos
    xv = tl.load(x + src * stride_x + o_c, mask=mc & from_x, other=0.0).to(tl.float32)
    sv = tl.load(base + (src - bos + 3), mask=mc & (src < bos), other=0.0).to(tl.float32)
    return xv + sv


@triton.jit
def _conv_update_kernel(x, w, state, idx, didx, y, C, stride_xb, stride_xt, stride_sn, T: tl.constexpr,
                        BC: tl.constexpr, ACT: tl.constexpr):
    # NOTE: reads the state at idx[b], writes it at didx[b] (the same entry unless a separate
    #       destination is given: then the source entry is never written).
    i_b = tl.program_id(0)
    i_c = tl.program_id(1)
    slot = tl.load(idx + i_b).to(tl.int64)
    dslot = tl.load(didx + i_b).to(tl.int64)
    o_c = i_c * BC + tl.arange(0, BC)
    mc = o_c < C
    base = state + slot * stride_sn + o_c * 3
    dbase = state + dslot * stride_sn + o_c * 3
    s0 = tl.load(base + 0, mask=mc, other=0.0).to(tl.float32)
    s1 = tl.load(base + 1, mask=mc, other=0.0).to(tl.float32)
    s2 = tl.load(base + 2, mask=mc, other=0.0).to(tl.float32)
    w0 = tl.load(w + o_c * 4 + 0, mask=mc, other=0.0).to(tl.float32)
    w1 = tl.load(w + o_c * 4 + 1, mask=mc, other=0.0).to(tl.float32)
    w2 = tl.load(w + o_c * 4 + 2, mask=mc, other=0.0).to(tl.float32)
    w3 = tl.load(w + o_c * 4 + 3, mask=mc, other=0.0).to(tl.float32)
    for t in tl.static_range(T):
        xt = tl.load(x + i_b * stride_xb + t * stride_xt + o_c, mask=mc, other=0.0).to(tl.float32)
        acc = w0 * s0 + w1 * s1 + w2 * s2 + w3 * xt
        if ACT:
            acc = _silu(acc)
        tl.store(y + (i_b * T + t) * C + o_c, acc.to(y.dtype.element_ty), mask=mc)
        s0 = s1
        s1 = s2
        s2 = xt
    tl.store(dbase + 0, s0.to(state.dtype.element_ty), mask=mc)
    tl.store(dbase + 1, s1.to(state.dtype.element_ty), mask=mc)
    tl.store(dbase + 2, s2.to(state.dtype.element_ty), mask=mc)


def _act_flag(activation):
    if activation is None:
        return False
    if activation in ("silu", "swish"):
        return True
    raise ValueError(f"unknown activation {activation!r}")


def _pool(conv_state, state_indices, N, C, dtype, device):
    """-> (pool updated in place by the kernels, int32 row ids, is_slot_pool)."""
    if conv_state is None:
        return torch.zeros(N, C, 3, dtype=dtype, device=device), torch.arange(N, dtype=torch.int32, device=device), False
    if state_indices is None:
        if tuple(conv_state.shape) != (N, C, 3):
            raise ValueError(f"state has shape {tuple(conv_state.shape)}, expected {(N, C, 3)}")
        return conv_state.clone().contiguous(), torch.arange(N, dtype=torch.int32, device=device), False
    return conv_state, device_index(state_indices, device), True


def _ret_state(pool, idx, is_slot, gather_final_state):
    if is_slot:
        return pool.index_select(0, idx.long()) if gather_final_state else None
    return pool


def _usable(weight, conv_state, state_indices):
    return weight.shape[-1] == 4 and (conv_state is None or state_indices is None or (
        conv_state.is_contiguous() and conv_state.shape[-1] == 3))


def chunk_causal_conv1d(x, weight, conv_state=None, *, cu_seqlens=None, state_indices=None, activation="silu",
                        gather_final_state=True):
    """Prefill form; see `ninfer.ops.conv.chunk_causal_conv1d`."""
    if not _usable(weight, conv_state, state_indices):
        return _ref.chunk_causal_conv1d(x, weight, conv_state, cu_seqlens=cu_seqlens,
                                        state_indices=state_indices, activation=activation)
    act = _act_flag(activation)
    B, T, C = x.shape
    if cu_seqlens is None:
        cu = torch.arange(0, (B + 1) * T, T, dtype=torch.int32, device=x.device)
        N, max_len = B, T
    else:
        if B != 1:
            raise ValueError(f"with cu_seqlens the batch dimension must be 1, got {B}")
        cu = device_index(cu_seqlens, x.device)
        N, max_len = cu.numel() - 1, T
    x2 = x.reshape(B * T, C)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    pool, idx, is_slot = _pool(conv_state, state_indices, N, C, x.dtype if conv_state is None else conv_state.dtype,
                               x.device)
    w = weight.reshape(C, 4).contiguous()
    y = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    BT, BC = 32, 128
    _conv_fwd_kernel[(N, triton.cdiv(max_len, BT), triton.cdiv(C, BC))](
        x2, w, pool, idx, cu, y, C, x2.stride(0), pool.stride(0), BT=BT, BC=BC, ACT=act, num_warps=4)
    _conv_state_kernel[(N, triton.cdiv(C, BC))](x2, pool, idx, cu, C, x2.stride(0), pool.stride(0), BC=BC,
                                                 num_warps=4)
    return y, _ret_state(pool, idx, is_slot, gather_final_state)


def causal_conv1d_update(x, weight, conv_state, *, state_indices=None, activation="silu", gather_final_state=True,
                         dst_indices=None):
    """Decode form; see `ninfer.ops.conv.causal_conv1d_update` (incl. `dst_indices`: read the
    state at `state_indices`, write it at `dst_indices`, in the kernel, no copy)."""
    if dst_indices is not None and (state_indices is None or not _usable(weight, conv_state, state_indices)
                                    or (x.dim() == 3 and x.shape[1] > 16)):
        conv_state.index_copy_(0, dst_indices.long(), conv_state.index_select(0, state_indices.long()))
        state_indices, dst_indices = dst_indices, None
    if not _usable(weight, conv_state, state_indices):
        return _ref.causal_conv1d_update(x, weight, conv_state, state_indices=state_indices, activation=activation)
    act = _act_flag(activation)
    squeeze = x.dim() == 2
    x3 = x.unsqueeze(1) if squeeze else x
    B, T, C = x3.shape
    if T > 16:                              # NOTE: the update kernel unrolls its T steps
        y, ns = chunk_causal_conv1d(x3, weight, conv_state, state_indices=state_indices, activation=activation,
                                    gather_final_state=gather_final_state)
        return (y.squeeze(1) if squeeze else y), ns
    if x3.stride(2) != 1:
        x3 = x3.contiguous()
    pool, idx, is_slot = _pool(conv_state, state_indices, B, C, conv_state.dtype, x.device)
    w = weight.reshape(C, 4).contiguous()
    y = torch.empty(B, T, C, dtype=x.dtype, device=x.device)
    BC = 256
    didx = idx if dst_indices is None else device_index(dst_indices, x.device)
    _conv_update_kernel[(B, triton.cdiv(C, BC))](
        x3, w, pool, idx, didx, y, C, x3.stride(0), x3.stride(1), pool.stride(0), T=T, BC=BC, ACT=act, num_warps=4)
    return (y.squeeze(1) if squeeze else y), _ret_state(pool, didx, is_slot, gather_final_state)
