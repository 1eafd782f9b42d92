"""The ten invariants of architecture.md §9, each driven through a step-by-step EngineCore over the
scripted FakeProgram (tests/support/fakes.py). Each test names the invariant it guards."""
from __future__ import annotations

import math

import pytest

from support.fakes import FakeProgram, Trace, make_core, make_prompt, run_until_idle
from ninfer.contract.program import InvariantError, SamplingParams
from ninfer.engine.request_record import RequestState
from ninfer.engine.resource_manager import LaneState, ResourceManager
from ninfer.contract.frontend import FinishReason
from ninfer.config import AvailabilityState, EngineRequestError, ErrorKind, GenerationError, GenerationResult, GenerationStart

GREEDY = SamplingParams(temperature=0.0)


def final(handle):
    evs = handle.poll()
    assert evs and isinstance(evs[-1], (GenerationResult, GenerationError)), evs
    return evs[-1]


def admitted_order(trace: Trace) -> list[str]:
    return [i["request_id"] for i in trace.kinds("active")]


# 1. Only Scheduler decides request order ---------------------------------------------------------
def test_inv1_fifo_order_is_kept_when_resources_would_favour_a_later_request():
    # 12 pages of 4 tokens: the head needs 10 pages; two incumbents hold 3 each.
    core, prog, trace, _ = make_core(num_pages=12, page_size=4, max_concurrency=4)
    inc = [core.submit(make_prompt(4), GREEDY, max_tokens=8) for _ in range(2)]
    core.step(); core.step(); core.step(); core.step()
    head = core.submit(make_prompt(20), GREEDY, max_tokens=20, request_id="head")
    small = core.submit(make_prompt(2), GREEDY, max_tokens=2, request_id="small")
    prog.prove_backfill = lambda head, donors, borrower: False        # no proof -> no backfill
    for _ in range(4):
        core.step()
    assert "small" not in admitted_order(trace), "a later request overtook the blocked FIFO head"
    run_until_idle(core)
    order = admitted_order(trace)
    assert order.index("head") < order.index("small")
    assert final(head).finish_reason is FinishReason.LENGTH and final(small).finish_reason


def test_inv1_backfill_only_with_programs_proof():
    core, prog, trace, _ = make_core(num_pages=12, page_size=4, max_concurrency=4)
    inc = [core.submit(make_prompt(4), GREEDY, max_tokens=8) for _ in range(2)]
    for _ in range(3):
        core.step()
    head = core.submit(make_prompt(20), GREEDY, max_tokens=20, request_id="head")
    small = core.submit(make_prompt(2), GREEDY, max_tokens=2, request_id="small")
    for _ in range(3):
        core.step()
    assert prog.backfill_proofs and prog.backfill_proofs[0] is True
    assert "small" in admitted_order(trace) and "head" not in admitted_order(trace)
    assert trace.kinds("backfill")[0]["head"] == "head"
    run_until_idle(core)
    assert set(admitted_order(trace)) >= {"head", "small"}
    assert final(head).finish_reason is FinishReason.LENGTH and final(small).finish_reason
    del inc


# 2. Only ResourceManager decides logical cache policy ----------------------------------------------
def test_inv2_every_terminal_resource_decision_is_made_by_resource_manager(monkeypatch):
    decided = []
    orig = ResourceManager.choose_retention

    def spy(self, rec):
        decided.append(rec.request_id)
        return orig(self, rec)
    monkeypatch.setattr(ResourceManager, "choose_retention", spy)
    core, prog, trace, _ = make_core(eos_mod=5)
    hs = [core.submit(make_prompt(3 + i), GREEDY, max_tokens=6, request_id=f"r{i}") for i in range(6)]
    hs[2].cancel()
    run_until_idle(core)
    released = [i["sequence"] for i in trace.kinds("program.released")]
    assert len(released) == len(admitted_order(trace)) == len(decided)
    assert sorted(decided) == sorted(admitted_order(trace))
    # the decision comes before Program's release of the same request
    names = [(w, i.get("request_id")) for w, i in trace.events if w in ("terminal_pending", "program.released")]
    assert [w for w, _ in names] == ["terminal_pending", "program.released"] * len(released)


