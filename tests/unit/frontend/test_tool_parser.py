"""Qwen XML tool calls (vLLM qwen3_coder rules): typed arguments, streaming deltas of 1..N tokens,
finish reasons."""
from __future__ import annotations

import functools
import json

import pytest

from ninfer.targets.qwen3_6.frontend import FinishReason, OutputOptions, Qwen36Frontend
from ninfer.targets.qwen3_6.frontend.tool_args import convert_value

IM_END = 248046
TOOLS = (
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "temp": {"type": "number"},
        "metric": {"type": "boolean"}, "opts": {"type": "object"}, "tags": {"type": "array"},
        "maybe": {"anyOf": [{"type": "string"}, {"type": "null"}]}, "n": {"type": ["integer", "null"]}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
        "q": {"type": "string"}}}}},
)


@functools.cache
def fe() -> Qwen36Frontend:
    return Qwen36Frontend.builtin()


def call(name, **params) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def run(text, chunk, thinking=False, stop_token=True, end=FinishReason.LENGTH, **kw):
    p = fe().prepare_chat([{"role": "user", "content": "q"}], tools=list(TOOLS),
                          chat_template_kwargs={"enable_thinking": thinking})
    kw.setdefault("tools", TOOLS)
    s = fe().new_session(p, OutputOptions(**kw))
    ids = fe().tokenizer.encode(text) + ([IM_END] if stop_token else [])
    deltas, i = [], 0
    while i < len(ids) and not s.terminal:
        pv = s.preview(ids[i:i + chunk])
        s.commit(pv)
        deltas.append(pv.delta)
        i += pv.accepted_tokens
    d, f = s.finish(None if s.terminal else end)
    deltas.append(d)
    # streamed tool-call deltas rebuild the final calls exactly
    streamed: dict[int, dict] = {}
    for d in deltas:
        for tc in d.tool_calls:
            entry = streamed.setdefault(tc.index, {"id": None, "name": None, "args": ""})
            if tc.id is not None:
                assert entry["id"] is None, "id sent twice"
                entry["id"] = tc.id
            if tc.name is not None:
                assert entry["name"] is None, "name sent twice"
                entry["name"] = tc.name
            entry["args"] += tc.arguments
    assert [(e["id"], e["name"], e["args"]) for _, e in sorted(streamed.items())] == \
        [(c.id, c.name, c.arguments) for c in f.tool_calls]
    assert "".join(d.text for d in deltas) == f.text
    return f


CHUNKS = [1, 2, 3, 4, 8, 1000]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_single_call_with_typed_arguments(chunk):
    text = call("get_weather", city="Paris", days="3", temp="21.5", metric="True", opts='{"a": [1, 2]}',
                tags="['x', 'y']", maybe="null", n="None", extra="42")
    f = run(text, chunk)
    assert f.finish_reason is FinishReason.TOOL_CALLS and f.text == ""
    (c,) = f.tool_calls
    assert c.name == "get_weather" and c.id.startswith("call_")
    assert json.loads(c.arguments) == {"city": "Paris", "days": 3, "temp": 21.5, "metric": True,
                                       "opts": {"a": [1, 2]}, "tags": ["x", "y"], "maybe": None,
                                       "n": None, "extra": "42"}
    assert c.arguments == json.dumps(json.loads(c.arguments), ensure_ascii=False)


@pytest.mark.parametrize("chunk", CHUNKS)
def test_content_then_several_calls(chunk):
    text = "Let me look.\n\n" + call("search", q="weather 東京") + "\n" + call("get_weather", city="Tokyo") + "\n"
    f = run(text, chunk)
    assert f.text == "Let me look.\n\n"
    assert [(c.name, json.loads(c.arguments)) for c in f.tool_calls] == [
        ("search", {"q": "weather 東京"}), ("get_weather", {"city": "Tokyo"})]
    assert len({c.id for c in f.tool_calls}) == 2
    assert f.finish_reason is FinishReason.TOOL_CALLS


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_multiline_string_value_and_literal_markup(chunk):
    code = "def f(x):\n    return x < 2 and x > 0\n\n"
    f = run(call("search", q=code), chunk)
    assert json.loads(f.tool_calls[0].arguments) == {"q": code}


