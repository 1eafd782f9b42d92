"""Compositions of the reference ops that the fast set runs as one kernel each (decode and prefill).

Each function here is the oracle of its fast twin in `ninfer.ops.triton.fused` (same arguments, same
result up to the rounding of one fused pass instead of several). They exist as named ops so the
leaves and the schedule call one op per fused step through the `OpSet`, and the CPU path keeps
the exact HF order of casts.

    add_rms_norm(x, delta, w, eps)          x_new = x + delta (x.dtype); h = rms_norm(x_new, w)  -> (h, x_new)
    qk_norm_rope(q, k, wq, wk, cos, sin)    per-head zero-centred RMSNorm of q and k, then partial NeoX rotary
    silu_mul_halves(gu)                     gu [N, 2I] (gate rows first) -> silu(gate) * up  [N, I]
    linear(x, w, residual=None)             x @ w.T (the fast set may use a GEMV for small M); x may be a
                                            NormedRows, residual see below
    linear_swiglu(gu, w, residual=None)     silu_mul_halves(gu) @ w.T (the fast set may fold the SwiGLU into the GEMV)

Residual + norm folding (decode at one row). The schedule's residual add + RMSNorm between a leaf's
last projection and the next leaf's first projection can run inside those two GEMVs:
`linear(y, w, residual=x)` may return `Residual(h, parts)` (h = x + y @ w.T, parts: fp32 sums of
h^2 per column tile) instead of the plain product, and the schedule then hands the next leaf
`NormedRows(h, weight, eps, parts)` in place of rms_norm(h), which `linear` applies on the fly. The
references here never fold: `linear` ignores `residual` (the caller's add_rms_norm does the add) and
applies a NormedRows's norm with `rms_norm` (the CPU path is unchanged).
    gdn_conv_recurrent(qkv, a, b, ...)     GDN decode state step: gates, conv update, gated delta rule
    gdn_conv_recurrent_steps(qkv, a, b, ...)   T such steps per row (speculative verify), the states after
                                            every token kept at their own entries
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ninfer.ops.reference.conv import causal_conv1d_update
from ninfer.ops.reference.gated_delta import fused_recurrent_gated_delta_rule, gdn_gates
from ninfer.ops.reference.mlp import silu_mul
from ninfer.ops.reference.norms import rms_norm
from ninfer.ops.reference.rope import apply_rotary_qk

__all__ = ["add_rms_norm", "qk_norm_rope", "silu_mul_halves", "linear", "linear_swiglu", "gdn_conv_recurrent",
           "gdn_conv_recurrent_steps", "Residual", "NormedRows", "normed", "materialize"]


class Residual(NamedTuple):
    """What a folding `linear(y, w, residual=x)` returns: h = x + y @ w.T [M, H] (the new residual
    stream, in x.dtype) and parts [M, P] fp32, the sums of h^2 over P column tiles."""
    h: torch.Tensor
    parts: torch.Tensor


class NormedRows(NamedTuple):
    """rms_norm(h, weight, eps) not yet applied (see the module docstring); parts: the sums of h^2 of
    the `Residual` that produced h (None: none known)."""
    h: torch.Tensor
    weight: torch.Tensor
    eps: float
    parts: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.h.shape


def normed(x: "torch.Tensor | NormedRows") -> torch.Tensor:
    """x itself, or a NormedRows's norm applied (reference rms_norm)."""
    return rms_norm(x.h, x.weight, x.eps) if isinstance(x, NormedRows) else x


def materialize(x: "torch.Tensor | NormedRows", ops) -> torch.Tensor:
    """x itself, or a NormedRows's norm applied with the OpSet's `add_rms_norm` (one norm launch on the
    fast set): for consumers other than a projection (the schedule's final norm, a post-mixer whose
    kernels read the normed rows)."""
    return ops.add_rms_norm(x.h, None, x.weight, x.eps)[0] if isinstance(x, NormedRows) else x


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float = 1e-6
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Residual add then zero-centred RMSNorm. x, delta: [N, H] same dtype (delta None: no add).
    Returns (rms_norm(x_new, weight) [N, H] in x.dtype, x_new = x + delta in x.dtype)."""
    x_new = x if delta is None else x + delta
    return rms_norm(x_new, weight, eps), x_new


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, Hq, D], k [N, Hk, D] (may be strided views of one projection row), weights [D]
    (zero-centred), cos/sin [N, rot] fp32 (rot <= D, rotate-half over dims [0, rot)).
    Returns (q', k') contiguous in q.dtype: rms_norm per head, then `apply_rotary` (HF order)."""
    return apply_rotary_qk(rms_norm(q, q_weight, eps), rms_norm(k, k_weight, eps), cos, sin)


def silu_mul_halves(gu: torch.Tensor) -> torch.Tensor:
    """gu [N, 2I] -> silu(gu[:, :I]) * gu[:, I:] in gu.dtype (SwiGLU after the fused gate|up GEMM)."""
    I = gu.shape[-1] // 2
    return silu_mul(gu[..., :I], gu[..., I:])


def linear(x: "torch.Tensor | NormedRows", weight: torch.Tensor, residual: torch.Tensor | None = None
           ) -> torch.Tensor:
    """x [M, K] @ weight[N, K].T -> [M, N] in x.dtype (x a NormedRows: its norm applied first). The
    reference never folds `residual` (the product is returned; the caller adds it)."""
    return F.linear(normed(x), weight)