# 3. Only Program decides physical occupancy, reservation, feasibility and model state ---------------
def test_inv3_feasibility_and_occupancy_are_programs_answers():
    core, prog, trace, _ = make_core(num_pages=8, page_size=4, max_concurrency=4)
    prog.infeasible = lambda req: 13 in req.prompt_token_ids        # a rule only Program knows
    bad = core.submit(make_prompt(3, start=13), GREEDY, max_tokens=2)
    big = core.submit(make_prompt(10), GREEDY, max_tokens=14)        # 6 pages: fits alone
    big2 = core.submit(make_prompt(10), GREEDY, max_tokens=14)       # lanes free, pages short now
    for _ in range(4):
        core.step()
    ev = final(bad)
    assert isinstance(ev, GenerationError) and ev.kind is ErrorKind.INVALID_REQUEST
    recs = {r.request_id: r for r in core.records.values()}
    assert recs[big2.request_id].state is RequestState.WAITING       # free lanes, but Program said short
    assert core.rm.free_lane() is not None
    assert core.metrics().pages_free == prog.capacity().pages_free
    run_until_idle(core)
    assert final(big).finish_reason and final(big2).finish_reason
    assert core.metrics().pages_free == prog.num_pages


# 4. Before Active is published: complete continuation and completion reservation ----------------------
def test_inv4_generation_start_only_after_the_full_reservation_is_held():
    trace = Trace()
    prog = FakeProgram(page_size=4, num_pages=40)
    seen = []

    def check(what, info):
        if what == "publish" and isinstance(info["event"], GenerationStart):
            seq = trace.seq_of[info["request_id"]]
            seen.append((prog.reservation_pages(seq), info["event"]))
    trace.extra.append(check)
    core, prog, trace, _ = make_core(prog, trace=trace)
    hs = [core.submit(make_prompt(n), GREEDY, max_tokens=m) for n, m in [(3, 5), (9, 2), (1, 30)]]
    run_until_idle(core)
    assert [p for p, _ in seen] == [math.ceil((3 + 5) / 4), math.ceil((9 + 2) / 4), math.ceil((1 + 30) / 4)]
    assert [ev.num_prompt_tokens for _, ev in seen] == [3, 9, 1]
    assert all(final(h).finish_reason is FinishReason.LENGTH for h in hs)


# 5. At most one global resource-topology transition at any time -------------------------------------
def test_inv5_transitions_never_overlap_and_never_cross_a_model_unit():
    core, prog, trace, _ = make_core(eos_mod=4, num_pages=20, max_concurrency=4)
    depth = {"now": 0, "max": 0}
    for name in ("start_materialize", "release"):
        orig = getattr(prog, name)

        def wrapped(*a, _orig=orig):
            depth["now"] += 1
            depth["max"] = max(depth["max"], depth["now"])
            assert core.rm.transition_in_flight is not None
            try:
                return _orig(*a)
            finally:
                depth["now"] -= 1
        setattr(prog, name, wrapped)
    hs = [core.submit(make_prompt(2 + i % 5), GREEDY, max_tokens=3 + i % 4) for i in range(12)]
    hs[3].cancel()
    run_until_idle(core)
    assert depth["max"] == 1 and core.rm.num_transitions >= 2 * 11
    assert core.availability.state is AvailabilityState.READY


def test_inv5_resource_manager_refuses_a_second_transition():
    core, prog, _, _ = make_core()
    with core.rm._transition_of("first"):
        with pytest.raises(InvariantError):
            with core.rm._transition_of("second"):
                pass
        assert core.rm.transition_in_flight == "first"      # the refused one leaves the first in flight
    assert core.rm.transition_in_flight is None


# 6. A PendingBatch is consumed completely by exactly one commit or abort --------------------------
def test_inv6_each_batch_consumed_once_and_membership_checked():
    core, prog, trace, _ = make_core(eos_mod=6)
    consumed = {}
    for name in ("commit", "abort_pending"):
        orig = getattr(prog, name)

        def wrapped(batch, *a, _orig=orig, _name=name):
            consumed[batch.batch_id] = consumed.get(batch.batch_id, 0) + 1
            return _orig(batch, *a)
        setattr(prog, name, wrapped)
    hs = [core.submit(make_prompt(3), GREEDY, max_tokens=5) for _ in range(5)]
    while core.step():
        assert prog.num_open_batches == 0
    opened = [b for b in range(1, max(consumed) + 1)]
    assert sorted(consumed) == opened and set(consumed.values()) == {1}
    assert all(final(h) for h in hs)


