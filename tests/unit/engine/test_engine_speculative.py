"""The Engine side of speculative decoding, over a FakeProgram that runs speculative rounds (each row
produces 1..K+1 tokens with drafted = K, acceptance scripted per round): the lookahead reserved and
counted near max_model_len, stops, budgets and cancellation inside a round (no leak), the vLLM-named
spec_decode counters and the per-request acceptance length."""
from __future__ import annotations

import math

import pytest

from support.fakes import FakeFrontend, FakeProgram, make_core, make_prompt, run_until_idle
from ninfer.config import EngineConfig, EngineRequestError, ErrorKind, GenerationError, GenerationResult, Usage
from ninfer.contract.frontend import FinishReason, OutputOptions
from ninfer.contract.program import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
K = 3


def final(handle):
    evs = handle.poll()
    assert evs and isinstance(evs[-1], (GenerationResult, GenerationError)), evs
    return evs[-1]


def spec_core(accept=None, **kw):
    prog = FakeProgram(speculative=K, spec_accept=accept, **{"num_pages": 128, **kw})
    core, prog, trace, clock = make_core(prog)
    return core, prog, trace


def assert_no_leak(core, prog):
    assert prog.num_open_batches == 0 and prog.num_sequences == 0
    prog.check_integrity()
    m = core.metrics()
    assert m.pages_free == m.pages_total and m.slots_free == m.slots_total
    assert core.capacity.used == 0 and not core.records


def expected_counters(rounds):
    """(drafts, draft tokens, accepted, per position) of rounds = [(drafted, produced), ...]."""
    per_pos = [sum(1 for _, p in rounds if p - 1 > i) for i in range(K)]
    return len(rounds), sum(d for d, _ in rounds), sum(p - 1 for _, p in rounds), tuple(per_pos)


# ---- lookahead -------------------------------------------------------------------------------------
def test_every_request_reserves_the_lookahead_and_output_equals_plain_decoding():
    seen = []
    core, prog, trace = spec_core()
    prog.infeasible = lambda req: seen.append(req) or False
    prompts = [make_prompt(3 + i, start=20 + i) for i in range(5)]
    hs = [core.submit(p, GREEDY, max_tokens=11 + i, output=OutputOptions(ignore_eos=True))
          for i, p in enumerate(prompts)]
    run_until_idle(core)
    assert seen and all(req.lookahead == K for req in seen)
    for i, (h, p) in enumerate(zip(hs, prompts)):
        r = final(h)
        assert r.finish_reason is FinishReason.LENGTH
        assert r.token_ids == prog.reference(p.token_ids, 11 + i, stop_ids=())
    assert max(p for _, _, p in prog.spec_rounds) > 1          # rounds did produce several tokens
    assert trace.violations == []
    assert core.lookahead == K
    assert_no_leak(core, prog)


def test_a_speculative_round_without_the_lookahead_reserved_is_refused_by_the_fake():
    """Guards the double: the fake refuses a round that writes past the reservation, so the test above
    fails for an Engine that does not reserve Program.lookahead."""
    core, prog, trace = spec_core(accept=lambda sid, rnd: K)
    core.rm.planner.lookahead = 0
    h = core.submit(make_prompt(4), GREEDY, max_tokens=6, output=OutputOptions(ignore_eos=True))
    run_until_idle(core)
    r = final(h)
    assert isinstance(r, GenerationError) and r.kind is ErrorKind.ENGINE_FAILED
    assert "beyond its reservation" in r.message


def test_prompt_plus_max_tokens_plus_lookahead_must_fit_max_model_len():
    core, prog, trace = spec_core(max_model_len=64)
    ok = core.submit(make_prompt(10), GREEDY, max_tokens=64 - 10 - K, output=OutputOptions(ignore_eos=True))
    with pytest.raises(EngineRequestError) as e:
        core.submit(make_prompt(10), GREEDY, max_tokens=64 - 10 - K + 1)
    assert e.value.kind is ErrorKind.INVALID_REQUEST
    msg = e.value.message
    assert "prompt (10 tokens) + max_tokens (52) + the speculative lookahead (3) exceeds max_model_len 64" in msg
    assert "at most 51 output tokens fit" in msg
    run_until_idle(core)
    assert len(final(ok).token_ids) == 51
    assert_no_leak(core, prog)