def linear_swiglu(gu: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
    """gu [N, 2I] (gate | up) -> silu_mul_halves(gu) @ weight[H, I].T  [N, H] in gu.dtype (`residual`
    as in `linear`: never folded here)."""
    return F.linear(silu_mul_halves(gu), weight)


def gdn_conv_recurrent(qkv: torch.Tensor, conv_weight: torch.Tensor, conv_state: torch.Tensor, a: torch.Tensor,
                       b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, rec_state: torch.Tensor,
                       src: torch.Tensor, dst: torch.Tensor | None, *,
                       num_k_heads: int, head_k_dim: int, head_v_dim: int, ops=None) -> torch.Tensor:
    """The state part of one GDN decode token per row: `gdn_gates(a, b, A_log, dt_bias)` (a, b [B, HV]
    raw projections), `causal_conv1d_update` (SiLU) of qkv [B, C] (C = 2 * H * K + HV * V: q heads,
    k heads, v heads), then `fused_recurrent_gated_delta_rule` with q/k L2-norm. Both states are read
    at the entries src [B] and the stepped states written at dst [B] (None: in place at src).
    conv_state [S, C, K-1], rec_state [S, HV, K, V] fp32. Returns o [B, HV, V] in qkv.dtype.
    ops: any object with `gdn_gates`, `causal_conv1d_update` and `fused_recurrent_gated_delta_rule` (an
    OpSet) that compose it (default: the references here; the fast one-kernel op falls back to its
    three fast kernels)."""
    gates, conv_update, recurrent = ((gdn_gates, causal_conv1d_update, fused_recurrent_gated_delta_rule)
                                     if ops is None else
                                     (ops.gdn_gates, ops.causal_conv1d_update, ops.fused_recurrent_gated_delta_rule))
    B = qkv.shape[0]
    H, K, V = num_k_heads, head_k_dim, head_v_dim
    HV = a.shape[-1]
    g, beta = gates(a, b, A_log, dt_bias)
    u, _ = conv_update(qkv, conv_weight, conv_state, state_indices=src, dst_indices=dst)
    q, k, v = torch.split(u, (H * K, H * K, HV * V), dim=-1)
    o, _ = recurrent(
        q.reshape(B, 1, H, K), k.reshape(B, 1, H, K), v.reshape(B, 1, HV, V), g.unsqueeze(1), beta.unsqueeze(1),
        initial_state=rec_state, state_indices=src, dst_indices=dst, use_qk_l2norm_in_kernel=True)
    return o.reshape(B, HV, V)


def gdn_conv_recurrent_steps(qkv: torch.Tensor, conv_weight: torch.Tensor, conv_state: torch.Tensor, a: torch.Tensor,
                             b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, rec_state: torch.Tensor,
                             src: torch.Tensor, dst: torch.Tensor, *,
                             num_k_heads: int, head_k_dim: int, head_v_dim: int, ops=None) -> torch.Tensor:
    """T GDN decode tokens per row, each one `gdn_conv_recurrent` step, every intermediate state kept (the
    speculative verify forward: after it, the states after any accepted prefix are at hand).

    qkv [B, T, C] (C = 2 * H * K + HV * V), a, b [B, T, HV] raw projections, conv_state [S, C, K-1],
    rec_state [S, HV, K, V] fp32, src [B] and dst [B, T] entries. Token t of row b reads both states at
    src[b] (t = 0) or dst[b, t-1] and writes the stepped states at dst[b, t], so dst[b, t] holds the
    states after t + 1 tokens; src is never written. Returns o [B, T, HV, V] in qkv.dtype.

        entries of row b:   src[b] --tok 0--> dst[b, 0] --tok 1--> dst[b, 1] ... --tok T-1--> dst[b, T-1]

    ops: any object with `gdn_conv_recurrent` (an OpSet) that steps one token (default: the reference
    `gdn_conv_recurrent` here; the fast op falls back to the fast one-token kernel)."""
    if qkv.dim() != 3 or qkv.shape[1] < 1:
        raise ValueError(f"gdn_conv_recurrent_steps: qkv must be [B, T, C] with T >= 1, got shape {tuple(qkv.shape)}")
    B, T, _ = qkv.shape
    if a.dim() != 3 or a.shape[:2] != (B, T) or b.shape != a.shape:
        raise ValueError(f"gdn_conv_recurrent_steps: a and b must be [B, T, HV] = [{B}, {T}, HV] like qkv, "
                         f"got {tuple(a.shape)} and {tuple(b.shape)}")
    if src.shape != (B,) or dst.shape != (B, T):
        raise ValueError(f"gdn_conv_recurrent_steps: src must be [B] = [{B}] and dst [B, T] = [{B}, {T}], "
                         f"got {tuple(src.shape)} and {tuple(dst.shape)}")
    step = gdn_conv_recurrent if ops is None else ops.gdn_conv_recurrent
    outs = []
    for t in range(T):
        entry = src if t == 0 else dst[:, t - 1]
        outs.append(step(qkv[:, t], conv_weight, conv_state, a[:, t], b[:, t], A_log, dt_bias, rec_state, entry,
                         dst[:, t], num_k_heads=num_k_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim))
    return torch.stack(outs, dim=1)
