"""Prefix reuse across an *emitted* turn, through the public Engine (CPU, fp32), with scripted
artifacts (tests/support/serve_util.py: build_tool_script_artifact: demo weights rewired into a bigram chain).

The Frontend reports an output reconstruction boundary only where the history re-render reproduces
the emitted tokens exactly (frontend/reconstruction.py). Two facts follow for these models:

- the scripted tool call `<tool_call><function=get_weather>...` has no newlines; the template
  re-renders a call as `<tool_call>\\n<function=get_weather>\\n<parameter=city>\\nParis\\n...`, whose
  tokens repeat (198 six times), which a bigram chain cannot emit. So turn 2 (history + tool
  response) shares only `<tool_call>` with turn 1's prompt + output: no boundary after the call
  exists to publish, the terminal checkpoint stays at the prompt's reconstruction prefix, and
  turn 2 reuses the end-of-prompt capture (P - 1). Tested as such, with the cache on and off.
- a plain-text answer the re-render reproduces token for token *can* be scripted: with
  `preserve_thinking` its stop is an output boundary, the terminal checkpoint covers prompt +
  output (including `<|im_end|>`), and turn 2 reuses all of it.
"""
from __future__ import annotations

import json

import pytest

from ninfer import Engine
from ninfer.contract.program import SamplingParams
from ninfer.contract.frontend import FinishReason, OutputOptions
from ninfer.config import EngineConfig, GenerationStart
from support.scratch import scratch_dir
from support.serve_util import IM_END, build_tool_script_artifact

GREEDY = SamplingParams(temperature=0.0)
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
ANSWER = "Sunny in Paris today."


@pytest.fixture(scope="module")
def tool_artifact(tmp_path_factory):
    with scratch_dir(tmp_path_factory, "tool-script") as d:
        path = d / "tool-script.ninfer"
        yield path, build_tool_script_artifact(path)


@pytest.fixture(scope="module")
def text_artifact(tmp_path_factory):
    from ninfer.targets.qwen3_6.frontend import Qwen36Frontend
    chain = [*Qwen36Frontend.builtin().tokenizer.encode(ANSWER), IM_END]
    with scratch_dir(tmp_path_factory, "text-script") as d:
        path = d / "text-script.ninfer"
        yield path, build_tool_script_artifact(path, output_ids=chain)


def _engine(path, cache: bool) -> Engine:
    eng = Engine(path, EngineConfig(device="cpu", dtype="fp32", max_concurrency=2, queue_size=4, max_model_len=512,
                                    prefill_chunk_tokens=64, prefix_cache=cache))
    assert eng.wait_ready(60).ready, eng.availability.reason
    return eng


@pytest.fixture(scope="module")
def tool_off(tool_artifact):
    """The cache-off reference engine of the tool artifact, shared by the module's tests (no cache: no
    state carries from one test to the next); checked clean at the end."""
    eng = _engine(tool_artifact[0], False)
    yield eng
    _close_and_check(eng)


@pytest.fixture(scope="module")
def text_off(text_artifact):
    """The same for the text artifact."""
    eng = _engine(text_artifact[0], False)
    yield eng
    _close_and_check(eng)


def _run(eng: Engine, prompt, tools, session=None):
    events = list(eng.submit(prompt, GREEDY, max_tokens=40, output=OutputOptions(tools=tuple(tools or ())),
                             session_id=session))
    start, res = events[0], events[-1]
    assert isinstance(start, GenerationStart), res
    assert res.usage.cached_tokens == start.num_reused_tokens
    return res


def _session_frontier(eng: Engine, session: str) -> int:
    cache = eng._core.rm.cache                        # read while the worker is idle
    return cache.entries[cache.sessions.lookup(session).checkpoint_id].frontier


def _close_and_check(eng: Engine) -> None:
    eng.close()
    eng._core.program.check_integrity()
    m = eng.metrics()
    assert (m.running, m.waiting, m.outstanding) == (0, 0, 0)
    assert m.outstanding_capacity_free == m.outstanding_capacity
    # every page and slot not held by an inactive checkpoint is free again
    cap = eng._core.program.capacity()
    assert (m.pages_free, m.slots_free) == (cap.pages_free, cap.slots_free)
    assert m.slots_free == m.slots_total - m.num_checkpoints_device


