"""Request lifecycle through a step-driven EngineCore over the fakes: cancellation at every state,
deadlines, overload, staged prefill fairness, exact-B decode rounds, forced control, budgets."""
from __future__ import annotations

import pytest

from support.fakes import THINK_END, FakeProgram, make_core, make_prompt, run_until_idle
from ninfer.contract.program import SamplingParams
from ninfer.engine.request_record import RequestState
from ninfer.contract.frontend import FinishReason, OutputOptions
from ninfer.config import (EngineRequestError, ErrorKind, GenerationDelta, GenerationError, GenerationResult,
                          GenerationStart)

GREEDY = SamplingParams(temperature=0.0)


def events(h):
    return h.poll()


def rec_of(core, h):
    return next((r for r in core.records.values() if r.request_id == h.request_id), None)


def step_until(core, pred, limit=200):
    for _ in range(limit):
        if pred():
            return
        core.step()
    raise AssertionError("condition never reached")


# ---- cancellation at every state (architecture.md §6 table) ---------------------------------------
def test_cancel_waiting_creates_no_program_state():
    core, prog, trace, _ = make_core(max_concurrency=1)
    a = core.submit(make_prompt(2), GREEDY, max_tokens=30)
    b = core.submit(make_prompt(2), GREEDY, max_tokens=30)
    core.step()
    b.cancel()
    core.step()
    ev = events(b)
    assert len(ev) == 1 and isinstance(ev[0], GenerationResult) and ev[0].finish_reason is FinishReason.CANCELLED
    assert ev[0].token_ids == () and ev[0].usage.num_output_tokens == 0
    assert prog.calls.count("start_materialize") == 1
    a.cancel()
    run_until_idle(core)


def test_cancel_while_materializing_adopts_then_terminates():
    core, prog, trace, _ = make_core()
    h = core.submit(make_prompt(5), GREEDY, max_tokens=10)
    prog.on_call = lambda name: h.cancel() if name == "start_materialize" else None
    core.step()
    prog.on_call = None
    r = rec_of(core, h)
    assert r.state is RequestState.TERMINAL_PENDING and r.sequence is not None   # adopted first
    run_until_idle(core)
    ev = events(h)
    assert isinstance(ev[0], GenerationStart) and ev[-1].finish_reason is FinishReason.CANCELLED
    assert prog.num_sequences == 0 and "prefill" not in prog.calls


def test_cancel_between_prefill_stages():
    core, prog, trace, _ = make_core(prefill_chunk_tokens=3)
    h = core.submit(make_prompt(10), GREEDY, max_tokens=10)
    core.step()
    assert rec_of(core, h).state is RequestState.PREFILL and rec_of(core, h).num_computed_tokens == 3
    h.cancel()
    run_until_idle(core)
    ev = events(h)
    assert ev[-1].finish_reason is FinishReason.CANCELLED and ev[-1].usage.num_output_tokens == 0
    assert prog.calls.count("prefill") == 1 and prog.num_sequences == 0


def test_cancel_in_final_prefill_stage_is_a_cancelled_row():
    core, prog, trace, _ = make_core(prefill_chunk_tokens=8)
    h = core.submit(make_prompt(4), GREEDY, max_tokens=10)
    prog.on_call = lambda name: h.cancel() if name == "prefill" else None
    core.step()
    prog.on_call = None
    assert "abort_pending" in prog.calls and "commit" not in prog.calls      # every row cancelled -> abort
    run_until_idle(core)
    ev = events(h)
    assert [type(e) for e in ev] == [GenerationStart, GenerationResult]
    assert ev[-1].finish_reason is FinishReason.CANCELLED


def test_cancel_decode_ready_and_control_ready():
    core, prog, trace, _ = make_core()
    opts = OutputOptions(thinking_budget=2)
    t = core.submit(make_prompt(3, thinking=True), GREEDY, max_tokens=30, output=opts)
    d = core.submit(make_prompt(3), GREEDY, max_tokens=30)
    step_until(core, lambda: getattr(rec_of(core, t), "state", None) is RequestState.CONTROL_READY)
    t.cancel()
    step_until(core, lambda: getattr(rec_of(core, d), "state", None) is RequestState.DECODE_READY)
    d.cancel()
    run_until_idle(core)
    for h in (t, d):
        assert events(h)[-1].finish_reason is FinishReason.CANCELLED
    assert "control" not in prog.calls and prog.num_sequences == 0


def test_cancel_after_terminal_does_not_change_the_outcome():
    core, prog, trace, _ = make_core()
    h = core.submit(make_prompt(2), GREEDY, max_tokens=2)
    run_until_idle(core)
    h.cancel()
    run_until_idle(core)
    ev = events(h)
    assert ev[-1].finish_reason is FinishReason.LENGTH and len(ev[-1].token_ids) == 2