def test_inv6_inconsistent_membership_fails_the_engine_and_aborts_the_batch():
    core, prog, trace, _ = make_core()
    orig = prog.decode

    def swapped(seqs, n=1):
        b = orig(seqs, n)
        if len(b.rows) > 1:
            b.rows = (b.rows[1], b.rows[0]) + b.rows[2:]
        return b
    prog.decode = swapped
    hs = [core.submit(make_prompt(2), GREEDY, max_tokens=8) for _ in range(3)]
    run_until_idle(core)
    assert core.availability.state is AvailabilityState.FAILED
    assert "row 0" in core.availability.reason
    assert prog.num_open_batches == 0 and prog.num_sequences == 0
    assert all(isinstance(final(h), GenerationError) for h in hs)


# 7. Output visible only after Program, Frontend and budget committed --------------------------------
def test_inv7_every_published_token_was_committed_first():
    core, prog, trace, _ = make_core(eos_mod=7, decode_steps=3)
    hs = [core.submit(make_prompt(2 + i), GREEDY, max_tokens=4 + i, request_id=f"r{i}") for i in range(8)]
    run_until_idle(core)
    assert trace.violations == []
    assert sum(len(v) for v in trace.published.values()) > 20
    for h in hs:
        r = final(h)
        assert list(r.token_ids) == trace.published[h.request_id]


def test_inv7_failed_program_commit_publishes_nothing_and_commits_no_session():
    core, prog, trace, _ = make_core()
    h = core.submit(make_prompt(2), GREEDY, max_tokens=10)
    for _ in range(4):
        core.step()
    before = list(trace.published.get(h.request_id, []))
    assert before and h.poll()
    sess = core.frontend.sessions[0]
    commits = sess.num_commits
    prog.faults["commit"] = prog.calls.count("commit") + 1
    core.step()
    assert core.availability.state is AvailabilityState.FAILED
    assert sess.num_commits == commits and trace.published.get(h.request_id, []) == before
    ev = h.poll()
    assert [type(e) for e in ev][-1] is GenerationError and not any(getattr(e, "token_ids", ()) for e in ev[:-1])


# 8. Before TerminalPending ends, active ownership is neither released nor reused --------------------
def test_inv8_terminal_lane_is_not_reused_before_release():
    core, prog, trace, _ = make_core(max_concurrency=1)
    a = core.submit(make_prompt(2), GREEDY, max_tokens=50, request_id="a")
    b = core.submit(make_prompt(2), GREEDY, max_tokens=3, request_id="b")
    for _ in range(3):
        core.step()
    a.cancel()
    core.step()                                    # boundary: a -> TerminalPending
    rec_a = next(r for r in core.records.values() if r.request_id == "a")
    assert rec_a.state is RequestState.TERMINAL_PENDING
    assert core.rm.lanes[0].state is LaneState.TERMINAL_PENDING
    assert prog.num_sequences == 1 and admitted_order(trace) == ["a"]
    core.step()                                    # settle (release), then b may take the lane
    assert trace.kinds("program.released")[0]["sequence"] == trace.seq_of["a"]
    run_until_idle(core)
    assert admitted_order(trace) == ["a", "b"]
    order = [w for w, i in trace.events if w in ("program.released", "program.materialized")]
    assert order == ["program.materialized", "program.released", "program.materialized", "program.released"]
    assert final(a).finish_reason is FinishReason.CANCELLED


# 9. Cancellation changes request state only at a linearised worker boundary --------------------------
def test_inv9_cancel_takes_effect_only_at_a_boundary():
    core, prog, trace, _ = make_core()
    w = core.submit(make_prompt(2), GREEDY, max_tokens=5)
    core.step()
    rec = next(iter(core.records.values()))
    for _ in range(3):
        core.step()
    state = rec.state
    n_events = len(trace.events)
    w.cancel()
    assert rec.state is state and len(trace.events) == n_events
    core.step()
    assert rec.state in (RequestState.TERMINAL_PENDING, RequestState.FINISHED)


