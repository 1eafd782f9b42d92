"""Property-based (hypothesis, stateful) test of the Engine control plane.

Random submissions, cancellations (also from inside a running unit: mid-prefill, mid-batch),
handle drops, deadlines and queue overflow, driven one worker boundary at a time. After every
rule: no output was published before Program and the OutputSession committed it, every request
has at most one final event, no PendingBatch is left open, no resource transition is in flight,
Program's integrity check holds. At teardown everything is cancelled and drained: every accepted
request ended exactly once with a valid finish reason or error, lanes and outstanding capacity
are back to full, and Program holds no page or slot.

Runs against the scripted FakeProgram (breadth), the same with speculative rounds, and against the tiny
dense model on CPU.
"""
from __future__ import annotations

import gc

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from support.program_util import tiny_parts
from support.fakes import FakeFrontend, FakeProgram, ProgramProxy, Trace, make_core, make_prompt, young_heap_gc
from ninfer.contract.program import SamplingParams
from ninfer.engine.resource_manager import LaneState
from ninfer.contract.frontend import FinishReason, OutputOptions
from ninfer.config import EngineRequestError, ErrorKind, GenerationError, GenerationResult

GREEDY = SamplingParams(temperature=0.0)
FINALS = (GenerationResult, GenerationError)


class EngineMachine(RuleBasedStateMachine):
    make_program = None          # () -> (program, frontend, vocab_offset)
    reference = None             # optional (program, prompt_ids, n) -> tokens, for greedy checks

    def __init__(self):
        super().__init__()
        self.trace = Trace()
        program, frontend, self.token_base = type(self).make_program()
        self.prog = ProgramProxy(program, self.trace)
        self.core, _, _, self.clock = make_core(self.prog, frontend=frontend, trace=self.trace, max_concurrency=3,
                                                queue_size=3, request_timeout_s=4.0, prefill_chunk_tokens=3)
        self.live: dict[str, object] = {}
        self.events: dict[str, list] = {}
        self.accepted: dict[str, tuple] = {}
        self.dropped: set[str] = set()
        self.ids = 0

    # ---- rules -------------------------------------------------------------------------------
    @rule(plen=st.integers(1, 10), max_tokens=st.integers(1, 10), deadline=st.sampled_from([None, 0.5, 2.0]),
          thinking=st.booleans())
    def submit(self, plen, max_tokens, deadline, thinking):
        self.ids += 1
        rid = f"r{self.ids}"
        prompt = make_prompt(plen, start=self.token_base + self.ids, thinking=thinking)
        opts = OutputOptions(thinking_budget=2 if thinking else None, ignore_eos=not thinking)
        full = self.core.capacity.used >= self.core.capacity.limit
        try:
            h = self.core.submit(prompt, GREEDY, max_tokens=max_tokens, output=opts, request_id=rid,
                                 deadline_s=deadline)
        except EngineRequestError as e:
            assert e.kind is ErrorKind.OVERLOADED and full
            return
        assert not full
        self.live[rid] = h
        self.events[rid] = []
        self.accepted[rid] = (prompt.token_ids, max_tokens, thinking)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def cancel(self, data):
        rid = data.draw(st.sampled_from(sorted(self.live)))
        self.live[rid].cancel()

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def drop(self, data):
        rid = data.draw(st.sampled_from(sorted(self.live)))
        h = self.live.pop(rid)
        self.dropped.add(rid)
        del h
        gc.collect()

    @precondition(lambda self: self.live)
    @rule(data=st.data(), where=st.sampled_from(["prefill", "decode", "control", "start_materialize"]))
    def cancel_inside_next_unit(self, data, where):
        h = self.live[data.draw(st.sampled_from(sorted(self.live)))]

        def hook(name):
            if name == where:
                h.cancel()
                self.prog.on_call = None
        self.prog.on_call = hook

    @rule(n=st.integers(1, 6))
    def step(self, n):
        for _ in range(n):
            self.core.step()
        self._collect()

    @rule(dt=st.sampled_from([0.3, 1.0, 3.0]))
    def advance_clock(self, dt):
        self.clock.advance(dt)

    # ---- checks -------------------------------------------------------------------------------
    def _collect(self):
        for rid, h in list(self.live.items()):
            evs = h.poll()
            self.events[rid].extend(evs)
            if evs and isinstance(evs[-1], FINALS):
                del self.live[rid]            # the consumer's wait ended

    @invariant()
    def consistent(self):
        assert self.trace.violations == []
        assert all(n == 1 for n in self.trace.finals.values())
        assert self.prog.num_open_batches == 0
        assert self.core.rm.transition_in_flight is None
        assert self.core.availability.ready, self.core.availability.reason
        assert self.core.rm.num_busy_lanes <= 3
        assert 0 <= self.core.capacity.used <= self.core.capacity.limit
        self.prog.check_integrity()

    def teardown(self):
        self.prog.on_call = None
        for h in self.live.values():
            h.cancel()
        for _ in range(10000):
            if not self.core.step():
                break
        self._collect()
        assert not self.live, "a consumer never received its final event"
        assert set(self.trace.finals) == set(self.accepted)
        for rid, (prompt, max_tokens, thinking) in self.accepted.items():
            if rid in self.dropped:                       # nobody reads it; its final was still published once
                continue
            evs = self.events[rid]
            fin = evs[-1]
            assert isinstance(fin, FINALS) and sum(isinstance(e, FINALS) for e in evs) == 1
            if isinstance(fin, GenerationError):
                assert fin.kind in (ErrorKind.QUEUE_TIMEOUT,)
                continue
            assert fin.finish_reason in (FinishReason.LENGTH, FinishReason.STOP, FinishReason.CANCELLED)
            assert len(fin.token_ids) <= max_tokens
            if fin.finish_reason is FinishReason.LENGTH and not thinking:
                # NOTE: with a thinking budget a request may end early: its forced suffix must fit whole
                assert len(fin.token_ids) == max_tokens
            if type(self).reference is not None and not thinking and fin.token_ids:
                ref = type(self).reference(self.prog, prompt, len(fin.token_ids))
                assert fin.token_ids == ref
        assert self.core.capacity.used == 0
        assert all(lane.state is LaneState.FREE for lane in self.core.rm.lanes) and not self.core.records
        cap = self.prog.capacity()
        assert cap.pages_free == cap.pages_total and cap.slots_free == cap.slots_total
        self.prog.check_integrity()


