"""Prefix reuse through the Engine with the tiny dense model and the real Frontend: greedy output
with cache hits equals output with the cache off, token for token (multi-turn chats with thinking
on and off, preserve_thinking, tool calls in the history, shared system prompts diverging
anywhere, prompts shorter than one page), and the catalog/SessionIndex/metrics facts."""
from __future__ import annotations

import functools
import json
import random

import pytest

from support.program_util import tiny_parts
from support.fakes import FakeClock, run_until_idle
from ninfer.contract.program import SamplingParams
from ninfer.engine.context_cache import CacheConfig
from ninfer.engine.engine_core import EngineCore
from ninfer.contract.frontend import OutputOptions, PreparedPrompt
from ninfer.config import GenerationStart

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def tiny(tiny_artifact_path):
    frontend, program = tiny_parts(tiny_artifact_path, "dense", page_size=16, num_pages=64, num_slots=12,
                                   max_model_len=512, max_batch=4)
    return frontend, functools.partial(program, sampleable_vocab_size=frontend.vocab_size)


def make_engine(tiny, cache: CacheConfig | None, *, max_concurrency=2, chunk=7, **program_kw):
    frontend, program = tiny
    prog = program(**program_kw)
    core = EngineCore(frontend, max_concurrency=max_concurrency, queue_size=16, request_timeout_s=60.0,
                      prefill_chunk_tokens=chunk, max_model_len=prog.max_model_len, clock=FakeClock(), cache=cache)
    core.attach_program(prog)
    return core, prog


def run(core, prompt, max_tokens, **kw):
    h = core.submit(prompt, GREEDY, max_tokens=max_tokens, **kw)
    run_until_idle(core)
    core.program.check_integrity()
    events = list(h)
    start = events[0]
    assert isinstance(start, GenerationStart)
    res = events[-1]
    assert res.usage.cached_tokens == start.num_reused_tokens
    return res