def test_inv9_cancel_during_a_unit_is_a_cancelled_row_of_that_unit():
    core, prog, trace, _ = make_core()
    hs = [core.submit(make_prompt(2), GREEDY, max_tokens=20, request_id=f"r{i}") for i in range(3)]
    while not prog.decode_sizes or prog.decode_sizes[-1] < 3:
        core.step()
    victim = hs[1]
    prog.on_call = lambda name: victim.cancel() if name == "decode" else None
    before = len(trace.published.get("r1", []))
    core.step()                                    # decode round with r1 cancelled mid-unit
    prog.on_call = None
    commit = trace.kinds("program_commit")[-1]
    assert commit["accepted"] == (1, 0, 1)
    assert len(trace.published["r1"]) == before
    run_until_idle(core)
    r = final(victim)
    assert r.finish_reason is FinishReason.CANCELLED and len(r.token_ids) == before
    assert final(hs[0]).finish_reason is FinishReason.LENGTH


# 10. Every accepted request, resource transaction and model transaction has one finite end state -----
def test_inv10_everything_ends_exactly_once():
    core, prog, trace, clock = make_core(eos_mod=5, queue_size=6, max_concurrency=3, request_timeout_s=5.0)
    hs = []
    for i in range(9):
        hs.append(core.submit(make_prompt(1 + i % 6), GREEDY, max_tokens=2 + i % 7))
    hs[0].cancel(); hs[7].cancel()
    for i in range(5):
        core.step()
    clock.advance(10.0)                            # queue deadlines pass for whoever still waits
    run_until_idle(core)
    finals = [final(h) for h in hs]
    assert all(v == 1 for v in trace.finals.values()) and len(trace.finals) == 9
    kinds = {type(f).__name__ for f in finals}
    assert "GenerationError" in kinds and "GenerationResult" in kinds
    assert prog.num_open_batches == 0 and prog.num_sequences == 0 and core.rm.transition_in_flight is None
    assert all(lane.state is LaneState.FREE for lane in core.rm.lanes)
    assert core.capacity.used == 0 and not core.records
    prog.check_integrity()


def test_fault_mid_commit_fails_engine_cleanly():
    core, prog, trace, _ = make_core(max_concurrency=2, queue_size=6)
    hs = [core.submit(make_prompt(3), GREEDY, max_tokens=10) for _ in range(6)]
    for _ in range(8):
        core.step()
    prog.faults["commit.torn"] = prog.calls.count("commit") + 1
    run_until_idle(core)
    a = core.availability
    assert a.state is AvailabilityState.FAILED and "mid-commit" in a.reason
    assert core.stopped and not core.step()
    errs = [final(h) for h in hs]
    assert all(isinstance(e, GenerationError) and e.kind is ErrorKind.ENGINE_FAILED for e in errs)
    assert prog.num_open_batches == 0 and prog.num_sequences == 0       # aborted first, then released
    assert prog.calls.index("abort_pending", len(prog.calls) - 4) < len(prog.calls) - 1
    prog.check_integrity()
    assert core.capacity.used == 0
    with pytest.raises(EngineRequestError) as e:
        core.submit(make_prompt(2), GREEDY, max_tokens=2)
    assert e.value.kind is ErrorKind.NOT_READY


def test_failure_cleanup_errors_are_traced_and_every_request_still_ends_once():
    core, prog, trace, _ = make_core(max_concurrency=2, queue_size=4)
    hs = [core.submit(make_prompt(3), GREEDY, max_tokens=10) for _ in range(4)]
    for _ in range(8):
        core.step()
    prog.faults["decode"] = prog.calls.count("decode") + 1
    prog.faults["release"] = prog.calls.count("release") + 1          # the first cleanup release fails
    run_until_idle(core)
    assert core.availability.state is AvailabilityState.FAILED and "decode" in core.availability.reason
    errors = trace.kinds("cleanup_error")
    assert [e["call"] for e in errors] == ["release"] and "InjectedFault" in errors[0]["error"]
    assert all(final(h).kind is ErrorKind.ENGINE_FAILED for h in hs) and not trace.violations
    assert core.capacity.used == 0 and not core.records
