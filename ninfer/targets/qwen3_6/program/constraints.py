"""Grammar-constrained rows: the host masks of their next tokens, and their grammar state in transactions.

A sequence's TokenConstraint (SequenceRequest.constraint, made by the Frontend) follows the sequence's
produced tokens (ninfer.contract.program.TokenConstraint):

    unit step i     advance the rows' constraints over the unit's steps 0..i-1, fill the rows' masks
                    (host, while step i's forward runs), roll the constraints back; copy the masks to the
                    device and apply them to step i's logits before the sampler (greedy and drawn rows alike)
    unit end        advance each constraint over the tokens its row produced (control: the forced tokens,
                    as far as the grammar takes them); rec.data["grammar"][r][i] = tokens row r's
                    constraint consumed through step i
    commit(a)       roll back what steps a.. consumed (a == 0: everything)
    abort           roll back everything the batch consumed

A speculative round (speculate.py) fills K + 1 masks per row by advancing the constraint through the
drafts and rolling it back, masks the verify logits with them, and then advances over the produced tokens.
Rows without a constraint (or free: their reasoning is open) get all-ones rows; a unit none of whose rows
is constrained applies no mask at all.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ninfer.contract.program import InvariantError, TokenConstraint, mask_words
from ninfer.ops.opset import apply_token_bitmask_


class TokenMasks:
    """Host staging (pinned on CUDA) of up to `rows` token bitmasks [rows, W] int32 over `vocab_size` ids."""

    def __init__(self, vocab_size: int, device: torch.device, rows: int = 1) -> None:
        self.words = mask_words(vocab_size)
        self.device = device
        self._host = self._alloc(max(rows, 1))

    def _alloc(self, rows: int) -> torch.Tensor:
        pin = self.device.type == "cuda"
        return torch.full((rows, self.words), -1, dtype=torch.int32, pin_memory=pin)

    def host_rows(self, n: int) -> torch.Tensor:
        """The first n rows of the staging buffer (grown when needed)."""
        if n > self._host.shape[0]:
            self._host = self._alloc(n)
        return self._host[:n]

    def host(self, constraints: Sequence[TokenConstraint | None]) -> torch.Tensor | None:
        """The rows' masks on the host [n, W] (a view of the staging buffer, valid until the next call);
        None when no row is constrained now."""
        if not any(c is not None and not c.free for c in constraints):
            return None
        out = self.host_rows(len(constraints))
        nbytes = self.words * 4
        batched: dict[type, list[tuple[TokenConstraint, int]]] = {}
        for r, c in enumerate(constraints):
            if c is None:
                out[r].fill_(-1)
            elif hasattr(type(c), "fill_masks"):
                batched.setdefault(type(c), []).append((c, r))
            else:
                c.fill_mask(out[r].data_ptr(), nbytes)
        for cls, rows in batched.items():       # NOTE: one call per class (its rows may be computed in parallel)
            cls.fill_masks(rows, out.data_ptr(), nbytes)
        return out

    def apply(self, logits: torch.Tensor, constraints: Sequence[TokenConstraint | None]) -> bool:
        """Mask logits [n, V] in place with the rows' masks; False (nothing done) when no row is constrained.
        NOTE: the copy from the staging buffer is asynchronous; the caller reads the sampled tokens (a sync)
        before the next call refills it."""
        host = self.host(constraints)
        if host is None:
            return False
        apply_token_bitmask_(logits, host.to(logits.device, non_blocking=True))
        return True


def advance_row(c: TokenConstraint, tokens: Sequence[int], what: str) -> int:
    """Advance one row's constraint over tokens it must take (sampled under its mask, or forced)."""
    n = c.advance(tokens)
    if n != len(tokens):
        raise InvariantError(f"{what}: the output grammar refused token {tokens[n]} after {n} of {list(tokens)}")
    return n


def rollback_rows(constraints: Sequence[TokenConstraint | None], consumed: Sequence[Sequence[int]] | None,
                  accepted: Sequence[int] | None) -> None:
    """Undo what a batch's rows consumed past their accepted tokens (accepted None: abort, everything).
    consumed[r][i]: tokens row r's constraint consumed through step i (cumulative)."""
    if consumed is None:
        return
    for r, c in enumerate(constraints):
        if c is None or not consumed[r]:
            continue
        a = 0 if accepted is None else accepted[r]
        keep = consumed[r][a - 1] if a > 0 else 0
        extra = consumed[r][-1] - keep
        if extra:
            c.rollback(extra)


def draft_masks(masks: TokenMasks, constraints: Sequence[TokenConstraint | None], drafts: Sequence[Sequence[int]]
                ) -> torch.Tensor | None:
    """A speculative round's masks on the host [B * (K + 1), W]: row r's mask t is its constraint's after the
    drafts d_1..d_t (the constraint is advanced through them, then rolled back). Past a draft the grammar
    refuses, the masks are all ones: acceptance stops at that draft (its probability is 0 under the mask
    before it). None when no row is constrained."""
    if all(c is None for c in constraints):
        return None
    T = len(drafts[0]) + 1
    staged = masks.host_rows(len(constraints) * T)
    staged.fill_(-1)
    nbytes = masks.words * 4
    for r, c in enumerate(constraints):
        if c is None:
            continue
        moved = 0
        for t in range(T):
            if not c.free:
                c.fill_mask(staged[r * T + t].data_ptr(), nbytes)
            if t == T - 1 or c.advance([drafts[r][t]]) != 1:
                break
            moved += 1
        c.rollback(moved)
    return staged
