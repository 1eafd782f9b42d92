"""The enforced tool-call grammar (tool_grammar.py) over the real Qwen3.6 vocabulary, through the Frontend's
llguidance compiler: hand-written outputs the template would render are accepted and parse (channels.py,
tool_args.py) into calls whose arguments validate against the tool's schema; malformed ones are refused
at the first wrong token; random walks over the grammar's masks only ever produce valid calls."""
from __future__ import annotations

import ctypes
import functools
import json
import random

import jsonschema
import numpy as np
import pytest

from ninfer.targets.qwen3_6.frontend import FinishReason, OutputOptions, Qwen36Frontend
from ninfer.targets.qwen3_6.frontend.tool_grammar import ToolGrammarError, tool_call_grammar

IM_END = 248046
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "detail": {"type": "boolean"},
    "hours": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 23}, "maxItems": 3},
    "where": {"$ref": "#/$defs/point"}},
    "required": ["city", "days"],
    "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9}},
                        "required": ["x"], "additionalProperties": False}}}
TOOLS = (
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "ping"}},
    {"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}, "n": {"type": ["integer", "null"]}},
        "required": ["text"]}}},
)
SCHEMAS = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"}) for t in TOOLS}


@functools.cache
def fe() -> Qwen36Frontend:
    return Qwen36Frontend.builtin()


def call(name: str, **params) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def session(tools=TOOLS, **kw):
    prompt = fe().prepare_chat([{"role": "user", "content": "q"}], tools=list(tools),
                               chat_template_kwargs={"enable_thinking": False})
    constraint = fe().tool_call_constraint(tools, **kw)
    return fe().new_session(prompt, OutputOptions(tools=tuple(tools), constraint=constraint))


def run(text: str, tools=TOOLS, **kw):
    """(tokens the grammar accepted of text + <|im_end|>, all tokens, the parsed final output or None)."""
    s = session(tools, **kw)
    ids = fe().tokenizer.encode(text) + [IM_END]
    n = s.token_constraint.advance(ids)
    if n < len(ids):
        return n, len(ids), None
    assert s.token_constraint.done
    s.commit(s.preview(ids))
    return n, len(ids), s.finish()[1]


def assert_valid_calls(final, count: int | None = None) -> None:
    assert final.finish_reason is FinishReason.TOOL_CALLS and final.text.strip() == ""
    assert final.tool_calls and (count is None or len(final.tool_calls) == count)
    for c in final.tool_calls:
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])


@pytest.mark.parametrize("text,count", [
    (call("get_weather", city="Paris", days=3), 1),
    (call("get_weather", city="San\nFrancisco"[:12], unit="fahrenheit", days=14, detail="true",
          hours="[0, 23]", where='{"x": -9}'), 1),
    (call("ping"), 1),
    (call("note", text="a <b> & </c>\nmulti-line", n="null"), 1),
    (call("ping") + "\n" + call("get_weather", city="", days=1) + "\n\n" + call("note", text="x", n=7), 3),
], ids=["required-only", "every-type", "no-parameters", "free-text-and-null", "parallel"])
def test_template_shaped_calls_are_accepted_and_validate(text, count):
    n, total, final = run(text)
    assert n == total, f"refused after {n} of {total} tokens"
    assert_valid_calls(final, count)


def test_the_added_tool_call_tokens_and_their_byte_pieces_both_match():
    ids = fe().tokenizer.encode(call("ping"))
    assert ids[0] == 248058 and ids[-1] == 248059                 # <tool_call> ... </tool_call> as added tokens
    s = session()
    spelled = [t for piece in ("<", "tool", "_call", ">") for t in fe().tokenizer.encode(piece)]
    assert s.token_constraint.advance(spelled + ids[1:] + [IM_END]) == len(spelled) + len(ids)


@pytest.mark.parametrize("text,kw", [
    ("Sure. " + call("ping"), {}),                                              # text before the call
    (call("get_weather", city="Paris"), {}),                                    # required `days` missing
    (call("get_weather", city="Paris", days=15), {}),                           # over the maximum
    (call("get_weather", city="Paris", days="3.5"), {}),                        # not an integer
    (call("get_weather", city="a very long city name", days=2), {}),            # over maxLength
    (call("get_weather", city="Paris", unit="kelvin", days=2), {}),             # not in the enum
    (call("get_weather", days=2, city="Paris"), {}),                            # out of schema order
    (call("get_weather", city="Paris", days=2, where='{"x": 1, "y": 2}'), {}),  # $ref's additionalProperties
    (call("get_weather", city="Paris", days=2, detail="yes"), {}),              # not a boolean
    (call("lookup"), {}),                                                       # unknown function
    (call("note", text="x</parameter>y"), {}),                                  # a closing tag inside a text value
    (call("ping") + "\n" + call("ping"), {"parallel": False}),                  # a second call
    (call("ping"), {"name": "note"}),                                           # not the named function
    (call("note", text="x") + call("note", text="y"), {"name": "note"}),        # a named function: once
    (call("ping") + "\nDone.", {}),                                             # text after the calls
], ids=["text-before", "missing-required", "over-maximum", "not-integer", "over-maxLength", "not-in-enum",
        "out-of-order", "additional-property", "not-boolean", "unknown-function", "closing-tag-in-text",
        "second-call", "not-the-named", "named-twice", "text-after"])
def test_malformed_calls_are_refused(text, kw):
    n, total, final = run(text, **kw)
    assert n < total and final is None


def test_random_walks_over_the_masks_give_valid_calls():
    """Sample uniformly among the tokens the mask allows (a stand-in for a random model) until the
    grammar is complete: every walk that completes parses into one valid call."""
    tools = (TOOLS[0], {"type": "function", "function": {"name": "ping", "parameters": {
        "type": "object", "properties": {}, "additionalProperties": False}}})
    rng = random.Random(0)
    completed = 0
    for _ in range(12):
        s = session(tools, parallel=False)
        tc = s.token_constraint
        row = np.zeros(tc.num_words, dtype=np.int32)
        ids: list[int] = []
        while not tc.done and len(ids) < 200:
            tc.fill_mask(row.ctypes.data_as(ctypes.c_void_p).value, row.nbytes)
            allowed = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little"))
            tok = int(rng.choice(allowed))
            assert tc.advance([tok]) == 1
            ids.append(tok)
        if not tc.done:
            continue
        completed += 1
        s.commit(s.preview(ids + [IM_END]))
        final = s.finish()[1]
        assert_valid_calls(final, 1)
    assert completed >= 6


def test_a_keyword_the_library_cannot_enforce_does_not_refuse_the_tool():
    tool = {"type": "function", "function": {"name": "tag", "parameters": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}}}}
    fe().compile_constraint(fe().tool_call_constraint([tool]))
    n, total, final = run(call("tag", tags="[1, 2]"), tools=[tool])
    assert n == total and json.loads(final.tool_calls[0].arguments) == {"tags": [1, 2]}


def test_names_the_format_cannot_carry_are_refused():
    with pytest.raises(ToolGrammarError, match="function name"):
        tool_call_grammar([{"type": "function", "function": {"name": "a>b"}}])
    bad = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a\nb": {"type": "string"}}, "required": ["a\nb"]}}}
    with pytest.raises(ToolGrammarError, match="parameter name"):
        tool_call_grammar([bad])
    with pytest.raises(ToolGrammarError, match="no tool is named"):
        tool_call_grammar(TOOLS, name="lookup")
