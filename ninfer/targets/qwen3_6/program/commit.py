"""Consuming a PendingBatch: commit moves accepted tokens into the sequences, abort copies nothing.

    commit(batch, accepted)   row r, 1 <= a = accepted[r] <= produced:
      tokens      += the row's first a produced tokens
      frontier    += a (a PREFILL batch: the prompt's end)
      rng_state    = the sampler's state after the a-th draw (CONTROL: unchanged), so an unaccepted
                     draw is never seen again
      slot        <- scratch entry [r][a-1] by StateImageStore.swap (a relabel, no copy); the freed
                     scratch entry gets the slot's old image
    a == 0 is a cancelled row: nothing changes. Every scratch entry of the batch goes back.
    A constrained row's grammar is rolled back over its produced tokens past a (abort: all of them).
"""
from __future__ import annotations

from typing import Sequence

from ninfer.contract.program import BatchKind, InvariantError, PendingBatch
from ninfer.targets.qwen3_6.program.constraints import rollback_rows


class CommitOps:
    """Mixed into Qwen36Program: `commit` and `abort_pending`. Uses its `_pending`, `_state`,
    `step_ahead` and the publication slot of CheckpointOps (`_note_commit`)."""

    def commit(self, batch: PendingBatch, accepted: Sequence[int],
               boundaries: Sequence[int | None] | None = None) -> None:
        """boundaries[r]: the Frontend's reconstruction boundary inside row r's accepted span."""
        rec = self._pending.get(batch)
        accepted = list(accepted)
        if len(accepted) != batch.size:
            raise InvariantError(f"commit of batch {batch.batch_id}: {len(accepted)} decisions for {batch.size} rows")
        for row, a in zip(batch.rows, accepted):
            if not (0 <= a <= row.produced_tokens):
                raise InvariantError(f"commit of batch {batch.batch_id}: accepted {a} of {row.produced_tokens} "
                                     f"produced tokens")
        self.step_ahead.on_commit(batch, accepted, rec.seq_ids)
        self._pending.take(batch)
        self._rollback_grammar(batch, rec, accepted)
        try:
            for r, (row, a) in enumerate(zip(batch.rows, accepted)):
                if a == 0:
                    continue
                s = self._seq(row.sequence)
                f0 = s.frontier
                s.tokens.extend(row.tokens[:a])
                if batch.kind is BatchKind.PREFILL:
                    s.frontier = rec.data["end"]
                else:
                    s.frontier += a
                if batch.kind is not BatchKind.CONTROL:
                    s.rng_state = rec.data["rng"][r][a - 1]
                self._note_commit(s, rec, r, a, f0, batch.kind is BatchKind.PREFILL,
                                  boundaries[r] if boundaries is not None else None)
                # NOTE: last (the publication copy above reads the scratch image): the slot takes the image
                #       of the last accepted step by a swap; the scratch entry, freed below, gets the old one.
                self._state.swap(s.slot, self._state.scratch_entry(rec.scratch[r][a - 1]))
        finally:
            self._pending.close(rec)

    def abort_pending(self, batch: PendingBatch) -> None:
        rec = self._pending.take(batch)
        self._rollback_grammar(batch, rec, None)
        self.step_ahead.discard(*rec.seq_ids)      # the source's rows are the step-ahead's
        self._pending.close(rec)

    def _rollback_grammar(self, batch: PendingBatch, rec, accepted: Sequence[int] | None) -> None:
        """Constrained rows: undo what the tokens past each row's accepted prefix moved in its grammar
        (accepted None: an abort, every produced token; constraints.py)."""
        consumed = rec.data.get("grammar")
        if consumed is not None:
            rollback_rows([self._seq(row.sequence).request.constraint for row in batch.rows], consumed, accepted)