# ---- queue: deadlines and overload ---------------------------------------------------------------
def test_queue_deadline_rejects_only_waiting_requests():
    core, prog, trace, clock = make_core(max_concurrency=1, request_timeout_s=10.0)
    a = core.submit(make_prompt(2), GREEDY, max_tokens=5)
    b = core.submit(make_prompt(2), GREEDY, max_tokens=5, deadline_s=1.0)
    core.step()
    clock.advance(2.0)
    run_until_idle(core)
    eb = events(b)
    assert len(eb) == 1 and isinstance(eb[0], GenerationError) and eb[0].kind is ErrorKind.QUEUE_TIMEOUT
    assert events(a)[-1].finish_reason is FinishReason.LENGTH        # already active: no deadline


def test_overload_rejects_at_submit_and_capacity_returns():
    core, prog, trace, _ = make_core(max_concurrency=2, queue_size=1)
    hs = [core.submit(make_prompt(2), GREEDY, max_tokens=3) for _ in range(3)]
    with pytest.raises(EngineRequestError) as e:
        core.submit(make_prompt(2), GREEDY, max_tokens=3)
    assert e.value.kind is ErrorKind.OVERLOADED
    run_until_idle(core)
    assert core.capacity.used == 3                     # response done, consumers not yet released
    for h in hs:
        h.result()
    assert core.capacity.used == 0
    assert core.metrics().num_requests_rejected == {"overloaded": 1}
    core.submit(make_prompt(2), GREEDY, max_tokens=3).close()


@pytest.mark.parametrize("kw, msg", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=250), "max_model_len"),
    (dict(max_tokens=3, deadline_s=-1.0), "deadline_s"),
    (dict(max_tokens=3, output=OutputOptions(thinking_budget=-1)), "output options"),
])
def test_invalid_requests_raise_at_submit(kw, msg):
    core, prog, trace, _ = make_core(max_model_len=256)
    with pytest.raises(EngineRequestError) as e:
        core.submit(make_prompt(10), GREEDY, **kw)
    assert e.value.kind is ErrorKind.INVALID_REQUEST and msg in str(e.value)
    assert core.capacity.used == 0 and not core.records


def test_infeasible_request_ends_with_an_error_event():
    core, prog, trace, _ = make_core(num_pages=4, page_size=4)
    h = core.submit(make_prompt(10), GREEDY, max_tokens=10)          # 5 pages > pool of 4
    run_until_idle(core)
    ev = events(h)
    assert len(ev) == 1 and ev[0].kind is ErrorKind.INVALID_REQUEST and "pool" in ev[0].message


# ---- scheduling --------------------------------------------------------------------------------------
def test_prefill_stages_alternate_with_decode_and_rounds_hold_all_decode_ready():
    core, prog, trace, _ = make_core(prefill_chunk_tokens=2, max_concurrency=4, eos_mod=0)
    sizes = []

    def on_unit(what, info):
        if what == "unit":
            ready = [r for r in core.records.values() if r.state is RequestState.DECODE_READY]
            sizes.append((info["kind"].value, len(info["rows"]), len(ready), len(core.records)))
    trace.extra.append(on_unit)
    hs = [core.submit(make_prompt(7 + i), GREEDY, max_tokens=40) for i in range(6)]
    run_until_idle(core)
    kinds = [k for k, *_ in sizes]
    for prev, (k, rows, ready, _) in zip([None] + sizes[:-1], sizes):
        if k == "decode":
            assert rows == ready                      # all and only the decode-ready requests
        if k == "prefill" and prev is not None and prev[0] == "prefill":
            assert ready == 0                         # consecutive prefill only when nothing can decode
    assert prog.decode_sizes == [rows for k, rows, *_ in sizes if k == "decode"]
    assert max(prog.decode_sizes) == 4 and "prefill" in kinds
    for h in hs:
        assert h.result().finish_reason is FinishReason.LENGTH


def test_greedy_output_is_independent_of_batch_neighbours():
    alone_core, prog_a, _, _ = make_core(eos_mod=40)
    p = make_prompt(6, start=40)
    alone = alone_core.submit(p, GREEDY, max_tokens=25)
    run_until_idle(alone_core)
    ref = alone.result().token_ids
    assert ref == prog_a.reference(p.token_ids, 25)
    core, prog, _, _ = make_core(eos_mod=40, max_concurrency=8, queue_size=16, prefill_chunk_tokens=3)
    others = [core.submit(make_prompt(1 + i), GREEDY, max_tokens=30 + 3 * i) for i in range(4)]
    core.step(); core.step(); core.step()
    target = core.submit(p, GREEDY, max_tokens=25)
    others += [core.submit(make_prompt(9 - i, start=90), GREEDY, max_tokens=20 + i) for i in range(5)]
    for _ in range(7):
        core.step()
    others[2].cancel()
    run_until_idle(core)
    assert target.result().token_ids == ref
    assert max(prog.decode_sizes) >= 5


