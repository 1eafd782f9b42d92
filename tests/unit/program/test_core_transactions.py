"""CPU unit tests of PendingBatch exactly-once consumption and the provisional area."""
from __future__ import annotations

import pytest

from ninfer.program.transactions import PendingLedger
from ninfer.contract.program import BatchKind, InvariantError, PendingRow, SequenceHandle


def _rows(*ids: int) -> list[PendingRow]:
    return [PendingRow(SequenceHandle(i, 0), (7,), None) for i in ids]


def test_open_take_close_exactly_once():
    led = PendingLedger(num_scratch=6)
    rec = led.open(BatchKind.DECODE, [1, 2], _rows(1, 2), [2, 2])
    assert rec.scratch == [[0, 1], [2, 3]]
    assert led.pending_of(1) == rec.batch.batch_id and led.num_open == 1
    led.check()
    with pytest.raises(InvariantError, match="unconsumed"):
        led.open(BatchKind.DECODE, [2], _rows(2), [1])
    with pytest.raises(InvariantError, match="unconsumed"):
        led.require_idle(1, "release")
    rec2 = led.open(BatchKind.PREFILL, [3], _rows(3), [1])
    assert rec2.scratch == [[4]]
    with pytest.raises(InvariantError, match="provisional area"):
        led.open(BatchKind.DECODE, [4], _rows(4), [2])
    led.check()
    got = led.take(rec.batch)
    assert got is rec and rec.batch.consumed
    with pytest.raises(InvariantError, match="consumed twice"):
        led.take(rec.batch)
    led.close(rec)
    led.check()
    assert led.pending_of(1) is None and led.pending_of(3) == rec2.batch.batch_id
    rec3 = led.open(BatchKind.DECODE, [1, 4], _rows(1, 4), [1, 2])
    assert rec3.scratch == [[0], [1, 2]]
    led.close(led.take(rec2.batch))
    led.close(led.take(rec3.batch))
    led.check()
    assert led.num_open == 0


def test_foreign_and_duplicate_batches():
    led = PendingLedger(num_scratch=2)
    other = PendingLedger(num_scratch=2)
    rec = other.open(BatchKind.DECODE, [1], _rows(1), [1])
    with pytest.raises(InvariantError, match="not an open batch"):
        led.take(rec.batch)
    with pytest.raises(InvariantError, match="twice in one batch"):
        led.open(BatchKind.DECODE, [1, 1], _rows(1, 1), [1, 1])
    led.check()
