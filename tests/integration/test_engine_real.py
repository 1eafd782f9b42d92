"""The Engine over the real pieces: `.ninfer` artifact -> registry -> Frontend + Program (tiny
identities, fp32 on CPU). Greedy output of a request is the same alone, with up to 8 others
joining and leaving at random moments, and as the Program-level reference."""
from __future__ import annotations

import random

import pytest

from support.program_util import greedy_reference, tiny_parts
from support.fakes import ProgramProxy, Trace, make_core, run_until_idle
from ninfer import Engine, EngineConfig
from ninfer.contract.program import SamplingParams
from ninfer.engine.engine_core import DECODE_STEPS
from ninfer.engine.request_record import RequestState
from ninfer.contract.frontend import FinishReason, OutputOptions, PreparedPrompt
from ninfer.config import AvailabilityState, GenerationDelta, GenerationStart

GREEDY = SamplingParams(temperature=0.0)
NO_EOS = OutputOptions(ignore_eos=True)


@pytest.fixture(scope="module")
def parts(tiny_artifact_path):
    return tiny_parts(tiny_artifact_path, "dense", page_size=16, num_pages=96, num_slots=8,
                      max_model_len=160, max_batch=8)



def random_prompt(rng: random.Random, n: int) -> PreparedPrompt:
    return PreparedPrompt(tuple(rng.randrange(0, 248000) for _ in range(n)))


def test_engine_from_artifact(tiny_artifact_path):
    path = tiny_artifact_path("dense")
    # NOTE: cache off: the pool figures below are those of an engine that keeps no inactive checkpoint
    cfg = EngineConfig(max_concurrency=3, queue_size=4, max_model_len=128, page_size=16, prefill_chunk_tokens=8,
                       prefix_cache=False)
    with Engine(path, cfg) as eng:
        assert eng.availability.state in (AvailabilityState.STARTING, AvailabilityState.READY)
        assert eng.wait_ready(60).ready, eng.availability.reason
        assert eng.identity == "qwen3_6-tiny-dense" and eng.max_model_len == 128
        prompt = eng.frontend.prepare_chat([{"role": "user", "content": "Hello there"}])
        h = eng.submit(prompt, GREEDY, max_tokens=6, output=NO_EOS)
        evs = list(h)
        assert isinstance(evs[0], GenerationStart) and evs[0].num_prompt_tokens == prompt.num_prompt_tokens
        r = evs[-1]
        assert r.finish_reason is FinishReason.LENGTH and len(r.token_ids) == 6
        assert "".join(e.delta.text for e in evs if isinstance(e, GenerationDelta)) == r.text
        m = eng.metrics()
        assert m.pages_total == 3 * 128 // 16 and m.slots_total == 3 and m.pages_free == m.pages_total
        assert m.num_generation_tokens == 6
    assert eng.closed


def test_greedy_output_alone_joined_and_program_reference(parts):
    frontend, make_program = parts
    rng = random.Random(7)
    target = random_prompt(rng, 9)
    n = 10
    reference = greedy_reference(make_program(), target.token_ids, n)

    # alone, through the Engine (staged prefill of 5-token stages)
    core, _, _, _ = make_core(make_program(), frontend=frontend, prefill_chunk_tokens=4, max_concurrency=8)
    alone = core.submit(target, GREEDY, max_tokens=n, output=NO_EOS)
    run_until_idle(core)
    assert alone.result().token_ids == reference

    # with up to 8 others joining and leaving at random moments (some cancelled, some short)
    trace = Trace()
    prog = ProgramProxy(make_program(), trace)
    core, _, _, _ = make_core(prog, frontend=frontend, trace=trace, prefill_chunk_tokens=4, max_concurrency=8,
                              queue_size=16)
    ready_at_decode = []
    trace.extra.append(lambda what, info: ready_at_decode.append(
        (len(info["rows"]), sum(r.state is RequestState.DECODE_READY for r in core.records.values())))
        if what == "unit" and info["kind"].value == "decode" else None)
    others, mine, step = [], None, 0
    while True:
        step += 1
        if len(others) < 9 and rng.random() < 0.5:
            others.append(core.submit(random_prompt(rng, rng.randrange(1, 7)), GREEDY,
                                      max_tokens=rng.randrange(1, 14), output=NO_EOS))
        if mine is None and step == 6:
            mine = core.submit(target, GREEDY, max_tokens=n, output=NO_EOS)
        if others and rng.random() < 0.05:
            rng.choice(others).cancel()
        if not core.step() and mine is not None and len(others) >= 9:
            break
    assert mine.result().token_ids == reference
    assert trace.violations == []
    assert all(rows == ready for rows, ready in ready_at_decode)       # exact B = the decode-ready count
    assert prog.decode_sizes == [rows for rows, _ in ready_at_decode]
    assert max(prog.decode_sizes) >= 4
    for h in others:
        assert h.result().finish_reason in (FinishReason.LENGTH, FinishReason.CANCELLED)
    prog.check_integrity()
    cap = prog.capacity()
    assert cap.pages_free == cap.pages_total and cap.slots_free == cap.slots_total


