"""Exactly-once consumption of PendingBatches, and the provisional area they hold.

Every model execution unit that produces tokens opens one PendingBatch. Program keeps the
provisional record behind `batch_id` (whatever the model needs: scratch state entries, sampled
tokens, RNG draws) and hands out the move-only `PendingBatch`. It must then be consumed exactly
once by commit or abort; consuming twice, consuming a batch Program never opened, releasing a
sequence with an unconsumed batch, or starting a new unit for such a sequence is an
InvariantError.

Provisional area (a fixed range of scratch entries of the StateImageStore, part of the workspace):

    scratch  0 .......................................................... total-1
            +-----------------------------+----------------+-------------+
            | held by unconsumed batches   | held ahead     | free        |
            | (per batch: rows x steps)    | (`hold`)       |             |
            +-----------------------------+----------------+-------------+

Entries held ahead belong to no batch: Program's step-ahead (a decode step launched before the round
that needs it is opened) writes them; `open(adopt=...)` hands them to that round's batch, `unhold`
returns them when it is discarded.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Sequence

from ninfer.program.slot_pool import SlotPool
from ninfer.contract.program import BatchKind, InvariantError, PendingBatch, PendingRow


@dataclass(eq=False)
class Provisional:
    """Program-private record behind one PendingBatch."""
    batch: PendingBatch
    seq_ids: tuple[int, ...]
    scratch: list[list[int]]                  # per row: scratch entry after each step
    data: dict[str, Any] = field(default_factory=dict)


class PendingLedger:
    def __init__(self, num_scratch: int) -> None:
        self._scratch = SlotPool(num_scratch) if num_scratch > 0 else None
        self._open: dict[int, Provisional] = {}
        self._busy: dict[int, int] = {}        # seq id -> batch id of its unconsumed batch
        self._ids = itertools.count(1)
        self._ahead_owner = object()
        self._held: set[int] = set()           # entries held ahead (no batch)

    @property
    def num_open(self) -> int:
        return len(self._open)

    def pending_of(self, seq_id: int) -> int | None:
        return self._busy.get(seq_id)

    def require_idle(self, seq_id: int, what: str) -> None:
        b = self._busy.get(seq_id)
        if b is not None:
            raise InvariantError(f"{what} for sequence {seq_id} while its PendingBatch {b} is unconsumed")

    @property
    def num_free_scratch(self) -> int:
        return self._scratch.num_free if self._scratch else 0

    def hold(self, n: int) -> list[int]:
        """Take n free scratch entries for no batch yet (lowest ids first)."""
        if n > self.num_free_scratch:
            raise InvariantError(f"provisional area: {n} entries to hold ahead, {self.num_free_scratch} free")
        got = [self._scratch.alloc(self._ahead_owner) for _ in range(n)]
        self._held.update(got)
        return got

    def unhold(self, entries: Sequence[int]) -> None:
        for e in entries:
            if e not in self._held:
                raise InvariantError(f"scratch entry {e} is not held ahead")
            self._held.discard(e)
            self._scratch.free(e, self._ahead_owner)

    def open(self, kind: BatchKind, seq_ids: Sequence[int], rows: Sequence[PendingRow],
             steps_per_row: Sequence[int], data: dict[str, Any] | None = None,
             adopt: Sequence[Sequence[int]] | None = None) -> Provisional:
        """Open a batch; allocate `steps_per_row[r]` scratch entries for row r (lowest ids first).
        adopt[r]: entries held ahead that become row r's first ones (the rest are allocated)."""
        if len(set(seq_ids)) != len(seq_ids):
            raise InvariantError(f"a sequence appears twice in one batch: {list(seq_ids)}")
        for s in seq_ids:
            self.require_idle(s, "new execution unit")
        adopt = [list(a) for a in adopt] if adopt is not None else [[] for _ in steps_per_row]
        if len(adopt) != len(steps_per_row) or any(len(a) > n for a, n in zip(adopt, steps_per_row)) \
                or any(e not in self._held for a in adopt for e in a):
            raise InvariantError(f"batch adopts entries {adopt} that are not held ahead for its rows")
        need = sum(steps_per_row) - sum(len(a) for a in adopt)
        free = self.num_free_scratch
        if need > free:
            raise InvariantError(f"provisional area: batch needs {need} scratch entries, {free} free "
                                 f"({self.num_open} unconsumed batches hold the rest)")
        batch_id = next(self._ids)
        scratch = []
        for a, n in zip(adopt, steps_per_row):
            for e in a:
                self._held.discard(e)
                self._scratch.hand_over(e, self._ahead_owner, batch_id)
            scratch.append(a + [self._scratch.alloc(batch_id) for _ in range(n - len(a))])
        batch = PendingBatch(batch_id=batch_id, kind=kind, rows=tuple(rows))
        rec = Provisional(batch, tuple(seq_ids), scratch, dict(data or {}))
        self._open[batch_id] = rec
        for s in seq_ids:
            self._busy[s] = batch_id
        return rec

    def get(self, batch: PendingBatch) -> Provisional:
        """The record of an open, unconsumed batch (validates without consuming)."""
        if batch.consumed:
            raise InvariantError(f"PendingBatch {batch.batch_id} consumed twice")
        rec = self._open.get(batch.batch_id)
        if rec is None or rec.batch is not batch:
            raise InvariantError(f"PendingBatch {batch.batch_id} is not an open batch of this Program")
        return rec

    def take(self, batch: PendingBatch) -> Provisional:
        """Consume `batch`: the caller commits or aborts the returned record, then calls `close`."""
        rec = self.get(batch)
        batch.consumed = True
        return rec

    def close(self, rec: Provisional) -> None:
        """Return the record's scratch entries and unbind its sequences."""
        del self._open[rec.batch.batch_id]
        for s in rec.seq_ids:
            if self._busy.get(s) == rec.batch.batch_id:
                del self._busy[s]
        for entries in rec.scratch:
            for e in entries:
                self._scratch.free(e, rec.batch.batch_id)

    def check(self) -> None:
        if self._scratch is not None:
            self._scratch.check()
            held = sum(len(e) for r in self._open.values() for e in r.scratch)
            if held + len(self._held) != self._scratch.num_owned:
                raise InvariantError(f"open batches hold {held} scratch entries and {len(self._held)} are held "
                                     f"ahead, pool says {self._scratch.num_owned}")
            if any(self._scratch.owner(e) is not self._ahead_owner for e in self._held):
                raise InvariantError("an entry held ahead has another owner")
        bound = {s: r.batch.batch_id for r in self._open.values() for s in r.seq_ids}
        if bound != self._busy:
            raise InvariantError("sequence/batch binding out of sync with the open batches")
