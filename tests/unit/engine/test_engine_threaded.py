"""The public Engine facade with its real worker thread, over the fakes: handles (sync, async,
drop), readiness, close, engine-wide failure, idle blocking."""
from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest

from support.fakes import FakeFrontend, FakeProgram, make_prompt
from ninfer import Engine, EngineConfig
from ninfer.contract.program import SamplingParams
from ninfer.contract.frontend import FinishReason
from ninfer.config import (AvailabilityState, EngineRequestError, ErrorKind, GenerationDelta, GenerationError,
                          GenerationResult, GenerationStart)

GREEDY = SamplingParams(temperature=0.0)


def make_engine(program=None, *, slow: float = 0.0, **cfg):
    program = program or FakeProgram(num_pages=128, page_size=4, max_model_len=512)
    if slow:
        program.on_call = lambda name: time.sleep(slow) if name in ("decode", "prefill") else None
    config = EngineConfig(**{"max_concurrency": 4, "queue_size": 8, "max_model_len": 512,
                             "prefill_chunk_tokens": 4, **cfg})
    eng = Engine.from_program(program, FakeFrontend(), config)
    assert eng.wait_ready(5).ready
    return eng, program


def wait_for(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.002)
    raise AssertionError("condition not reached in time")


def test_sync_iteration_result_and_generate():
    eng, prog = make_engine()
    with eng:
        h = eng.submit(make_prompt(5), GREEDY, max_tokens=7, request_id="x")
        evs = list(h)
        assert isinstance(evs[0], GenerationStart) and evs[0].num_prompt_tokens == 5
        assert all(isinstance(e, GenerationDelta) for e in evs[1:-1]) and isinstance(evs[-1], GenerationResult)
        assert evs[-1].request_id == "x" and len(evs[-1].token_ids) == 7
        assert h.result() is evs[-1]
        r = eng.generate(make_prompt(5), GREEDY, max_tokens=7)
        assert r.token_ids == evs[-1].token_ids
    assert eng.closed and eng.availability.state is AvailabilityState.SHUTTING_DOWN
    prog.check_integrity()


def test_async_iteration():
    eng, prog = make_engine(slow=0.001)

    async def main():
        hs = [eng.submit(make_prompt(3 + i), GREEDY, max_tokens=6) for i in range(5)]

        async def collect(h):
            return [e async for e in h]
        return await asyncio.gather(*(collect(h) for h in hs))
    try:
        results = asyncio.run(main())
        for evs in results:
            assert isinstance(evs[0], GenerationStart) and evs[-1].finish_reason is FinishReason.LENGTH
            assert sum(len(e.token_ids) for e in evs if isinstance(e, GenerationDelta)) == 6
    finally:
        eng.close()


def test_dropping_a_handle_cancels_and_releases_capacity():
    eng, prog = make_engine(slow=0.002)
    try:
        h = eng.submit(make_prompt(3), GREEDY, max_tokens=400)
        wait_for(lambda: eng.metrics().num_generation_tokens > 2)
        del h
        gc.collect()
        wait_for(lambda: eng.metrics().outstanding == 0 and eng.metrics().running == 0)
        m = eng.metrics()
        assert m.num_finished == {"cancelled": 1} and m.num_generation_tokens < 400
        wait_for(lambda: prog.num_sequences == 0)
    finally:
        eng.close()
    prog.check_integrity()


def test_cancel_from_another_thread_ends_with_partial_output():
    eng, prog = make_engine(slow=0.002)
    try:
        h = eng.submit(make_prompt(3), GREEDY, max_tokens=400)
        wait_for(lambda: eng.metrics().num_generation_tokens > 3)
        threading.Thread(target=h.cancel).start()
        r = h.result(5)
        assert r.finish_reason is FinishReason.CANCELLED and 3 <= len(r.token_ids) < 400
        assert r.usage.num_output_tokens == len(r.token_ids)
    finally:
        eng.close()


def test_close_drains_then_cancels_the_rest():
    eng, prog = make_engine(slow=0.002, max_concurrency=2, queue_size=4)
    hs = [eng.submit(make_prompt(3), GREEDY, max_tokens=500) for _ in range(4)]
    wait_for(lambda: eng.metrics().num_generation_tokens > 2)
    t0 = time.monotonic()
    eng.close(timeout=0.05)
    assert eng.closed and time.monotonic() - t0 < 5
    finals = [h.result(1) for h in hs]
    assert all(f.finish_reason is FinishReason.CANCELLED for f in finals)
    assert prog.num_sequences == 0
    with pytest.raises(EngineRequestError) as e:
        eng.submit(make_prompt(3), GREEDY, max_tokens=3)
    assert e.value.kind is ErrorKind.NOT_READY