# ---- against the scripted Program (breadth) ---------------------------------------------------------
class FakeEngineMachine(EngineMachine):
    @staticmethod
    def make_program():
        return FakeProgram(num_pages=24, page_size=4, num_slots=3, max_model_len=64, eos_mod=0), FakeFrontend(), 10

    @staticmethod
    def reference(proxy, prompt, n):
        return proxy._p.reference(prompt, n, stop_ids=())


def test_stateful_engine_against_fake_program():
    with young_heap_gc():                   # `drop` collects garbage after each dropped handle
        run_state_machine_as_test(FakeEngineMachine, settings=settings(
            max_examples=60, stateful_step_count=60, deadline=None, suppress_health_check=list(HealthCheck)))


class SpeculativeFakeEngineMachine(FakeEngineMachine):
    """Every decode unit is a speculative round (K = 3, 0..3 drafts accepted by a script): stops, budgets
    and cancellations land inside rounds; the lookahead is reserved (the fake refuses a round without it)."""
    @staticmethod
    def make_program():
        prog = FakeProgram(num_pages=24, page_size=4, num_slots=3, max_model_len=64, eos_mod=0, speculative=3,
                           spec_accept=lambda sid, rnd: (3 * sid + rnd) % 4)
        return prog, FakeFrontend(), 10


def test_stateful_engine_against_speculative_fake_program():
    with young_heap_gc():
        run_state_machine_as_test(SpeculativeFakeEngineMachine, settings=settings(
            max_examples=30, stateful_step_count=60, deadline=None, suppress_health_check=list(HealthCheck)))


# ---- against the tiny dense model on CPU ------------------------------------------------------------
@pytest.fixture(scope="module")
def real_parts(tiny_artifact_path):
    frontend, program = tiny_parts(tiny_artifact_path, "dense", page_size=4, num_pages=24, num_slots=3,
                                   max_model_len=64, max_batch=3)
    return lambda: (program(), frontend, 1000)


def test_stateful_engine_against_tiny_model(real_parts):
    class RealEngineMachine(EngineMachine):
        make_program = staticmethod(real_parts)
    with young_heap_gc():
        run_state_machine_as_test(RealEngineMachine, settings=settings(
            max_examples=6, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)))
