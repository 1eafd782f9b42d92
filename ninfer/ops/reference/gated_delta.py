"""The gated delta rule (GDN token mixer core): chunked prefill form and recurrent decode form.

Per value head, with state S ∈ R^{K×V} (fp32), decay α_t = exp(g_t), β_t ∈ (0, 1):
    S_t = α_t S_{t-1};   S_t += k_t ⊗ β_t (v_t − S_tᵀ k_t);   o_t = S_tᵀ (scale · q_t)
Equal to HF `torch_recurrent_gated_delta_rule` / `torch_chunk_gated_delta_rule` and to FLA's
`fused_recurrent_gated_delta_rule` / `chunk_gated_delta_rule` (same argument names).

Conventions (both forms):
* Inputs are token-major: q, k [B, T, Hk, K], v [B, T, Hv, V], g and beta [B, T, Hv]; or packed
  varlen with B = 1 and `cu_seqlens` [N+1]. Hv must be a multiple of Hk; value head j reads key
  head j // (Hv // Hk) (consecutive grouping, repeat_interleave).
* q/k L2 normalisation is done here only if `use_qk_l2norm_in_kernel=True` (the model passes True);
  the caller never normalises q/k itself. `scale` defaults to K**-0.5 and is applied after the L2 norm.
* g is the log-decay (<= 0, fp32 recommended); beta is already sigmoid-ed. See `gdn_gates`.
* Everything is computed in fp32; the output is returned in q.dtype.
* State [N, Hv, K, V] (HF / FLA layout), fp32. Dense or slot-pool passing: see `ninfer.ops.reference._state`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.ops.reference._state import read_state, seq_bounds, write_state
from ninfer.ops.reference.norms import l2norm

__all__ = ["gdn_gates", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"]


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDN decay and write strength from the projections.

    Args:
        a: [..., Hv] (in_proj_a output), b: [..., Hv] (in_proj_b output), A_log: [Hv], dt_bias: [Hv].
    Returns:
        (g [..., Hv] fp32 = -exp(A_log) * softplus(a + dt_bias),  beta [..., Hv] in b.dtype = sigmoid(b)).
    """
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.sigmoid()