def test_close_lets_running_requests_finish():
    eng, prog = make_engine(slow=0.001)
    hs = [eng.submit(make_prompt(3), GREEDY, max_tokens=20) for _ in range(6)]
    eng.close(timeout=30)
    assert [h.result(1).finish_reason for h in hs] == [FinishReason.LENGTH] * 6


def test_fault_in_program_fails_engine_and_worker_exits():
    prog = FakeProgram(num_pages=128, page_size=4, max_model_len=512)
    eng, prog = make_engine(prog, slow=0.001, max_concurrency=2, queue_size=6)
    hs = [eng.submit(make_prompt(3), GREEDY, max_tokens=200) for _ in range(6)]
    wait_for(lambda: eng.metrics().num_generation_tokens > 4)
    prog.faults["commit.torn"] = prog.calls.count("commit") + 2
    for h in hs:
        with pytest.raises(EngineRequestError) as e:
            h.result(5)
        assert e.value.kind is ErrorKind.ENGINE_FAILED
    wait_for(lambda: eng.closed)
    a = eng.availability
    assert a.state is AvailabilityState.FAILED and "injected fault mid-commit" in a.reason
    assert prog.num_open_batches == 0 and prog.num_sequences == 0
    assert eng.metrics().outstanding == 0
    with pytest.raises(EngineRequestError) as e:
        eng.submit(make_prompt(3), GREEDY, max_tokens=3)
    assert e.value.kind is ErrorKind.NOT_READY and "mid-commit" in e.value.message
    eng.close()


def test_startup_states():
    gate = threading.Event()
    prog = FakeProgram()

    def loader():
        gate.wait(5)
        return prog
    eng = Engine.from_program(loader, FakeFrontend(), EngineConfig(max_model_len=256))
    assert eng.availability.state is AvailabilityState.STARTING
    with pytest.raises(EngineRequestError) as e:
        eng.submit(make_prompt(2), GREEDY, max_tokens=2)
    assert e.value.kind is ErrorKind.NOT_READY
    gate.set()
    assert eng.wait_ready(5).ready
    assert eng.generate(make_prompt(2), GREEDY, max_tokens=2).finish_reason is FinishReason.LENGTH
    eng.close()

    def broken():
        raise RuntimeError("weights are missing")
    bad = Engine.from_program(broken, FakeFrontend(), EngineConfig())
    a = bad.wait_ready(5)
    assert a.state is AvailabilityState.FAILED and "weights are missing" in a.reason
    bad.close()


def test_idle_worker_blocks_instead_of_spinning():
    eng, prog = make_engine()
    try:
        eng.generate(make_prompt(2), GREEDY, max_tokens=2)
        core = eng._core
        calls = {"n": 0}
        orig = core.step

        def counting():
            calls["n"] += 1
            return orig()
        core.step = counting
        time.sleep(0.3)
        assert calls["n"] <= 2
        eng.generate(make_prompt(2), GREEDY, max_tokens=2)      # still wakes for new work
    finally:
        eng.close()


def test_queue_deadline_wakes_the_idle_worker():
    prog = FakeProgram(num_pages=128, page_size=4, max_model_len=512)
    eng, prog = make_engine(prog, slow=0.002, max_concurrency=1)
    try:
        a = eng.submit(make_prompt(2), GREEDY, max_tokens=300)
        b = eng.submit(make_prompt(2), GREEDY, max_tokens=3, deadline_s=0.05)
        ev = b.next_event(5)
        assert isinstance(ev, GenerationError) and ev.kind is ErrorKind.QUEUE_TIMEOUT
        a.cancel()
        assert a.result(5).finish_reason is FinishReason.CANCELLED
    finally:
        eng.close()


def test_many_threads_submit_concurrently():
    eng, prog = make_engine(max_concurrency=4, queue_size=60)
    out, errs = [], []

    def worker(i):
        try:
            out.append(eng.generate(make_prompt(1 + i % 7), GREEDY, max_tokens=3 + i % 5))
        except EngineRequestError as e:   # pragma: no cover - would be a failure below
            errs.append(e)
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(40)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(10)
    eng.close()
    assert not errs and len(out) == 40
    for r in out:
        assert r.token_ids == prog.reference(make_prompt(r.usage.num_prompt_tokens).token_ids,
                                             r.usage.num_output_tokens)
    prog.check_integrity()


def test_a_program_that_fails_while_attaching_fails_startup():
    class NoCapacity(FakeProgram):
        def capacity(self):
            raise RuntimeError("device lost")
    eng = Engine.from_program(NoCapacity(), FakeFrontend(), EngineConfig())
    a = eng.wait_ready(5)
    assert a.state is AvailabilityState.FAILED and "device lost" in a.reason
    eng.close()
    assert eng.closed
