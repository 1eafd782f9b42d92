"""Controlled output over HTTP: the real `ninfer serve` (demo model, whose random text makes a constraint's
effect visible) driven by the official `openai` client. response_format (json_object, json_schema),
vLLM's guided_* fields and structured_outputs, on chat and completions, streamed and not, thinking on
(closed by a thinking budget) and off; enforced tool calls; every bad constraint a 400 naming its field;
a constraint the model cannot finish within max_tokens ends with finish_reason "length"."""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import openai
import pytest

from support.serve_util import serving

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
    with serving("--max-model-len", "1024", "--max-concurrency", "4") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)


def chat(client, stream: bool, **kw) -> tuple[str, str, str]:
    """(content, reasoning, finish_reason) of one chat completion, streamed or not."""
    _, content, reasoning, finish = tool_calls(client, stream, **{"seed": 3, "max_tokens": 80, **kw})
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


def tool_calls(client, stream: bool, **kw) -> tuple[list[tuple[str, dict]], str, str, str]:
    """([(name, arguments)], content, reasoning, finish_reason) of one chat completion with tools."""
    kw = {"model": MODEL, "messages": USER, "temperature": 1.0, "seed": 7, "max_tokens": 120, **kw}
    if not stream:
        c = client.chat.completions.create(**kw).choices[0]
        calls = [(t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls or ()]
        assert all(t.type == "function" and t.id for t in c.message.tool_calls or ())
        return calls, c.message.content or "", getattr(c.message, "reasoning_content", None) or "", c.finish_reason
    acc: dict[int, dict] = {}
    content, reasoning, finish = "", "", None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            finish = c.finish_reason or finish
            for d in c.delta.tool_calls or ():
                e = acc.setdefault(d.index, {"name": "", "arguments": ""})
                e["name"] += (d.function.name or "") if d.function else ""
                e["arguments"] += (d.function.arguments or "") if d.function else ""
    return [(e["name"], json.loads(e["arguments"])) for _, e in sorted(acc.items())], content, reasoning, finish


def is_person(text: str) -> bool:
    jsonschema.validate(json.loads(text), PERSON)
    return True


def starts_an_object(text: str, finish: str) -> bool:
    """Any JSON object: the random model seldom closes a string, so an answer cut by max_tokens is
    checked as an object's beginning."""
    return isinstance(json.loads(text), dict) if finish == "stop" else text.startswith("{")


OFF, ON = THINK_OFF, THINK_BUDGET
REQUIRED = {"tools": [WEATHER, CLOCK], "tool_choice": "required", "parallel_tool_calls": False}
NAMED = {"tools": [WEATHER, CLOCK], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
# name -> (route, stream, extra body, check(answer, finish)); every kind on both routes, streamed and not,
# thinking on and off, all sent at once (one batch, with an unconstrained row)
JOBS = {
    "json_schema": ("chat", False, {**ON, "response_format": {"type": "json_schema", "json_schema": {
        "name": "person", "schema": PERSON, "strict": True}}}, lambda t, f: f == "stop" and is_person(t)),
    "guided_json": ("chat", True, {**OFF, "guided_json": PERSON}, lambda t, f: f == "stop" and is_person(t)),
    "json_object": ("chat", True, {**ON, "response_format": {"type": "json_object"}, "max_tokens": 30},
                    starts_an_object),
    "guided_regex": ("chat", False, {**OFF, "guided_regex": REGEX},
                     lambda t, f: f == "stop" and re.fullmatch(REGEX, t)),
    "guided_choice": ("chat", True, {**ON, "guided_choice": CHOICES}, lambda t, f: f == "stop" and t in CHOICES),
    "guided_grammar": ("chat", False, {**ON, "guided_grammar": GBNF},
                       lambda t, f: f == "stop" and re.fullmatch(r"(hello|hi) (alice|bob)", t)),
    "lark_grammar": ("chat", True, {**OFF, "structured_outputs": {"grammar": LARK}},
                     lambda t, f: f == "stop" and re.fullmatch(r"(up|down) [0-9]{1,3}", t)),
    "completion_regex": ("completion", True, {"guided_regex": REGEX},
                         lambda t, f: f == "stop" and re.fullmatch(REGEX, t)),
    "completion_schema": ("completion", False, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "p", "schema": PERSON}}}, lambda t, f: f == "stop" and is_person(t)),
    # a constraint the model cannot finish within max_tokens
    "too_long": ("chat", True, {**OFF, "guided_regex": "x{64}", "max_tokens": 4},
                 lambda t, f: f == "length" and re.fullmatch("x+", t) and len(t) < 64),
    "free": ("chat", False, {**OFF, "max_tokens": 6, "ignore_eos": True}, lambda t, f: f == "length" and t),
    # enforced tool calls (answer = the calls)
    "required_think": ("tools", True, {**ON, **REQUIRED}, None),
    "named": ("tools", False, {**OFF, **NAMED}, "get_time"),
}


def run_job(client, name: str):
    route, stream, extra, _ = JOBS[name]
    extra = dict(extra)
    kw = {"max_tokens": extra.pop("max_tokens", 80)}
    for key in ("tools", "tool_choice", "parallel_tool_calls"):
        if key in extra:
            kw[key] = extra.pop(key)
    if route == "chat":
        return chat(client, stream, **kw, extra_body=extra)
    if route == "tools":
        return tool_calls(client, stream, **kw, extra_body=extra)
    text, finish = complete(client, stream, **kw, extra_body=extra)
    return text, "", finish


def test_answers_match_their_constraint(client):
    with ThreadPoolExecutor(len(JOBS)) as pool:
        results = dict(zip(JOBS, pool.map(lambda name: run_job(client, name), JOBS)))
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CLOCK)}
    for name, result in results.items():
        route, _, extra, check = JOBS[name]
        if route == "tools":
            calls, content, reasoning, finish = result
            assert finish == "tool_calls" and content == "" and len(calls) == 1, (name, result)
            (fn, args), = calls
            assert check in (None, fn), (name, result)
            jsonschema.validate(args, schemas[fn])
        else:
            answer, reasoning, finish = result
            assert check(answer, finish), (name, answer, finish)
        assert bool(reasoning) == ("thinking_budget" in extra), (name, result)


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
    ({"structured_outputs": {"grammar": "root ::= undefined"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs.choice"),
    ({"structured_outputs": {"structural_tag": {"x": 1}}}, "structured_outputs.structural_tag"),
    ({"guided_json": {"type": "object"}, "guided_whitespace_pattern": " *"}, "guided_whitespace_pattern"),
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
        for i, (body, param) in enumerate(cases):
            for stream in (False, True) if i < 2 else (i % 2 == 1,):
                r = httpx.post(server.base + route, json={**base, **body, "max_tokens": 4, "stream": stream},
                               timeout=60)
                assert r.status_code == 400, (route, body, r.text)
                err = r.json()["error"]
                assert err["param"] == param and err["type"] == "invalid_request_error", (route, body, err)