def _assistant(res) -> dict:
    msg = {"role": "assistant", "content": res.text}
    if res.reasoning:
        msg["reasoning_content"] = res.reasoning
    if res.tool_calls:
        msg["tool_calls"] = [{"type": "function", "id": c.id,
                              "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                             for c in res.tool_calls]
    return msg


def _common(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("kwargs", [{"enable_thinking": False}, {"enable_thinking": True},
                                    {"enable_thinking": False, "preserve_thinking": True}],
                         ids=["thinking_off", "thinking_on", "preserve_thinking"])
def test_emitted_tool_call_then_tool_response(tool_artifact, tool_off, kwargs):
    path, scripted = tool_artifact
    on, off = _engine(path, True), tool_off
    fe = on.frontend
    p1 = fe.prepare_chat(ASK, tools=TOOLS, chat_template_kwargs=kwargs)
    r1 = _run(on, p1, TOOLS, session="conv")
    assert r1.finish_reason is FinishReason.TOOL_CALLS and list(r1.token_ids) == scripted
    (call,) = r1.tool_calls
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    ref1 = _run(off, p1, TOOLS)
    assert ref1.token_ids == r1.token_ids and ref1.usage.cached_tokens == 0

    msgs = [*ASK, _assistant(r1), {"role": "tool", "tool_call_id": call.id, "content": "{\"temp\": 21}"}]
    p2 = fe.prepare_chat(msgs, tools=TOOLS, chat_template_kwargs=kwargs)
    P1, rp = p1.num_prompt_tokens, p1.reconstruction_prefix
    # the re-rendered call is not the emitted one: only `<tool_call>` (or, thinking on, not even the
    # generation prompt's "<think>\n") is shared, so no boundary after the call can be reported
    shared = _common(p2.token_ids, p1.token_ids + r1.token_ids)
    assert shared == (P1 - 1 if kwargs["enable_thinking"] else P1 + 1)
    assert _session_frontier(on, "conv") == rp

    r2 = _run(on, p2, TOOLS, session="conv")
    ref2 = _run(off, p2, TOOLS)
    assert r2.token_ids == ref2.token_ids and r2.finish_reason is ref2.finish_reason is FinishReason.TOOL_CALLS
    assert ref2.usage.cached_tokens == 0
    # the end-of-prompt capture of turn 1 (P - 1) is the longest published prefix of turn 2
    assert r2.usage.cached_tokens == P1 - 1 > rp
    m = on.metrics()
    assert (m.num_cache_queries, m.num_cache_hits) == (2, 1)
    assert m.num_cache_hit_tokens == m.num_reused_tokens == P1 - 1
    _close_and_check(on)
    m = off.metrics()                                 # closed and checked in full at the module's end
    assert (m.running, m.waiting, m.outstanding) == (0, 0, 0)


@pytest.mark.parametrize("preserve", [True, False], ids=["preserve_thinking", "reasoning_dropped"])
def test_stop_with_reasoning_kept_publishes_the_output(text_artifact, text_off, preserve):
    path, scripted = text_artifact
    kwargs = {"enable_thinking": False, "preserve_thinking": preserve}
    on, off = _engine(path, True), text_off
    fe = on.frontend
    p1 = fe.prepare_chat(ASK, chat_template_kwargs=kwargs)
    r1 = _run(on, p1, None, session="conv")
    assert r1.finish_reason is FinishReason.STOP and list(r1.token_ids) == scripted and r1.text == ANSWER
    assert _run(off, p1, None).token_ids == r1.token_ids

    msgs = [*ASK, _assistant(r1), {"role": "user", "content": "And tomorrow?"}]
    p2 = fe.prepare_chat(msgs, chat_template_kwargs=kwargs)
    P1, rp, n = p1.num_prompt_tokens, p1.reconstruction_prefix, len(r1.token_ids)
    # with preserve_thinking the turn is re-rendered as emitted (`<think>\n\n</think>\n\n` + answer +
    # `<|im_end|>`); without it the history drops the think block after the generation prompt's head
    expected = P1 + n if preserve else rp
    assert _session_frontier(on, "conv") == expected
    assert p2.token_ids[:expected] == (p1.token_ids + r1.token_ids)[:expected]

    r2 = _run(on, p2, None, session="conv")
    ref2 = _run(off, p2, None)
    assert r2.token_ids == ref2.token_ids and list(r2.token_ids) == scripted
    assert ref2.usage.cached_tokens == 0
    assert r2.usage.cached_tokens == expected
    if preserve:
        assert r2.usage.cached_tokens > rp and r2.usage.cached_tokens > P1
    m = on.metrics()
    assert (m.num_cache_queries, m.num_cache_hits) == (2, 1)
    assert m.num_cache_hit_tokens == m.num_reused_tokens == expected
    _close_and_check(on)
    m = off.metrics()                                 # closed and checked in full at the module's end
    assert (m.running, m.waiting, m.outstanding) == (0, 0, 0)