def _prepare(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel):
    """-> fp32 head-major [B, Hv, T, *] tensors with q scaled and k/q repeated to Hv heads."""
    Hk, Hv = k.shape[2], v.shape[2]
    if Hv % Hk != 0 or q.shape[2] != Hk:
        raise ValueError(f"value heads {Hv} must be a multiple of key heads {Hk} (q heads {q.shape[2]})")
    q, k = q.float(), k.float()
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    if scale is None:
        scale = k.shape[-1] ** -0.5
    q = q * scale
    if Hv != Hk:
        q = q.repeat_interleave(Hv // Hk, dim=2)
        k = k.repeat_interleave(Hv // Hk, dim=2)
    return (q.transpose(1, 2), k.transpose(1, 2), v.float().transpose(1, 2),
            g.float().transpose(1, 2), beta.float().transpose(1, 2))


def _recurrent_core(q, k, v, g, beta, S):
    """q, k [N, H, L, K], v [N, H, L, V], g, beta [N, H, L], S [N, H, K, V] (fp32) -> (o [N, H, L, V], S)."""
    o = torch.empty_like(v)
    for t in range(q.shape[2]):
        S = S * g[:, :, t].exp()[..., None, None]
        kt = k[:, :, t]
        kv = (S * kt[..., None]).sum(-2)                                  # Sᵀ k   [N, H, V]
        delta = (v[:, :, t] - kv) * beta[:, :, t, None]
        S = S + kt[..., None] * delta[..., None, :]
        o[:, :, t] = (S * q[:, :, t, ..., None]).sum(-2)                  # Sᵀ q
    return o, S


def _chunk_core(q, k, v, g, beta, S, C):
    """Chunked (WY/UT) form of `_recurrent_core` with chunk size C; same shapes and result."""
    N, H, L, K = k.shape
    pad = (C - L % C) % C
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (L + pad) // C
    q, k, v = (x.reshape(N, H, n, C, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(N, H, n, C), beta.reshape(N, H, n, C)

    gam = g.cumsum(-1)                                                     # γ_i within the chunk
    upper = torch.ones(C, C, dtype=torch.bool, device=q.device).triu(1)
    D = (gam[..., :, None] - gam[..., None, :]).masked_fill(upper, float("-inf")).exp()
    kb = k * beta[..., None]
    A = (kb @ k.transpose(-1, -2)) * D                                     # diagonal = β‖k‖², ignored
    U = torch.linalg.solve_triangular(A, v * beta[..., None], upper=False, unitriangular=True)
    Wk = torch.linalg.solve_triangular(A, kb * gam.exp()[..., None], upper=False, unitriangular=True)
    attn = (q @ k.transpose(-1, -2)) * D
    q_dec = q * gam.exp()[..., None]
    k_dec = k * (gam[..., -1:] - gam).exp()[..., None]
    last = gam[..., -1].exp()[..., None, None]                             # [N, H, n, 1, 1]

    o = torch.empty_like(v)
    for i in range(n):
        v_new = U[:, :, i] - Wk[:, :, i] @ S
        o[:, :, i] = q_dec[:, :, i] @ S + attn[:, :, i] @ v_new
        S = S * last[:, :, i] + k_dec[:, :, i].transpose(-1, -2) @ v_new
    return o.reshape(N, H, n * C, v.shape[-1])[:, :, :L], S


def _run(core, q, k, v, g, beta, scale, initial_state, state_indices, output_final_state,
         use_qk_l2norm_in_kernel, cu_seqlens):
    B, T = q.shape[:2]
    Hv, K, V = v.shape[2], k.shape[3], v.shape[3]
    seqs = seq_bounds(cu_seqlens, B, T)
    N = len(seqs)
    S0 = read_state(initial_state, state_indices, (N, Hv, K, V), torch.float32, q.device)
    qh, kh, vh, gh, bh = _prepare(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel)
    out = torch.empty(B, T, Hv, V, dtype=q.dtype, device=q.device)
    if cu_seqlens is None:
        o, S = core(qh, kh, vh, gh, bh, S0)
        out.copy_(o.transpose(1, 2))
    else:
        S = torch.empty_like(S0)
        for n, (_, s, e) in enumerate(seqs):
            o, S[n:n + 1] = core(*(x[:, :, s:e] for x in (qh, kh, vh, gh, bh)), S0[n:n + 1])
            out[0, s:e] = o[0].transpose(0, 1)
    if not output_final_state:
        return out, None
    return out, write_state(initial_state, state_indices, S)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    state_indices: torch.Tensor | None = None,
    output_final_state: bool = True,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Prefill form (chunk size 64, any T >= 1).

    Args:
        q, k: [B, T, Hk, K];  v: [B, T, Hv, V];  g, beta: [B, T, Hv]  (or B = 1 with cu_seqlens [N+1]).
        initial_state: None (zeros), [N, Hv, K, V], or slot pool [S, Hv, K, V] with state_indices [N]
            (updated in place when output_final_state).
    Returns:
        (o [B, T, Hv, V] in q.dtype, final state [N, Hv, K, V] fp32 (pool dtype with slots) or None).
    """
    def core(q_, k_, v_, g_, b_, S_):
        return _chunk_core(q_, k_, v_, g_, b_, S_, chunk_size)

    return _run(core, q, k, v, g, beta, scale, initial_state, state_indices, output_final_state,
                use_qk_l2norm_in_kernel, cu_seqlens)


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    state_indices: torch.Tensor | None = None,
    output_final_state: bool = True,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    dst_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Decode form (token by token; meant for T = 1 or a few speculative tokens). Same arguments and
    results as `chunk_gated_delta_rule` (without chunk_size). With `dst_indices` [N] (slot pool
    only): read the state at `state_indices`, write the final state at `dst_indices` (the entries at
    `state_indices` are left untouched)."""
    if dst_indices is not None:
        initial_state.index_copy_(0, dst_indices.long(), initial_state.index_select(0, state_indices.long()))
        state_indices = dst_indices
    return _run(_recurrent_core, q, k, v, g, beta, scale, initial_state, state_indices,
                output_final_state, use_qk_l2norm_in_kernel, cu_seqlens)
