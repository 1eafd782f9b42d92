"""Scheduler unit tests: FIFO queue, prefill gate, unit rotation, exact-B rounds, head protection."""
from __future__ import annotations

from ninfer.contract.program import SamplingParams
from ninfer.engine.admission_policy import AdmissionEvent, AdmissionTrigger, OutstandingCapacity
from ninfer.engine.handle import RequestTicket
from ninfer.engine.request_record import RequestRecord, RequestState
from ninfer.engine.scheduler import Scheduler, UnitKind
from ninfer.contract.frontend import OutputOptions, PreparedPrompt

S = RequestState


def rec(order: int, state: RequestState = S.WAITING) -> RequestRecord:
    r = RequestRecord(f"r{order}", order, PreparedPrompt((1, 2, 3)), SamplingParams(), 4, OutputOptions(), None,
                      RequestTicket(f"r{order}", lambda: None, lambda: None), 0.0, 10.0)
    r.state = state
    return r


def test_fifo_restore_and_protection():
    s = Scheduler()
    a, b, c = rec(1), rec(2), rec(3)
    for r in (a, b, c):
        s.enqueue(r)
    assert s.head() is a
    s.remove_waiting(a)
    s.restore(a)                                   # an aborted materialization keeps its FIFO position
    assert s.waiting == (a, b, c)
    inc = rec(9, S.DECODE_READY)
    s.protect_head(a, (inc,))
    assert s.borrowers() == (b, c) and s.donors == (inc,)
    c.ticket.cancel_requested = True
    assert s.borrowers() == (b,)
    s.remove_waiting(a)
    assert s.protected_head is None and s.borrowers() == ()


def test_rotation_never_runs_two_prefills_while_decode_waits():
    s = Scheduler()
    d1, d2 = rec(1, S.DECODE_READY), rec(2, S.DECODE_READY)
    s._active += [d1, d2]
    p = rec(3, S.PREFILL)
    s.activate(p)
    c = rec(4, S.CONTROL_READY)
    s._active.append(c)
    kinds = [s.choose_unit().kind for _ in range(6)]
    assert kinds == [UnitKind.PREFILL, UnitKind.CONTROL, UnitKind.DECODE] * 2
    c.state = S.DECODE_READY
    units = [s.choose_unit() for _ in range(4)]
    assert [u.kind for u in units] == [UnitKind.PREFILL, UnitKind.DECODE] * 2
    assert units[1].records == (d1, d2, c)         # all and only the decode-ready, activation order
    s.prefill_done(p)
    p.state = S.DECODE_READY
    assert s.choose_unit().records == (d1, d2, p, c)


def test_admission_trigger_and_capacity():
    t = AdmissionTrigger()
    assert t.armed and t.consume() == {AdmissionEvent.QUEUE_CHANGED} and not t.armed
    t.observe_revision(3)
    assert t.armed and t.consume() == {AdmissionEvent.REVISION_CHANGED}
    t.observe_revision(3)
    assert not t.armed
    cap = OutstandingCapacity(2)
    assert cap.try_acquire() and cap.try_acquire() and not cap.try_acquire()
    cap.release()
    assert cap.free == 1