def test_greedy_parity_through_the_threaded_engine(parts, tiny_artifact_path):
    frontend, make_program = parts
    rng = random.Random(11)
    prompts = [random_prompt(rng, rng.randrange(2, 12)) for _ in range(5)]
    program = make_program()
    refs = [greedy_reference(program, p.token_ids, 6) for p in prompts]
    cfg = EngineConfig(max_concurrency=8, queue_size=8, max_model_len=160, page_size=16, prefill_chunk_tokens=5)
    with Engine(tiny_artifact_path("dense"), cfg) as eng:
        assert eng.wait_ready(60).ready
        hs = [eng.submit(p, GREEDY, max_tokens=6, output=NO_EOS) for p in prompts]
        assert [h.result(60).token_ids for h in hs] == refs


def test_warm_up_runs_its_prompts_and_leaves_nothing_behind(tiny_artifact_path):
    """`Engine.warm_up`: one greedy request per length (then two drawn ones at the shortest) through the public path with the context cache off; the
    engine is then idle with every page and slot free, no checkpoint published (the cache is on) and its
    request counters zeroed.
    On the CPU reference ops the Program names no lengths, so the default warmup runs nothing; bad
    lengths are refused before any request."""
    from ninfer.targets.qwen3_6.program.warmup import warmup_lengths
    cfg = EngineConfig(max_concurrency=2, queue_size=2, max_model_len=128, page_size=16, prefill_chunk_tokens=64)
    with Engine(tiny_artifact_path("dense"), cfg) as eng:
        assert eng.wait_ready(60).ready, eng.availability.reason
        assert eng.warm_up() == []
        done = eng.warm_up([1, 17, 64, 126])
        assert [n for n, _ in done] == [1, 17, 64, 126, 1, 1] and all(s >= 0 for _, s in done)
        m = eng.metrics()
        assert (m.pages_free, m.slots_free) == (m.pages_total, m.slots_total)
        assert m.running == 0 and m.waiting == 0 and m.outstanding_capacity_free == m.outstanding_capacity
        assert m.num_cache_captures == 0 and m.num_checkpoints_device == 0 and m.num_cache_hits == 0
        # the warmup's requests are not counted as traffic
        assert m.num_requests_submitted == 0 and m.num_finished == {} and m.num_prompt_tokens == 0
        assert m.ttft_s.count == 0 and m.num_prefill_units == 0 and m.num_generation_tokens == 0
        r = eng.generate(eng.frontend.prepare_tokens([5, 6, 7]), GREEDY, max_tokens=2, output=NO_EOS)
        m = eng.metrics()
        assert m.num_requests_submitted == 1 and m.num_generation_tokens == len(r.token_ids) == 2
        for bad in ([0], [127], [True], [3.0]):
            with pytest.raises(ValueError, match="warmup prompt lengths"):
                eng.warm_up(bad)
        # the reference ops plan nothing; the attention-plan step still ran (on the worker)
        assert eng.warmup_plans is not None and eng.warmup_plans[:2] == (0, 0)
    # the fast ops' lengths, within the stage and max_model_len - 2: the small row counts, every graphed
    # bucket, one less than each padded attention length, the stage and one less
    assert warmup_lengths(8192, 8192, (64, 128, 2048), 2048) == [
        2, 5, 9, 12, 64, 128, 255, 511, 767, 1023, 1279, 1535, 1791, 2047, 2048, 2559, 3071, 3583, 4095, 5119,
        6143, 7167, 8189, 8190]
    assert warmup_lengths(512, 8192, (64, 128, 1024), 2048) == [2, 5, 9, 12, 64, 128, 255, 511, 512]
    assert warmup_lengths(8192, 300, (64, 128, 1024), 100) == [2, 5, 9, 12, 64, 255, 297, 298]
    assert warmup_lengths(8192, 4, (64,), 2048) == [1, 2]
    assert warmup_lengths(8192, 2, (64,), 2048) == []