# ---- model output semantics --------------------------------------------------------------------------
def test_forced_control_goes_through_the_same_commit_path():
    core, prog, trace, _ = make_core()
    h = core.submit(make_prompt(3, thinking=True), GREEDY, max_tokens=10, output=OutputOptions(thinking_budget=3))
    run_until_idle(core)
    r = h.result()
    assert r.token_ids[3] == THINK_END and prog.calls.count("control") == 1
    assert r.usage.num_reasoning_tokens == 3 and r.reasoning and r.text
    assert "program.commit" in [w for w, _ in trace.events]
    assert trace.violations == []


def test_forced_control_without_budget_ends_with_length():
    core, prog, trace, _ = make_core()
    h = core.submit(make_prompt(3, thinking=True), GREEDY, max_tokens=3, output=OutputOptions(thinking_budget=3))
    run_until_idle(core)
    r = h.result()
    assert r.finish_reason is FinishReason.LENGTH and len(r.token_ids) == 3 and "control" not in prog.calls


def test_multi_step_rows_accept_a_prefix_only_when_terminal():
    core, prog, trace, _ = make_core(decode_steps=4, eos_mod=3)
    hs = [core.submit(make_prompt(2 + i), GREEDY, max_tokens=9, output=OutputOptions()) for i in range(6)]
    run_until_idle(core)
    for h in hs:
        r = h.result()
        p = next(s for s in core.frontend.sessions if s.state.tokens == r.token_ids)
        assert p.finished
        if r.finish_reason is FinishReason.STOP:
            assert r.token_ids[-1] == 2 and 2 not in r.token_ids[:-1]
        else:
            assert len(r.token_ids) == 9
    assert trace.violations == []


def test_stop_token_and_logprobs_and_usage():
    core, prog, trace, _ = make_core()
    h = core.submit(make_prompt(3), SamplingParams(temperature=0.0, logprobs=0), max_tokens=6,
                    output=OutputOptions(ignore_eos=True))
    run_until_idle(core)
    evs = events(h)
    deltas = [e for e in evs if isinstance(e, GenerationDelta)]
    r = evs[-1]
    assert len(r.logprobs) == len(r.token_ids) == 6
    assert sum(len(d.logprobs) for d in deltas if d.logprobs) == 6
    assert r.usage.num_prompt_tokens == 3 and r.usage.num_output_tokens == 6
    assert "".join(d.delta.text for d in deltas) == r.text


def test_metrics_counts():
    core, prog, trace, clock = make_core(eos_mod=0)
    hs = [core.submit(make_prompt(2 + i), GREEDY, max_tokens=4) for i in range(3)]
    run_until_idle(core)
    m = core.metrics()
    assert m.num_requests_submitted == 3 and m.num_finished == {"length": 3}
    assert m.num_prompt_tokens == 2 + 3 + 4 and m.num_generation_tokens == 12
    assert m.running == 0 and m.waiting == 0 and m.pages_free == m.pages_total == prog.num_pages
    assert m.ttft_s.count == 3 and m.inter_token_s.count == 9 and m.e2e_s.count == 3
    assert m.decode_batch_size.count == m.num_decode_rounds > 0
    assert m.outstanding == 3 and m.outstanding_capacity_free == m.outstanding_capacity - 3
    del hs
    import gc
    gc.collect()
    assert core.metrics().outstanding == 0


def test_fake_program_is_strict():
    # guards the double: the engine tests are only as strong as the refusals of the fake
    from ninfer.contract.program import InvariantError, SequenceRequest
    p = FakeProgram(num_pages=8, page_size=4)
    plan = p.plan_materialize(SequenceRequest((11, 12), 6))
    seq = p.start_materialize(plan).sequence
    step = p.prefill(seq, 4)
    with pytest.raises(InvariantError):
        p.decode([seq])                                 # its first-token batch is still open
    p.commit(step.pending, [1])
    with pytest.raises(InvariantError):
        p.commit(step.pending, [1])                     # consumed twice
    b = p.decode([seq])
    with pytest.raises(InvariantError):
        p.release(seq)                                  # mapping change during an open unit
    p.abort_pending(b)
    p.release(seq)
    with pytest.raises(InvariantError):
        p.decode([seq])                                 # stale handle
    p.check_integrity()


def test_a_prompt_with_media_is_refused_at_submit():
    # NOTE: without a vision schedule only the placeholder tokens would reach the model (two images, the same
    #       tokens): refused, with nothing held.
    from ninfer.contract.frontend import MediaPlaceholder, PreparedPrompt
    core, prog, trace, _ = make_core(max_model_len=256)
    prompt = PreparedPrompt(token_ids=(1, 2, 3, 4), media=(MediaPlaceholder("image", 1, 2, "d1"),))
    with pytest.raises(EngineRequestError) as e:
        core.submit(prompt, GREEDY, max_tokens=3)
    assert e.value.kind is ErrorKind.INVALID_REQUEST and "takes no image input" in str(e.value)
    assert core.capacity.used == 0 and not core.records
