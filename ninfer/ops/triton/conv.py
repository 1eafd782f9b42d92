"""Fast causal depthwise conv1d (CUDA, Triton) over dense or slot-indexed conv state.

Same arguments, state convention and results as `ninfer.ops.reference.conv` (the oracle), for the model's
kernel width K = 4 (other widths fall back to the reference), plus `gather_final_state` (see
`ninfer.ops.triton.gated_delta`).

    chunk_causal_conv1d    x [B, T, C] or packed [1, T_total, C] + cu_seqlens [N+1] (rows past its end:
                           padding, left unwritten); weight [C, 4]
                           state [S|N, C, 3] (oldest first); split=(w0, w1, w2): the output as
                           contiguous channel slices [B, T, w_i] (fla-core's q, k, v)
    causal_conv1d_update   x [B, C] or [B, T, C] (small T); same state
Compute in fp32, output in x.dtype. Prefill is two launches: the outputs (every program reads
the old state) and then the state update, so no program overwrites state another still reads.
The output kernel walks 32 tokens x <= 1024 channels per program row by row (16-byte channel
loads, the 3 previous inputs in registers): ~2 x 168 MB at the 27B's 8k prefill, bandwidth-bound.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ninfer.ops.reference import conv as _ref
from ninfer.ops.triton.common import device_index

__all__ = ["chunk_causal_conv1d", "causal_conv1d_update"]


@triton.jit
def _silu(x):
    return x / (1.0 + tl.exp(-x))


@triton.jit
def _conv_fwd_kernel(x, w, state, idx, cu, y, C, T_total, S1, S2, stride_x, stride_sn,
                     BT: tl.constexpr, BC: tl.constexpr, ACT: tl.constexpr):
    # NOTE: one program = BT tokens x BC channels of one sequence, walked token by token (unrolled)
    #       with the three previous inputs carried in registers: every input row is read once
    #       (plus a 3-row halo per program) with channel-contiguous vector loads, and only the
    #       sequence's first block reads the old state.
    i_c = tl.program_id(0)
    i_t = tl.program_id(1)
    i_n = tl.program_id(2)
    bos = tl.load(cu + i_n).to(tl.int64)
    eos = tl.load(cu + i_n + 1).to(tl.int64)
    t0 = bos + i_t * BT
    if t0 >= eos:
        return
    c0 = i_c * BC
    o_c = c0 + tl.arange(0, BC)
    mc = o_c < C
    w0 = tl.load(w + o_c * 4 + 0, mask=mc, other=0.0).to(tl.float32)
    w1 = tl.load(w + o_c * 4 + 1, mask=mc, other=0.0).to(tl.float32)
    w2 = tl.load(w + o_c * 4 + 2, mask=mc, other=0.0).to(tl.float32)
    w3 = tl.load(w + o_c * 4 + 3, mask=mc, other=0.0).to(tl.float32)
    if i_t > 0:
        # NOTE: BT >= 3, so the halo of a later block lies inside the sequence.
        s0 = tl.load(x + (t0 - 3) * stride_x + o_c, mask=mc, other=0.0).to(tl.float32)
        s1 = tl.load(x + (t0 - 2) * stride_x + o_c, mask=mc, other=0.0).to(tl.float32)
        s2 = tl.load(x + (t0 - 1) * stride_x + o_c, mask=mc, other=0.0).to(tl.float32)
    else:
        base = state + tl.load(idx + i_n).to(tl.int64) * stride_sn + o_c * 3
        s0 = tl.load(base + 0, mask=mc, other=0.0).to(tl.float32)
        s1 = tl.load(base + 1, mask=mc, other=0.0).to(tl.float32)
        s2 = tl.load(base + 2, mask=mc, other=0.0).to(tl.float32)
    # NOTE: output layout: channels [0, S1), [S1, S2), [S2, C) are three row-major [T_total, width]
    #       blocks one after another in y (S1 = S2 = C: one plain [T_total, C] block). A program's
    #       channel block never straddles a boundary (the wrapper picks BC to divide the widths).
    in2 = c0 >= S2
    in1 = c0 >= S1
    seg = tl.where(in2, S2, tl.where(in1, S1, 0)).to(tl.int64)
    width = tl.where(in2, C - S2, tl.where(in1, S2 - S1, S1)).to(tl.int64)
    p_y = y + T_total * seg + (o_c - seg)
    for i in tl.static_range(BT):
        t = t0 + i
        m = mc & (t < eos)
        xt = tl.load(x + t * stride_x + o_c, mask=m, other=0.0).to(tl.float32)
        acc = w0 * s0 + w1 * s1 + w2 * s2 + w3 * xt
        if ACT:
            acc = _silu(acc)
        tl.store(p_y + t * width, acc.to(y.dtype.element_ty), mask=m)
        s0 = s1
        s1 = s2
        s2 = xt


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


def _block_c(C: int, split) -> int:
    """Channel block: up to 1024 (8 bf16 per thread at 4 warps); a divisor of every split width."""
    if split is None:
        return min(1024, max(16, triton.next_power_of_2(C)))
    bc = 1024
    while bc > 1 and any(wd % bc for wd in split):
        bc //= 2
    return bc


def _split_bounds(C: int, split) -> tuple[int, int]:
    if split is None:
        return C, C
    split = tuple(int(wd) for wd in split)
    if not 1 <= len(split) <= 3 or sum(split) != C or min(split) < 1:
        raise ValueError(f"split {split} must be 1 to 3 positive widths summing to C = {C}")
    split = split + (0,) * (3 - len(split))
    return split[0], split[0] + split[1]


def _outputs(buf: torch.Tensor, B: int, T: int, C: int, split):
    if split is None:
        return buf.view(B, T, C)
    outs, off = [], 0
    for wd in split:
        outs.append(buf[off:off + B * T * wd].view(B, T, wd))
        off += B * T * wd
    return tuple(outs)


def chunk_causal_conv1d(x, weight, conv_state=None, *, cu_seqlens=None, state_indices=None, activation="silu",
                        gather_final_state=True, split=None, block_t=32, block_c=None, num_warps=None):
    """Prefill form; see `ninfer.ops.reference.conv.chunk_causal_conv1d`.

    split: channel widths (w0, w1[, w2]) summing to C: the output is then a tuple of contiguous
    [B, T, w_i] tensors, each the matching channel slice of y (written there by the kernel: no
    split-and-copy; the GDN schedule passes (q, k, v) widths, the layout fla-core reads).
    block_t / block_c / num_warps: tile overrides for the benchmark (defaults: 32 tokens, <= 1024
    channels, 8 channels per thread)."""
    if not _usable(weight, conv_state, state_indices):
        y, st = _ref.chunk_causal_conv1d(x, weight, conv_state, cu_seqlens=cu_seqlens,
                                         state_indices=state_indices, activation=activation)
        if split is not None:
            y = tuple(t.contiguous() for t in torch.split(y, list(split), dim=-1))
        return y, st
    act = _act_flag(activation)
    B, T, C = x.shape
    S1, S2 = _split_bounds(C, split)
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
    buf = torch.empty(B * T * C, dtype=x.dtype, device=x.device)
    BT = max(3, block_t)
    BC = block_c or _block_c(C, split)
    if split is not None and any(wd % BC for wd in split):
        raise ValueError(f"block_c {BC} must divide every split width {tuple(split)}")
    nw = num_warps or max(1, min(8, BC // 256))
    _conv_fwd_kernel[(triton.cdiv(C, BC), triton.cdiv(max_len, BT), N)](
        x2, w, pool, idx, cu, buf, C, B * T, S1, S2, x2.stride(0), pool.stride(0), BT=BT, BC=BC, ACT=act,
        num_warps=nw)
    BS = 128
    _conv_state_kernel[(N, triton.cdiv(C, BS))](x2, pool, idx, cu, C, x2.stride(0), pool.stride(0), BC=BS,
                                                 num_warps=4)
    return _outputs(buf, B, T, C, split), _ret_state(pool, idx, is_slot, gather_final_state)


def causal_conv1d_update(x, weight, conv_state, *, state_indices=None, activation="silu", gather_final_state=True,
                         dst_indices=None):
    """Decode form; see `ninfer.ops.reference.conv.causal_conv1d_update` (incl. `dst_indices`: read the
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
