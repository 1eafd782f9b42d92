"""Controlled output over HTTP: the real `ninfer serve` (demo model, whose random text makes a constraint's
effect visible) driven by the official `openai` client. response_format (json_object, json_schema),
vLLM's guided_* fields and structured_outputs, on chat and completions, streamed and not, thinking on
(closed by a thinking budget) and off; enforced tool calls; every bad constraint a 400 naming its field;
a constraint the model cannot finish within max_tokens ends with finish_reason "length"."""
from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest

from support.serve_util import Server

MODEL = "ninfer-demo"
USER = [{"role": "user", "content": "Describe a person."}]
THINK_OFF = {"chat_template_kwargs": {"enable_thinking": False}}
THINK_BUDGET = {"thinking_budget": 3}          # thinking on; the random model's reasoning is closed after 3 tokens
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 6},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 2}}}
REGEX = r"[a-z]{2,5}-[0-9]{2}"
CHOICES = ["yes", "no", "maybe"]
GBNF = 'root ::= greeting " " name\ngreeting ::= "hello" | "hi"\nname ::= "alice" | "bob"'
LARK = 'start: ("up" | "down") " " NUM\nNUM: /[0-9]{1,3}/'
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "required": ["city", "days"],
    "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7},
                   "metric": {"type": "boolean"}}}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "required": ["zone"], "properties": {"zone": {"type": "string", "maxLength": 4}}}}}


@pytest.fixture(scope="module")
def server():
    s = Server("--max-model-len", "1024", "--max-concurrency", "4")
    try:
        s.wait_ready()
        yield s
    finally:
        assert s.stop() == 0, s.log_text()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat(client, stream: bool, **kw) -> tuple[str, str, str]:
    """(content, reasoning, finish_reason) of one chat completion, streamed or not."""
    kw = {"model": MODEL, "messages": USER, "temperature": 1.0, "seed": 3, "max_tokens": 80, **kw}
    if not stream:
        c = client.chat.completions.create(**kw).choices[0]
        return c.message.content or "", getattr(c.message, "reasoning_content", None) or "", c.finish_reason
    content, reasoning, finish = "", "", None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            finish = c.finish_reason or finish
    return content, reasoning, finish


def complete(client, stream: bool, **kw) -> tuple[str, str]:
    kw = {"model": MODEL, "prompt": "The answer:", "temperature": 1.0, "seed": 5, "max_tokens": 80, **kw}
    if not stream:
        c = client.completions.create(**kw).choices[0]
        return c.text, c.finish_reason
    text, finish = "", None
    for chunk in client.completions.create(**kw, stream=True):
        for c in chunk.choices:
            text += c.text
            finish = c.finish_reason or finish
    return text, finish


def is_person(text: str) -> bool:
    jsonschema.validate(json.loads(text), PERSON)
    return True


def is_object(text: str) -> bool:
    return isinstance(json.loads(text), dict)


# (extra body, check of the answer)
CASES = {
    "json_schema": ({"response_format": {"type": "json_schema",
                                         "json_schema": {"name": "person", "schema": PERSON, "strict": True}}},
                    is_person),
    "guided_json": ({"guided_json": PERSON}, is_person),
    "json_object": ({"response_format": {"type": "json_object"}, "max_tokens": 200}, is_object),
    "guided_regex": ({"guided_regex": REGEX}, lambda t: re.fullmatch(REGEX, t) is not None),
    "guided_choice": ({"guided_choice": CHOICES}, lambda t: t in CHOICES),
    "guided_grammar": ({"guided_grammar": GBNF}, lambda t: re.fullmatch(r"(hello|hi) (alice|bob)", t) is not None),
    "lark_grammar": ({"structured_outputs": {"grammar": LARK}},
                     lambda t: re.fullmatch(r"(up|down) [0-9]{1,3}", t) is not None),
    "structured_choice": ({"structured_outputs": {"choice": CHOICES}}, lambda t: t in CHOICES),
}


@pytest.mark.parametrize("name", list(CASES))
def test_chat_answers_match_their_constraint(client, name):
    extra, check = CASES[name]
    extra = dict(extra)
    max_tokens = extra.pop("max_tokens", 80)
    for stream, think in ((False, THINK_OFF), (True, THINK_OFF), (False, THINK_BUDGET), (True, THINK_BUDGET)):
        content, reasoning, finish = chat(client, stream, max_tokens=max_tokens, extra_body={**extra, **think})
        assert finish == "stop" and check(content), (name, stream, think, content, finish)
        assert bool(reasoning) == (think is THINK_BUDGET)