def test_without_speculation_the_limit_and_its_message_are_unchanged():
    core, prog, trace, _ = make_core(max_model_len=64)
    assert core.lookahead == 0
    core.submit(make_prompt(10), GREEDY, max_tokens=54)
    with pytest.raises(EngineRequestError) as e:
        core.submit(make_prompt(10), GREEDY, max_tokens=55)
    assert e.value.message == "prompt (10 tokens) + max_tokens (55) exceeds max_model_len 64"


# ---- stops, budgets and cancellation inside a round --------------------------------------------------
def test_a_stop_token_inside_a_round_ends_the_request_there():
    prompt = make_prompt(5)
    core, prog, trace = spec_core(accept=lambda sid, rnd: K)       # every round produces K+1 tokens
    plain = prog.reference(prompt.token_ids, 30, stop_ids=())
    # the stop token is the second token of the first speculative round (the prefill produced the first)
    stop = plain[2]
    cut = plain.index(stop) + 1
    h = core.submit(prompt, GREEDY, max_tokens=30, output=OutputOptions(stop_token_ids=(stop,), ignore_eos=True))
    run_until_idle(core)
    r = final(h)
    assert r.finish_reason is FinishReason.STOP and r.token_ids == plain[:cut]
    assert r.usage.num_output_tokens == cut
    assert prog.spec_rounds[0][2] > cut - 1                         # the round produced past the stop
    assert trace.violations == []
    assert_no_leak(core, prog)


@pytest.mark.parametrize("max_tokens", [2, 3, 4, 6, 7])
def test_max_tokens_landing_inside_a_round(max_tokens):
    prompt = make_prompt(6)
    core, prog, trace = spec_core(accept=lambda sid, rnd: K)
    h = core.submit(prompt, GREEDY, max_tokens=max_tokens, output=OutputOptions(ignore_eos=True))
    run_until_idle(core)
    r = final(h)
    assert r.finish_reason is FinishReason.LENGTH
    assert r.token_ids == prog.reference(prompt.token_ids, max_tokens, stop_ids=())
    rounds = math.ceil((max_tokens - 1) / (K + 1))
    assert r.usage.num_spec_rounds == rounds and r.usage.num_spec_accepted_tokens == rounds * K
    assert r.usage.mean_acceptance_length == K + 1
    assert trace.violations == []
    assert_no_leak(core, prog)


def test_cancellation_mid_round_commits_nothing_counts_nothing_and_leaks_nothing():
    core, prog, trace = spec_core(accept=lambda sid, rnd: 2)
    hs = [core.submit(make_prompt(3 + i), GREEDY, max_tokens=40, request_id=f"r{i}",
                      output=OutputOptions(ignore_eos=True)) for i in range(3)]
    while not prog.decode_sizes or prog.decode_sizes[-1] < 3:
        core.step()
    before = core.metrics()
    victim = hs[1]
    published = len(trace.published.get("r1", []))
    prog.on_call = lambda name: victim.cancel() if name == "decode" else None
    core.step()                                       # a round of 3 rows, r1 cancelled while it runs
    prog.on_call = None
    assert trace.kinds("program_commit")[-1]["accepted"] == (3, 0, 3)
    after = core.metrics()
    assert after.num_spec_drafts - before.num_spec_drafts == 2
    assert after.num_spec_accepted_tokens - before.num_spec_accepted_tokens == 4
    run_until_idle(core)
    r = final(victim)
    assert r.finish_reason is FinishReason.CANCELLED and len(r.token_ids) == published
    assert r.usage.num_spec_rounds == (published - 1) // 3
    for h in (hs[0], hs[2]):
        other = final(h)
        assert other.finish_reason is FinishReason.LENGTH and len(other.token_ids) == 40
    assert trace.violations == []
    assert_no_leak(core, prog)


