"""Reasoning/content split (vLLM Qwen3 reasoning parser rules, qwen3_6.md section 8), streamed in
deltas of 1..N tokens and in one piece."""
from __future__ import annotations

import functools

import pytest

from ninfer.targets.qwen3_6.frontend import FinishReason, OutputOptions, Qwen36Frontend

IM_END = 248046
TOOLS = ({"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}}}},)


@functools.cache
def fe() -> Qwen36Frontend:
    return Qwen36Frontend.builtin()


def prompt(thinking=True):
    return fe().prepare_chat([{"role": "user", "content": "q"}], tools=list(TOOLS),
                             chat_template_kwargs={"enable_thinking": thinking})


def run(ids, chunk, thinking=True, **kw):
    s = fe().new_session(prompt(thinking), OutputOptions(**kw))
    reasoning, text, i = [], [], 0
    while i < len(ids) and not s.terminal:
        pv = s.preview(ids[i:i + chunk])
        s.commit(pv)
        reasoning.append(pv.delta.reasoning)
        text.append(pv.delta.text)
        i += pv.accepted_tokens
    d, f = s.finish(None if s.terminal else FinishReason.LENGTH)
    reasoning.append(d.reasoning)
    text.append(d.text)
    assert "".join(reasoning) == f.reasoning and "".join(text) == f.text
    return f


def enc(*parts) -> list[int]:
    """Token ids of the parts encoded separately (so a tag can be split over several tokens)."""
    out = []
    for p in parts:
        out += p if isinstance(p, list) else fe().tokenizer.encode(p)
    return out


CASES = [
    # (name, ids, thinking, options, reasoning, content, finish)
    ("simple", enc("This is reasoning</think>This is content", [IM_END]), True, {},
     "This is reasoning", "This is content", FinishReason.STOP),
    ("template separators", enc("Think.\n</think>\n\nAnswer.", [IM_END]), True, {},
     "Think.\n", "\n\nAnswer.", FinishReason.STOP),
    ("multiline", enc("line1\nline2\n</think>\n\ncontent\nmore", [IM_END]), True, {},
     "line1\nline2\n", "\n\ncontent\nmore", FinishReason.STOP),
    ("truncated: all reasoning", enc("still thinking about it"), True, {},
     "still thinking about it", "", FinishReason.LENGTH),
    ("empty reasoning", enc("</think>\n\nJust the answer", [IM_END]), True, {},
     "", "\n\nJust the answer", FinishReason.STOP),
    ("only reasoning then eos", enc("r</think>", [IM_END]), True, {}, "r", "", FinishReason.STOP),
    ("thinking disabled: all content", enc("no </think> split here", [IM_END]), False, {},
     "", "no </think> split here", FinishReason.STOP),
    ("parse_reasoning off: raw text", enc("abc</think>def", [IM_END]), True,
     {"parse_reasoning": False}, "", "abc</think>def", FinishReason.STOP),
    ("tag split over tokens", enc("abc</", "think", ">def", [IM_END]), True, {},
     "abc", "def", FinishReason.STOP),
    ("second </think> is content", enc("a</think>b</think>c", [IM_END]), True, {},
     "a", "b</think>c", FinishReason.STOP),
    ("unicode reasoning", enc("考虑一下😀</think>答案", [IM_END]), True, {},
     "考虑一下😀", "答案", FinishReason.STOP),
    ("stop string inside reasoning", enc("abc STOP def</think>x", [IM_END]), True, {"stop": ("STOP",)},
     "abc ", "", FinishReason.STOP),
    ("<think> tag text in reasoning kept", enc("a<think>b</think>c", [IM_END]), True, {},
     "a<think>b", "c", FinishReason.STOP),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1000])
def test_reasoning_split(case, chunk):
    _, ids, thinking, opts, reasoning, content, finish = case
    f = run(ids, chunk, thinking, **opts)
    assert (f.reasoning, f.text, f.finish_reason) == (reasoning, content, finish)


@pytest.mark.parametrize("chunk", [1, 2, 5, 1000])
def test_tool_call_before_think_end_ends_reasoning(chunk):
    ids = enc("I will call f.\n\n<tool_call>\n<function=f>\n<parameter=a>\n7\n</parameter>\n"
              "</function>\n</tool_call>", [IM_END])
    f = run(ids, chunk, True, tools=TOOLS)
    assert f.reasoning == "I will call f.\n\n"
    assert f.text == ""
    assert [(c.name, c.arguments) for c in f.tool_calls] == [("f", '{"a": 7}')]
    assert f.finish_reason is FinishReason.TOOL_CALLS


def test_tool_call_in_reasoning_without_tool_parsing_is_content():
    ids = enc("think <tool_call>\n<function=f>\n</function>\n</tool_call>", [IM_END])
    f = run(ids, 1, True)            # no tools in the options: nothing is parsed as a call
    assert f.reasoning == "think " and f.text.startswith("<tool_call>\n<function=f>")
    assert f.tool_calls == () and f.finish_reason is FinishReason.STOP


def test_reasoning_token_count():
    ids = enc("a b c", "</think>", "\n\nanswer", [IM_END])
    f = run(ids, 2)
    n_reasoning = len(enc("a b c")) + 1               # the </think> token counts as reasoning
    assert f.num_reasoning_tokens == n_reasoning
    assert run(ids, 1, thinking=False).num_reasoning_tokens == 0
