"""Shared convention for ops that carry per-sequence state (conv and gated-delta-rule).

Two ways to pass state, the same for every stateful op:

* dense: `state` is [N, ...] (one row per sequence) or None (zeros). It is never modified; the
  new state is returned as a fresh [N, ...] tensor. The caller stores it wherever it wants
  (this is how copy-on-write of a checkpoint slot is done: read the checkpoint, write elsewhere).
* slots: `state` is a slot pool [S, ...] and `state_indices` is [N] int (slot id per sequence).
  Rows `state[state_indices]` are read, and the new state is written back into those rows
  **in place** (and also returned as [N, ...]). A fresh sequence's slot must be zeroed by the
  caller first; copy-on-write means copying the checkpoint slot into a private slot first.
"""

from __future__ import annotations

import torch


def read_state(
    state: torch.Tensor | None,
    state_indices: torch.Tensor | None,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """Gather the [N, ...] starting state (zeros when `state` is None), cast to `dtype`."""
    if state is None:
        if state_indices is not None:
            raise ValueError("state_indices given without a state pool")
        return torch.zeros(shape, dtype=dtype, device=device)
    if state_indices is not None:
        state = state.index_select(0, state_indices.to(device=state.device, dtype=torch.long))
    if tuple(state.shape) != tuple(shape):
        raise ValueError(f"state has shape {tuple(state.shape)}, expected {tuple(shape)}")
    return state.to(dtype=dtype, device=device)


def write_state(state: torch.Tensor | None, state_indices: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """Write `new` [N, ...] back into the slot pool if `state_indices` was given; return `new` cast to the pool dtype."""
    if state is not None:
        new = new.to(state.dtype)
        if state_indices is not None:
            state.index_copy_(0, state_indices.to(device=state.device, dtype=torch.long), new)
    return new


def seq_bounds(cu_seqlens: torch.Tensor | None, batch: int, seqlen: int, *, tail: bool = False
               ) -> list[tuple[int, int, int]]:
    """(sequence index, batch row, [start, end)) per sequence for a dense batch or a packed varlen batch.

    Returns a list of (b, start, end): for dense inputs b = row and [0, T); for packed inputs b = 0.
    tail: the packed sequences may end before seqlen (the rows after them are padding, which no
    sequence owns).
    """
    if cu_seqlens is None:
        return [(b, 0, seqlen) for b in range(batch)]
    if batch != 1:
        raise ValueError(f"with cu_seqlens the batch dimension must be 1, got {batch}")
    cu = [int(c) for c in cu_seqlens.tolist()]
    if cu[0] != 0 or cu[-1] > seqlen or (cu[-1] != seqlen and not tail) or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens {cu} does not partition a sequence of length {seqlen}")
    return [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