def converse(core, frontend, turns, *, kwargs=None, tools=None, session=None, max_tokens=8, history=()):
    msgs = [{"role": "system", "content": "You are a terse assistant."}, *history]
    out = []
    for user in turns:
        msgs.append({"role": "user", "content": user})
        prompt = frontend.prepare_chat(msgs, tools=tools, chat_template_kwargs=kwargs)
        opts = OutputOptions(tools=tuple(tools or ()))
        r = run(core, prompt, max_tokens, output=opts, session_id=session)
        out.append((r.token_ids, r.usage.cached_tokens, prompt.num_prompt_tokens))
        msg = {"role": "assistant", "content": r.text}
        if r.reasoning:
            msg["reasoning_content"] = r.reasoning
        if r.tool_calls:
            msg["tool_calls"] = [{"type": "function", "id": c.id,
                                  "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                                 for c in r.tool_calls]
        msgs.append(msg)
    return out


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
TOOL_HISTORY = (
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "id": "call_1", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
)


@pytest.mark.parametrize("case", ["thinking_off", "thinking_on", "preserve_thinking", "tools"])
def test_multi_turn_chat_hit_equals_miss(tiny, case):
    frontend, _ = tiny
    kwargs = {"thinking_off": {"enable_thinking": False}, "thinking_on": {"enable_thinking": True},
              "preserve_thinking": {"enable_thinking": True, "preserve_thinking": True},
              "tools": {"enable_thinking": False}}[case]
    tools = TOOLS if case == "tools" else None
    history = TOOL_HISTORY if case == "tools" else ()
    turns = ["Hello there", "Tell me more.", "And then?"]
    ref_core, _ = make_engine(tiny, None)
    reference = converse(ref_core, frontend, turns, kwargs=kwargs, tools=tools, history=history)
    core, prog = make_engine(tiny, CacheConfig())
    got = converse(core, frontend, turns, kwargs=kwargs, tools=tools, session="s1", history=history)
    assert [g[0] for g in got] == [r[0] for r in reference]
    assert all(r[1] == 0 for r in reference)
    assert got[0][1] == 0
    assert all(g[1] > 0 for g in got[1:]), got                  # later turns reuse the earlier ones
    assert all(g[1] < g[2] for g in got)
    m = core.metrics()
    assert m.num_cache_queries == 3 and m.num_cache_hits == 2
    assert m.num_cache_hit_tokens == sum(g[1] for g in got) == m.num_reused_tokens
    assert core.rm.cache.sessions.lookup("s1") is not None
    prog.check_integrity()


def test_identical_prompt_reuses_up_to_the_last_token(tiny):
    frontend, _ = tiny
    core, prog = make_engine(tiny, CacheConfig())
    ref_core, _ = make_engine(tiny, None)
    p = frontend.prepare_text("The same prompt, sent twice.")
    ref = run(ref_core, p, 6)
    a = run(core, p, 6)
    b = run(core, p, 6)
    assert a.token_ids == b.token_ids == ref.token_ids
    assert a.usage.cached_tokens == 0
    # the end-of-prompt capture proves P - 1 tokens, the last one is recomputed for its logits;
    # the terminal checkpoint of the first request (prompt + output) is not a prefix of the prompt
    assert b.usage.cached_tokens == p.num_prompt_tokens - 1


@pytest.mark.parametrize("diverge", [1, 2, 5, 9, 16, 23])
def test_shared_system_prompt_diverging_anywhere(tiny, diverge):
    """Stride captures (every 3 tokens, page size 16): a prompt diverging at `diverge` reuses the
    longest capture at or before it -- inside the first page too -- and matches the cache off."""
    rng = random.Random(diverge)
    base = [rng.randrange(0, 150000) for _ in range(30)]
    other = base[:diverge] + [rng.randrange(0, 150000) for _ in range(30 - diverge)]
    assert other[diverge] != base[diverge]
    core, prog = make_engine(tiny, CacheConfig(capture_stride=3), num_slots=24)
    ref_core, _ = make_engine(tiny, None)
    run(core, PreparedPrompt(tuple(base)), 4)
    r = run(core, PreparedPrompt(tuple(other)), 4)
    ref = run(ref_core, PreparedPrompt(tuple(other)), 4)
    assert r.token_ids == ref.token_ids
    assert r.usage.cached_tokens == (diverge // 3) * 3


def test_short_prompt_below_one_page_hits(tiny):
    core, prog = make_engine(tiny, CacheConfig())
    ref_core, _ = make_engine(tiny, None)
    first = PreparedPrompt((11, 22, 33))
    run(core, first, 3)                                           # captures [11, 22] (P - 1 = 2)
    nxt = PreparedPrompt((11, 22, 44, 55))
    r = run(core, nxt, 5)
    assert r.usage.cached_tokens == 2
    assert r.token_ids == run(ref_core, nxt, 5).token_ids
    assert run(core, PreparedPrompt((11, 77)), 2).usage.cached_tokens == 0     # captures [11]
    one = PreparedPrompt((11, 22))                                 # 1-token reuse works as well
    r = run(core, one, 3)
    assert r.usage.cached_tokens == 1 and r.token_ids == run(ref_core, one, 3).token_ids


def test_prompt_logprobs_are_recomputed_and_cache_off_requests_leave_nothing(tiny):
    frontend, _ = tiny
    core, prog = make_engine(tiny, CacheConfig())
    p = frontend.prepare_text("Log-probs of every prompt token, please.")
    run(core, p, 3)
    h = core.submit(p, GREEDY, max_tokens=3, prompt_logprobs=0)
    run_until_idle(core)
    r = h.result()
    assert r.usage.cached_tokens == 0 and len(r.prompt_logprobs) == p.num_prompt_tokens
    # a warmup-like request (context_cache=False) neither reuses nor adds a catalog entry
    core2, prog2 = make_engine(tiny, CacheConfig())
    r = run(core2, p, 3, context_cache=False)
    assert r.usage.cached_tokens == 0 and len(core2.rm.cache) == 0
    assert prog2.cache_usage() == (0, 0, 0, 0)
    cap = prog2.capacity()
    assert (cap.pages_free, cap.slots_free) == (cap.pages_total, cap.slots_total)


def test_session_index_replacement_follows_publication_order(tiny):
    from ninfer.engine.session_index import SessionIndex
    idx = SessionIndex()
    assert idx.bind("a", 5, 10) == (True, None)
    assert idx.bind("a", 6, 9) == (False, None)                 # an earlier request finishing later
    assert idx.bind("a", 7, 11) == (True, 5)
    assert idx.lookup("a").checkpoint_id == 7
    assert idx.forget_checkpoint(7) == ["a"] and idx.lookup("a") is None


class _BoundaryAtEveryToken:
    """A Frontend whose sessions report a reconstruction boundary after every accepted token (as the
    real one does at a stop with preserve_thinking, or at the end of a tool call): the terminal
    checkpoint's frontier then covers the tokens of the very batch that ended the request."""

    def __init__(self, frontend):
        self._frontend = frontend

    def __getattr__(self, name):
        return getattr(self._frontend, name)

    def new_session(self, prompt, options):
        inner = self._frontend.new_session(prompt, options)

        class Session:
            def __getattr__(self, name):
                return getattr(inner, name)

            def preview(self, tokens, **kw):
                import dataclasses
                p = inner.preview(tokens, **kw)
                return dataclasses.replace(p, boundary=p.accepted_tokens)
        return Session()


def test_terminal_checkpoint_covering_the_last_batch_is_adopted(tiny):
    frontend, program = tiny
    prog = program()
    core = EngineCore(_BoundaryAtEveryToken(frontend), max_concurrency=2, queue_size=4, request_timeout_s=60.0,
                      prefill_chunk_tokens=7, max_model_len=prog.max_model_len, clock=FakeClock(),
                      cache=CacheConfig())
    core.attach_program(prog)
    p = frontend.prepare_chat([{"role": "user", "content": "Hi"}])
    r = run(core, p, 4, session_id="s")
    assert core.availability.ready, core.availability.reason
    assert len(r.token_ids) == 4
    cid = core.rm.cache.sessions.lookup("s").checkpoint_id
    assert core.rm.cache.entries[cid].frontier == p.num_prompt_tokens + 4
    nxt = PreparedPrompt(p.token_ids + r.token_ids + (11, 12))
    assert run(core, nxt, 2).usage.cached_tokens == p.num_prompt_tokens + 4