# ---- metrics and usage ---------------------------------------------------------------------------
def test_spec_decode_counters_and_per_request_acceptance_length():
    script = [3, 0, 1, 2, 3, 3, 0]
    core, prog, trace = spec_core(accept=lambda sid, rnd: script[(sid + rnd) % len(script)], eos_mod=9)
    hs = [core.submit(make_prompt(2 + i, start=40 + 3 * i), GREEDY, max_tokens=9 + 2 * i) for i in range(4)]
    run_until_idle(core)
    m = core.metrics()
    assert m.num_speculative_tokens == K and len(m.num_spec_accepted_per_pos) == K
    rounds = [(d, p) for _, d, p in prog.spec_rounds]              # no row was cancelled: all count
    assert (m.num_spec_drafts, m.num_spec_draft_tokens, m.num_spec_accepted_tokens,
            m.num_spec_accepted_per_pos) == expected_counters(rounds)
    assert m.num_spec_drafts == sum(prog.decode_sizes) and 0 < m.num_spec_accepted_tokens < K * m.num_spec_drafts
    for h in hs:
        r = final(h)
        seq = trace.seq_of[h.request_id]
        mine = [p for s, _, p in prog.spec_rounds if s == seq]
        u = r.usage
        assert u.num_spec_rounds == len(mine) and u.num_spec_accepted_tokens == sum(p - 1 for p in mine)
        if mine:
            assert u.mean_acceptance_length == pytest.approx(sum(mine) / len(mine))
        assert len(r.token_ids) <= 1 + sum(mine)
    assert trace.violations == []


def test_without_speculation_no_counters_and_no_usage_fields():
    core, prog, trace, _ = make_core()
    h = core.submit(make_prompt(3), GREEDY, max_tokens=5)
    run_until_idle(core)
    u = final(h).usage
    assert u.num_spec_rounds is None and u.num_spec_accepted_tokens is None and u.mean_acceptance_length is None
    m = core.metrics()
    assert m.num_speculative_tokens == 0 and m.num_spec_drafts == 0 and m.num_spec_accepted_per_pos == ()


def test_a_request_that_ends_at_its_first_token_has_no_round():
    core, prog, trace = spec_core()
    h = core.submit(make_prompt(3), GREEDY, max_tokens=1)
    run_until_idle(core)
    u = final(h).usage
    assert u.num_spec_rounds == 0 and u.num_spec_accepted_tokens == 0 and u.mean_acceptance_length is None


def test_reset_keeps_the_per_position_counters_present():
    core, prog, trace = spec_core()
    h = core.submit(make_prompt(3), GREEDY, max_tokens=8)
    run_until_idle(core)
    assert core.metrics().num_spec_drafts > 0
    core.reset_request_metrics()
    m = core.metrics()
    assert m.num_spec_drafts == 0 and m.num_spec_accepted_per_pos == (0,) * K and m.num_speculative_tokens == K


def test_usage_mean_acceptance_length():
    assert Usage(1, 1).mean_acceptance_length is None
    assert Usage(1, 9, num_spec_rounds=4, num_spec_accepted_tokens=6).mean_acceptance_length == 2.5
    assert Usage(1, 1, num_spec_rounds=0, num_spec_accepted_tokens=0).mean_acceptance_length is None


# ---- the public Engine over a speculative Program ------------------------------------------------
def test_engine_facade_reports_lookahead_and_usage():
    from ninfer.engine.facade import Engine

    prog = FakeProgram(speculative=K, num_pages=128, max_model_len=64)
    eng = Engine.from_program(prog, FakeFrontend(), EngineConfig(max_model_len=64, prefill_chunk_tokens=4,
                                                                 speculative={"method": "mtp",
                                                                              "num_speculative_tokens": K}))
    try:
        assert eng.wait_ready(5).ready and eng.lookahead == K and eng.max_model_len == 64
        r = eng.generate(make_prompt(5), GREEDY, max_tokens=64 - 5 - K, output=OutputOptions(ignore_eos=True),
                         timeout=10)
        assert len(r.token_ids) == 64 - 5 - K and r.usage.num_spec_rounds > 0
        with pytest.raises(EngineRequestError, match="speculative lookahead"):
            eng.submit(make_prompt(5), GREEDY, max_tokens=64 - 5 - K + 1)
        with pytest.raises(ValueError, match=r"1\.\.59 \(max_model_len - 2 - the speculative lookahead\)"):
            eng.warm_up([64 - 2 - K + 1])
        assert eng.metrics().num_spec_drafts == r.usage.num_spec_rounds
    finally:
        eng.close()