@pytest.mark.parametrize("chunk", [1, 2, 1000])
def test_no_parameters_and_unknown_tool(chunk):
    f = run(call("search") + call("unknown_tool", x="5"), chunk)
    assert [(c.name, c.arguments) for c in f.tool_calls] == [("search", "{}"), ("unknown_tool", '{"x": "5"}')]


@pytest.mark.parametrize("chunk", [1, 4, 1000])
def test_after_thinking(chunk):
    f = run("Need weather.\n</think>\n\n" + call("get_weather", city="Oslo", days="1"), chunk, thinking=True)
    assert f.reasoning == "Need weather.\n" and f.text == "\n\n"
    assert json.loads(f.tool_calls[0].arguments) == {"city": "Oslo", "days": 1}


@pytest.mark.parametrize("chunk", [1, 1000])
def test_missing_closing_tags(chunk):
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</function>\n</tool_call>"
    f = run(text, chunk)
    assert json.loads(f.tool_calls[0].arguments) == {"city": "Rome"}
    f = run("<tool_call>\n<function=search>\n<parameter=q>\nhi\n</parameter>\n</tool_call>", chunk)
    assert json.loads(f.tool_calls[0].arguments) == {"q": "hi"}


@pytest.mark.parametrize("chunk", [1, 1000])
def test_truncated_call_is_closed_at_length(chunk):
    f = run("<tool_call>\n<function=get_weather>\n<parameter=city>\nBer", chunk, stop_token=False)
    assert f.finish_reason is FinishReason.LENGTH
    assert json.loads(f.tool_calls[0].arguments) == {"city": "Ber"}
    f = run("Sure <tool_call>\n<func", chunk, stop_token=False, end=FinishReason.CANCELLED)
    assert f.tool_calls == () and f.text == "Sure <tool_call>\n<func"
    assert f.finish_reason is FinishReason.CANCELLED


@pytest.mark.parametrize("chunk", [1, 1000])
def test_not_a_call_stays_content(chunk):
    f = run("Use <tool_call> tags like {json}", chunk)
    assert f.tool_calls == () and f.text == "Use <tool_call> tags like {json}"
    assert f.finish_reason is FinishReason.STOP


def test_tool_parsing_off_keeps_raw_text():
    text = call("search", q="x")
    f = run(text, 1, parse_tool_calls=False)
    assert f.tool_calls == () and f.text == text and f.finish_reason is FinishReason.STOP
    f = run(text, 1, tools=())
    assert f.tool_calls == () and f.text == text


def test_trailing_text_after_call_is_content():
    f = run(call("search", q="x") + "\n\nDone.", 1)
    assert f.text == "Done." and len(f.tool_calls) == 1
    assert f.finish_reason is FinishReason.TOOL_CALLS


@pytest.mark.parametrize("value, schema, expected", [
    ("5", {"type": "integer"}, 5), ("5x", {"type": "integer"}, "5x"), ("-3", {"type": "int"}, -3),
    ("2.0", {"type": "number"}, 2), ("2.5", {"type": "number"}, 2.5), ("nan", {"type": "number"}, "nan"),
    ("1e400", {"type": "number"}, "1e400"), ("abc", {"type": "number"}, "abc"),
    ("TRUE", {"type": "boolean"}, True), ("no", {"type": "boolean"}, False),
    ('{"a": 1}', {"type": "object"}, {"a": 1}), ("{'a': 1}", {"type": "object"}, {"a": 1}),
    ("[1, 'b']", {"type": "array"}, [1, "b"]), ("[broken", {"type": "array"}, "[broken"),
    ("null", {"type": "string"}, "null"), ("null", {"type": "integer"}, None),
    ("None", {"anyOf": [{"type": "string"}, {"type": "null"}]}, None),
    ("x", {"anyOf": [{"type": "string"}, {"type": "null"}]}, "x"),
    ("7", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, 7),
    ("7", {"type": ["integer", "null"]}, 7), ("(1, 2)", {"type": "custom"}, [1, 2]),
    ("{1, 2}", {"type": "custom"}, "{1, 2}"), ("plain", {}, "plain"),
])
def test_convert_value(value, schema, expected):
    got = convert_value(value, "p", {"p": schema})
    assert json.dumps(got) == json.dumps(expected)       # also tells 2 from 2.0 and True from 1