def test_warm_up_plans_attention_on_the_worker_thread(tiny_artifact_path):
    """`Engine.warm_up` runs the Program's `warmup_attention_plans` on the engine's worker thread (PyTorch
    keeps cuDNN plans per thread) with the stage size and max_model_len, after its requests; plans=False
    skips it. `call_on_worker`: fn's exception comes back on its Future and the engine goes on serving; a
    closed engine refuses new calls."""
    import threading

    from ninfer.config import EngineRequestError, ErrorKind
    cfg = EngineConfig(max_concurrency=2, queue_size=2, max_model_len=128, page_size=16, prefill_chunk_tokens=32)
    with Engine(tiny_artifact_path("dense"), cfg) as eng:
        assert eng.wait_ready(60).ready, eng.availability.reason
        seen = []

        def plans(stage, max_model_len):
            seen.append((threading.current_thread().name, stage, max_model_len))
            return 3, 5

        eng._core.program.warmup_attention_plans = plans
        assert [n for n, _ in eng.warm_up([4])] == [4, 4, 4]
        assert seen == [("ninfer-engine-worker", 32, 128)]
        assert eng.warmup_plans[:2] == (3, 5) and eng.warmup_plans[2] >= 0
        eng.warm_up([4], plans=False)
        assert len(seen) == 1

        def broken():
            raise RuntimeError("cuDNN plan failed")

        with pytest.raises(RuntimeError, match="cuDNN plan failed"):
            eng._core.call_on_worker(broken).result(30)
        assert eng._core.call_on_worker(lambda: threading.current_thread().name).result(30) == "ninfer-engine-worker"
        r = eng.generate(eng.frontend.prepare_tokens([5, 6, 7]), GREEDY, max_tokens=2, output=NO_EOS)
        assert len(r.token_ids) == 2 and eng.availability.ready
    with pytest.raises(EngineRequestError) as e:
        eng._core.call_on_worker(lambda: None)
    assert e.value.kind is ErrorKind.NOT_READY


def test_a_control_unit_fits_the_engine_provisional_area(tiny_artifact_path):
    # NOTE: the Engine sizes the Program's provisional area to its largest unit (`ninfer.engine.facade._num_scratch`;
    #       on the CPU no graphs add theirs), not max_batch x max_steps. A thinking budget makes the frontend force
    #       "\n</think>\n\n" (a control unit of 3 tokens, one scratch entry each) on the real Program, here at
    #       one lane between decode rounds and with a second lane busy.
    cfg = EngineConfig(max_concurrency=2, queue_size=4, max_model_len=128, page_size=16, prefill_chunk_tokens=8)
    forced = (198, 248069, 271)
    with Engine(tiny_artifact_path("dense"), cfg) as eng:
        assert eng.wait_ready(60).ready
        prog = eng._core.program
        assert prog._state.num_scratch == max(2 * DECODE_STEPS, 8) < cfg.max_concurrency * prog.config.max_steps
        think = eng.frontend.prepare_chat([{"role": "user", "content": "Hi"}],
                                          chat_template_kwargs={"enable_thinking": True})
        other = eng.submit(random_prompt(random.Random(3), 5), GREEDY, max_tokens=20, output=NO_EOS)
        h = eng.submit(think, GREEDY, max_tokens=12, output=OutputOptions(thinking_budget=2, ignore_eos=True))
        ids = h.result(60).token_ids
        assert other.result(60).finish_reason is FinishReason.LENGTH
        assert any(tuple(ids[i:i + 3]) == forced for i in range(len(ids) - 2)), ids
        assert len(ids) == 12
        assert prog._pending.num_free_scratch == prog._state.num_scratch     # (the context cache keeps pages)