def test_completions_answers_match_their_constraint(client):
    for stream in (False, True):
        text, finish = complete(client, stream, extra_body={"guided_regex": REGEX})
        assert finish == "stop" and re.fullmatch(REGEX, text), text
        text, finish = complete(client, stream, extra_body={
            "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}})
        assert finish == "stop" and is_person(text)
        text, finish = complete(client, stream, extra_body={"structured_outputs": {"choice": CHOICES}})
        assert finish == "stop" and text in CHOICES


def test_a_constraint_longer_than_max_tokens_ends_with_length(client):
    content, _, finish = chat(client, False, max_tokens=4, extra_body={"guided_regex": "x{64}", **THINK_OFF})
    assert finish == "length" and re.fullmatch("x*", content) and 0 < len(content) < 64
    text, finish = complete(client, True, max_tokens=3, extra_body={"guided_regex": "[0-9]{40}"})
    assert finish == "length" and re.fullmatch("[0-9]+", text)


def tool_calls(client, stream: bool, **kw) -> tuple[list[tuple[str, dict]], str, str]:
    """([(name, arguments)], content, finish_reason) of one chat completion with tools."""
    kw = {"model": MODEL, "messages": USER, "temperature": 1.0, "seed": 7, "max_tokens": 120, **kw}
    if not stream:
        c = client.chat.completions.create(**kw).choices[0]
        calls = [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls or ()]
        assert all(t.type == "function" and t.id for t in c.message.tool_calls or ())
        return calls, c.message.content or "", c.finish_reason
    acc: dict[int, dict] = {}
    content, finish = "", None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            finish = c.finish_reason or finish
            for d in c.delta.tool_calls or ():
                e = acc.setdefault(d.index, {"name": "", "arguments": ""})
                e["name"] += (d.function.name or "") if d.function else ""
                e["arguments"] += (d.function.arguments or "") if d.function else ""
    return [(e["name"], json.loads(e["arguments"])) for _, e in sorted(acc.items())], content, finish


def test_tool_choice_required_and_named_are_enforced(client):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CLOCK)}
    runs = [({"tool_choice": "required", "parallel_tool_calls": False}, None),
            ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "get_time"),
            ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "get_weather")]
    for (choice, name), stream, think in zip(runs * 2, (False, True, False, True, False, True),
                                             (THINK_OFF, THINK_OFF, THINK_BUDGET, THINK_BUDGET, THINK_OFF,
                                              THINK_BUDGET)):
        calls, content, finish = tool_calls(client, stream, tools=[WEATHER, CLOCK], **choice, extra_body=think)
        assert finish == "tool_calls" and not content.strip() and len(calls) == 1, (choice, calls, content, finish)
        (fn, args), = calls
        assert name in (None, fn)
        jsonschema.validate(args, schemas[fn])


def test_tool_choice_auto_stays_free(client):
    _, content, finish = tool_calls(client, False, tools=[WEATHER], tool_choice="auto", max_tokens=8,
                                    extra_body=THINK_OFF)
    assert finish == "length" and content


# (request body without messages/prompt, the param the 400 names)
BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "banana"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"if": {}, "then": {}}}}},
     "response_format.json_schema.schema"),                                # an unsupported keyword
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_json": {"type": "string", "pattern": "(("}}, "guided_json"),
    ({"guided_regex": "(ab"}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": "yes"}, "guided_choice"),
    ({"guided_grammar": "start: undefined_rule"}, "guided_grammar"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice"),
    ({"structured_outputs": {"structural_tag": {"x": 1}}}, "structured_outputs.structural_tag"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex"),
]


def test_bad_constraints_are_400_naming_the_field(server):
    tools = {"tools": [WEATHER], "tool_choice": "required"}
    chat_bad = BAD + [({**tools, "response_format": {"type": "json_object"}}, "tool_choice"),
                      ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
                          "type": "object", "properties": {"a": {"type": "integer", "minimum": "x"}}}}}],
                        "tool_choice": "required"}, "tool_choice")]
    for route, base, cases in (("/v1/chat/completions", {"messages": USER}, chat_bad),
                               ("/v1/completions", {"prompt": "x"}, BAD)):
        for body, param in cases:
            for stream in (False, True):
                r = httpx.post(server.base + route, json={**base, **body, "max_tokens": 4, "stream": stream},
                               timeout=60)
                assert r.status_code == 400, (route, body, r.text)
                err = r.json()["error"]
                assert err["param"] == param and err["type"] == "invalid_request_error", (route, body, err)
