"""Program resources: reservations, refusals, revisions, stale plans, backfill proofs, release."""
from __future__ import annotations

import pytest

from support.program_util import materialize, prefill_all, prompt, tiny_program
from ninfer.contract.program import (InvariantError, Refusal, RefusalKind, ResourcePlan, SequenceRequest,
                                           StalePlanError)


def _req(n_prompt: int, max_out: int, lookahead: int = 0) -> SequenceRequest:
    return SequenceRequest(tuple(prompt(n_prompt, seed=n_prompt)), max_out, lookahead=lookahead)


def _full(prog) -> None:
    prog.check_integrity()
    cap = prog.capacity()
    assert (cap.pages_free, cap.slots_free) == (cap.pages_total, cap.slots_total)


def test_reservation_refuses_exactly_when_pages_or_slots_are_short(tiny_artifact_path):
    prog = tiny_program(tiny_artifact_path, "dense", page_size=4, num_pages=10, num_slots=2, max_model_len=64)
    _full(prog)
    # 40 tokens = 10 pages: fits exactly; 41 never fits
    assert isinstance(prog.plan_materialize(_req(30, 8, lookahead=2)), ResourcePlan)
    r = prog.plan_materialize(_req(30, 9, lookahead=2))
    assert isinstance(r, Refusal) and r.kind is RefusalKind.INFEASIBLE and "needs 11 pages" in r.reason
    r = prog.plan_materialize(_req(60, 5))
    assert r.kind is RefusalKind.INFEASIBLE and "max_model_len 64" in r.reason
    assert prog.plan_materialize(SequenceRequest((), 4)).kind is RefusalKind.INFEASIBLE
    assert prog.plan_materialize(SequenceRequest((1,), 0)).kind is RefusalKind.INFEASIBLE
    assert prog.plan_materialize(SequenceRequest((248320,), 1)).kind is RefusalKind.INFEASIBLE

    rev0 = prog.resource_revision
    plan = prog.plan_materialize(_req(10, 14))           # 24 tokens = 6 pages
    assert (plan.pages, plan.slots, plan.resource_revision) == (6, 1, rev0)
    res = prog.start_materialize(plan)
    assert res.ok and res.pages_held == 6 and res.slots_held == 1 and res.resource_revision == rev0 + 1
    assert prog.resource_revision == rev0 + 1
    prog.check_integrity()
    assert prog.capacity().pages_free == 4
    assert isinstance(prog.plan_materialize(_req(10, 6)), ResourcePlan)          # 16 tokens = 4 pages
    r = prog.plan_materialize(_req(10, 7))                                        # 5 pages
    assert r.kind is RefusalKind.SHORT_NOW and "needs 5 pages, 4 available" in r.reason

    # pages are drawn from the reservation as the frontier grows, lowest ids first
    seq = res.sequence
    prog.prefill(seq, 5)
    assert prog._ledger.holding(seq.seq_id).table.pages == [0, 1]
    assert prog.capacity().pages_free == 4                 # drawing from a reservation changes nothing
    prefill_all(prog, seq)
    assert prog._ledger.holding(seq.seq_id).table.pages == [0, 1, 2]
    prog.check_integrity()

    b = materialize(prog, prompt(3, seed=1), max_output=1)          # 1 page, the second slot
    r = prog.plan_materialize(_req(1, 1))
    assert r.kind is RefusalKind.SHORT_NOW and "needs 1 slot, 0 free" in r.reason
    rev = prog.resource_revision
    assert prog.release(b).resource_revision == rev + 1
    prog.release(seq)
    _full(prog)


def test_stale_plan_is_refused_without_side_effects(tiny_artifact_path):
    prog = tiny_program(tiny_artifact_path, "dense", page_size=4, num_pages=10, num_slots=2, max_model_len=64)
    p1 = prog.plan_materialize(_req(4, 4))
    p2 = prog.plan_materialize(_req(5, 4))
    s1 = prog.start_materialize(p1).sequence
    with pytest.raises(StalePlanError):
        prog.start_materialize(p2)
    prog.check_integrity()
    assert prog.capacity().slots_free == 1
    s2 = prog.start_materialize(prog.plan_materialize(_req(5, 4))).sequence
    prog.release(s1)
    with pytest.raises(InvariantError):
        prog.release(s1)
    prog.release(s2)
    _full(prog)


def test_prove_backfill(tiny_artifact_path):
    prog = tiny_program(tiny_artifact_path, "dense", page_size=4, num_pages=10, num_slots=3, max_model_len=64)
    d1 = prog.start_materialize(prog.plan_materialize(_req(8, 8))).sequence     # 4 pages
    d2 = prog.start_materialize(prog.plan_materialize(_req(8, 8))).sequence     # 4 pages; 2 available
    head = _req(10, 14)                                                          # 6 pages: blocked
    assert prog.plan_materialize(head).kind is RefusalKind.SHORT_NOW
    assert prog.prove_backfill(head, [d1], _req(2, 2)) is False      # 2 - 1 + 4 = 5 < 6
    assert prog.prove_backfill(head, [d1, d2], _req(2, 2)) is True   # 2 - 1 + 8 = 9
    assert prog.prove_backfill(_req(10, 10), [d1], _req(2, 2)) is True   # 5 pages <= 5
    assert prog.prove_backfill(head, [d1, d2], _req(10, 10)) is False    # borrower does not fit now
    assert prog.prove_backfill(_req(40, 30), [d1, d2], _req(2, 2)) is False   # head infeasible from root
    prog.release(d1)
    prog.release(d2)
    with pytest.raises(InvariantError):
        prog.prove_backfill(head, [d1], _req(2, 2))
    _full(prog)


def test_release_returns_everything_at_every_state(tiny_artifact_path):
    prog = tiny_program(tiny_artifact_path, "dense", page_size=4, num_pages=32, num_slots=4, max_model_len=64)
    a = materialize(prog, prompt(9, seed=2), max_output=8)           # materialized only
    b = materialize(prog, prompt(9, seed=3), max_output=8)
    prog.prefill(b, 4)                                                # mid-prefill
    c = materialize(prog, prompt(9, seed=4), max_output=8)
    prefill_all(prog, c)
    prog.commit(prog.decode([c], num_steps=3), [1])                   # decoded with a rolled-back tail
    d = materialize(prog, prompt(9, seed=5), max_output=8)
    step = prog.prefill(d, 100)
    prog.abort_pending(step.pending)                                  # aborted final stage
    for s in (a, b, c, d):
        prog.release(s)
        prog.check_integrity()
    _full(prog)


def test_integrity_check_sees_a_holding_no_sequence_owns(tiny_artifact_path):
    prog = tiny_program(tiny_artifact_path, "dense", page_size=4, num_pages=32, num_slots=4, max_model_len=64)
    a = materialize(prog, prompt(9, seed=2), max_output=8)
    prog.check_integrity()
    prog._ledger.acquire(999, 8)                                      # resources outside any sequence
    with pytest.raises(InvariantError, match="999"):
        prog.check_integrity()
    prog._ledger.release(999)
    prog.release(a)
    _full(prog)
