"""Causal depthwise conv1d with carried state (the GDN short convolution, kernel K = 4, no bias).

Math per channel c (x[<0] taken from the state, i.e. the previous K-1 *pre-conv* inputs):
    y[t, c] = act( sum_{j=0..K-1} weight[c, j] * x[t-(K-1)+j, c] )
Activation: SiLU by default (`activation="silu"`, as in the model); `activation=None` gives the raw
conv. Compute is fp32, output in x.dtype (the CUDA causal-conv1d kernel also accumulates in fp32).

State: `conv_state` [N, C, K-1] holds the last K-1 inputs, oldest first (vLLM layout; HF keeps K
columns and never uses the oldest). Dense or slot-pool passing: see `ninfer.ops.reference._state`.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ninfer.ops.reference._state import read_state, seq_bounds, write_state

__all__ = ["chunk_causal_conv1d", "causal_conv1d_update"]


def _act(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return y
    if activation in ("silu", "swish"):
        return F.silu(y)
    raise ValueError(f"unknown activation {activation!r}")


def chunk_causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor | None = None,
    *,
    cu_seqlens: torch.Tensor | None = None,
    state_indices: torch.Tensor | None = None,
    activation: str | None = "silu",
    split: Sequence[int] | None = None,
) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], torch.Tensor]:
    """Prompt (prefill) form: convolve a chunk of T new inputs per sequence, continuing from the state.

    Args:
        x: [B, T, C] dense batch, or [1, T_total, C] packed with `cu_seqlens` [N+1] (int, starts at 0;
            it may end before T_total: the rows after it are padding, their outputs undefined).
        weight: [C, K] (the checkpoint's conv1d.weight [C, 1, K] squeezed).
        conv_state: None (zeros: start of sequence), [N, C, K-1] dense, or a slot pool [S, C, K-1]
            with `state_indices` [N] (then updated in place). N = B, or len(cu_seqlens) - 1.
        activation: "silu" (model) or None.
        split: channel widths summing to C: y is returned as the tuple of its contiguous channel slices
            (the GDN schedule's q, k, v; the fast op writes them in place of a split-and-copy).
    Returns:
        (y [B, T, C] or [1, T_total, C] in x.dtype (a tuple of slices with `split`),
         new_state [N, C, K-1] = the last K-1 inputs of cat(old state, chunk), in conv_state's dtype
         (x.dtype if conv_state is None)). Any T >= 1 works, including T < K-1.
    """
    B, T, C = x.shape
    K = weight.shape[-1]
    seqs = seq_bounds(cu_seqlens, B, T, tail=True)
    N = len(seqs)
    state = read_state(conv_state, state_indices, (N, C, K - 1), torch.float32, x.device)
    w = weight.reshape(C, 1, K).float()
    y = torch.empty_like(x)
    new_state = torch.empty(N, C, K - 1, dtype=torch.float32, device=x.device)
    for n, (b, s, e) in enumerate(seqs):
        window = torch.cat([state[n], x[b, s:e].float().transpose(0, 1)], dim=1)  # [C, K-1+L]
        out = F.conv1d(window.unsqueeze(0), w, groups=C)[0]                          # [C, L]
        y[b, s:e] = _act(out, activation).transpose(0, 1).to(x.dtype)
        new_state[n] = window[:, window.shape[1] - (K - 1):]
    if split is not None:
        if sum(split) != C:
            raise ValueError(f"chunk_causal_conv1d: split {tuple(split)} does not sum to {C} channels")
        y = tuple(t.contiguous() for t in torch.split(y, list(split), dim=-1))
    if conv_state is None:
        return y, new_state.to(x.dtype)
    return y, write_state(conv_state, state_indices, new_state)


def causal_conv1d_update(
    x: torch.Tensor,
    weight: torch.Tensor,
    conv_state: torch.Tensor,
    *,
    state_indices: torch.Tensor | None = None,
    activation: str | None = "silu",
    dst_indices: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode form: one new input per sequence (or a few, e.g. speculative verify), state required.
    With `dst_indices` [B] (slot pool only): read the state at `state_indices`, write the updated
    state at `dst_indices` (the entries at `state_indices` are left untouched).

    Args:
        x: [B, C] (one step) or [B, T, C] (T small steps, same for all rows).
        weight: [C, K].
        conv_state: [B, C, K-1] dense, or slot pool [S, C, K-1] with `state_indices` [B] (updated in place).
    Returns:
        (y with x's shape and dtype, new_state [B, C, K-1] in conv_state.dtype).
    """
    if dst_indices is not None:
        conv_state.index_copy_(0, dst_indices.long(), conv_state.index_select(0, state_indices.long()))
        state_indices = dst_indices
    squeeze = x.dim() == 2
    x3 = x.unsqueeze(1) if squeeze else x
    y, new_state = chunk_causal_conv1d(
        x3, weight, conv_state, state_indices=state_indices, activation=activation
    )
    return (y.squeeze(1) if squeeze else y), new_state
