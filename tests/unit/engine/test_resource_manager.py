"""ResourceManager unit tests over the scripted Program: lanes follow adopted results only."""
from __future__ import annotations

import pytest

from support.fakes import FakeProgram
from ninfer.contract.program import InvariantError, ResourceResult, SamplingParams, StalePlanError
from ninfer.engine.handle import RequestTicket
from ninfer.engine.request_record import RequestRecord
from ninfer.engine.resource_manager import LaneState, ResourceManager
from ninfer.contract.frontend import OutputOptions, PreparedPrompt


def rec(order: int, n: int = 3, max_tokens: int = 5) -> RequestRecord:
    return RequestRecord(f"r{order}", order, PreparedPrompt(tuple(range(11, 11 + n))), SamplingParams(), max_tokens,
                         OutputOptions(), None, RequestTicket(f"r{order}", lambda: None, lambda: None), 0.0, 10.0)


def test_lane_cycle_and_release():
    prog = FakeProgram(num_pages=8, page_size=4)
    rm = ResourceManager(prog, 2)
    a = rec(1)
    res = rm.materialize(a, rm.plan_admission(a))
    assert res.ok and rm.lanes[0].state is LaneState.ACTIVE and a.sequence == res.sequence
    assert prog.capacity().pages_free == 6
    rm.begin_terminal(a)
    assert rm.lanes[0].state is LaneState.TERMINAL_PENDING and prog.num_sequences == 1
    rm.settle_terminal(a)
    assert rm.lanes[0].state is LaneState.FREE and a.sequence is None and prog.num_sequences == 0
    prog.check_integrity()


def test_stale_plan_unclaims_the_lane():
    prog = FakeProgram(num_pages=8, page_size=4)
    rm = ResourceManager(prog, 2)
    a, b = rec(1), rec(2)
    plan_b = rm.plan_admission(b)
    rm.materialize(a, rm.plan_admission(a))           # advances resource_revision
    with pytest.raises(StalePlanError):
        rm.materialize(b, plan_b)
    assert rm.lanes[1].state is LaneState.FREE and b.lane is None and rm.transition_in_flight is None


def test_adoption_rejects_inconsistent_results():
    prog = FakeProgram(num_pages=8, page_size=4)
    rm = ResourceManager(prog, 2)
    a = rec(1)
    plan = rm.plan_admission(a)
    prog.start_materialize = lambda plan: ResourceResult(True, 1, None)
    with pytest.raises(InvariantError):
        rm.materialize(a, plan)
    prog2 = FakeProgram()
    rm2 = ResourceManager(prog2, 1)
    b = rec(2)
    rm2.materialize(b, rm2.plan_admission(b))
    with pytest.raises(InvariantError):
        rm2.settle_terminal(b)                        # not TerminalPending: ownership must not be released
    prog2.release = lambda seq: ResourceResult(True, 9, seq, 0, 1, 0)
    rm2.begin_terminal(b)
    with pytest.raises(InvariantError):
        rm2.settle_terminal(b)                        # Program says pages are still held
