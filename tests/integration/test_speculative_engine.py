"""Speculative decoding through the Engine (tiny identities, fp32 on the CPU, their checkpoints' MTP layers):
greedy output with MTP equals greedy output without it, request for request, with up to 8 requests in a
round, prefix-cache hits, stop strings and max_tokens landing inside a round, a thinking budget's forced
control tokens, and requests cancelled mid-round; afterwards every page, slot and capacity unit is back.

NINFER_LONG_TESTS=1 runs the full-size variant (50 prompts x 128 tokens, K = 1..4, both identities)."""
from __future__ import annotations

import os
import random

import pytest

from ninfer import Engine, EngineConfig
from ninfer.config import GenerationDelta
from ninfer.contract.frontend import OutputOptions, PreparedPrompt
from ninfer.contract.program import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
LONG = bool(os.environ.get("NINFER_LONG_TESTS"))


def _engine(path, K, max_model_len):
    spec = {"method": "mtp", "num_speculative_tokens": K} if K else None
    return Engine(path, EngineConfig(max_concurrency=8, queue_size=128, max_model_len=max_model_len, page_size=16,
                                     prefill_chunk_tokens=24, speculative=spec))


def _jobs(eng, n, tokens, seed):
    """n requests: random prompts, half of them sharing a prefix with an earlier one (context-cache hits),
    max_tokens not a multiple of any K + 1, and a chat prompt with a thinking budget."""
    rng = random.Random(seed)
    jobs, prompts = [], []
    for i in range(n):
        if prompts and i % 2:
            ids = prompts[rng.randrange(len(prompts))][:rng.randrange(17, 40)] + [rng.randrange(248000)
                                                                               for _ in range(rng.randrange(1, 6))]
        else:
            ids = [rng.randrange(248000) for _ in range(rng.randrange(5, 48))]
        prompts.append(ids)
        jobs.append((PreparedPrompt(tuple(ids)), tokens - (i % 7), OutputOptions(ignore_eos=True)))
    chat = eng.frontend.prepare_chat([{"role": "user", "content": "Think about it."}],
                                     chat_template_kwargs={"enable_thinking": True})
    jobs.append((chat, tokens, OutputOptions(ignore_eos=True, thinking_budget=5)))
    return jobs


def _run(eng, jobs, cancel=()):
    handles = [eng.submit(p, GREEDY, max_tokens=m, output=o) for p, m, o in jobs]
    out = []
    for i, h in enumerate(handles):
        if i in cancel:
            for ev in h:
                if isinstance(ev, GenerationDelta):
                    h.cancel()
                    break
            out.append(None)
            for _ in h:
                pass
            continue
        evs = list(h)
        out.append((evs[-1].token_ids, evs[-1].finish_reason, evs[-1].text))
    return out


_PLAIN: dict = {}


def _plain(path, n, tokens, seed, L):
    """The plain Engine's results of the jobs, with and without stop strings (computed once per arguments)."""
    key = (str(path), n, tokens, seed)
    if key not in _PLAIN:
        with _engine(path, 0, L) as plain:
            assert plain.wait_ready(120).ready
            jobs = _jobs(plain, n, tokens, seed)
            ref = _run(plain, jobs)
            # stop strings: a piece of each plain answer's text, so that the stop lands inside a round
            stops = [r[2][len(r[2]) // 2:len(r[2]) // 2 + 3] for r in ref]
            stopped_jobs = [(p, m, OutputOptions(ignore_eos=True, stop=(s,) if s.strip() else ()))
                            for (p, m, _), s in zip(jobs[:-1], stops)]
            _PLAIN[key] = (jobs, ref, stopped_jobs, _run(plain, stopped_jobs))
    return _PLAIN[key]


def _compare(path, K, n, tokens, seed):
    L = 64 + tokens + 8
    jobs, ref, stopped_jobs, ref_stop = _plain(path, n, tokens, seed, L)
    with _engine(path, K, L) as eng:
        assert eng.wait_ready(120).ready
        out = _run(eng, jobs)
        assert out == ref
        assert _run(eng, stopped_jobs) == ref_stop
        cancelled = _run(eng, jobs[:9], cancel={1, 4, 7})
        assert [c for i, c in enumerate(cancelled) if i not in (1, 4, 7)] == [r for i, r in enumerate(ref[:9])
                                                                             if i not in (1, 4, 7)]
        m = eng.metrics()
        assert m.running == 0 and m.waiting == 0 and m.outstanding == 0
        assert m.outstanding_capacity_free == m.outstanding_capacity
        assert m.num_control_units > 0 and m.num_reused_tokens > 0
    return out


@pytest.mark.parametrize("kind,K", [("moe", 3)])
def test_speculative_engine_greedy_equals_plain(tiny_artifact_path, kind, K):
    _compare(tiny_artifact_path(kind), K, 6, 12, seed=K)


@pytest.mark.skipif(not LONG, reason="full-size run: NINFER_LONG_TESTS=1")
@pytest.mark.parametrize("kind", ["dense", "moe"])
@pytest.mark.parametrize("K", [1, 2, 3, 4])
def test_speculative_engine_greedy_equals_plain_full_size(tiny_artifact_path, kind, K):
    _compare(tiny_artifact_path(kind), K, 50, 128, seed=100)
