"""A tool call end to end on a real server (the SIGTERM drain: test_prefix_reuse_http.py).

The model is a scripted artifact (tests/support/serve_util.py: build_tool_script_artifact): the demo weights
rewired so that after a chat prompt the model emits, at any temperature,
    <tool_call><function=get_weather><parameter=city>Paris</parameter></function></tool_call><|im_end|>
Everything else is the real path: chat template with tools, Program, Engine, the Frontend's tool
parser, the Gateway's typed `tool_calls` and streamed tool-call deltas.
"""
from __future__ import annotations

import json

import openai
import pytest

from support.scratch import scratch_dir
from support.serve_util import Server, build_tool_script_artifact

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    with scratch_dir(tmp_path_factory, "tool-script") as d:
        path = d / "tool-script.ninfer"
        build_tool_script_artifact(path)
        yield path


@pytest.fixture(scope="module")
def server(artifact):
    s = Server(str(artifact), "--served-model-name", "scripted", "--max-model-len", "2048",
               "--drain-timeout-s", "3")
    try:
        s.wait_ready()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("think", [False, True])
def test_tool_call(client, think):
    r = client.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], temperature=0.8,
                                       max_tokens=64, extra_body={"chat_template_kwargs": {"enable_thinking": think}})
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert not choice.message.content
    assert r.usage.completion_tokens == 19


def test_tool_call_streamed(client):
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], max_tokens=64,
                                                stream=True):
        for c in chunk.choices:
            finish = c.finish_reason or finish
            for d in c.delta.tool_calls or ():
                entry = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = d.id or entry["id"]
                if d.function and d.function.name:
                    entry["name"] += d.function.name
                if d.function and d.function.arguments:
                    entry["arguments"] += d.function.arguments
    assert finish == "tool_calls"
    assert list(calls) == [0] and calls[0]["id"] and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}


def test_tool_choice_none_and_history(client):
    # tool_choice="none": no tools in the prompt and no parsing; the scripted text comes back as content
    r = client.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], tool_choice="none",
                                       max_tokens=64, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].finish_reason == "stop" and not r.choices[0].message.tool_calls
    assert "<function=get_weather>" in r.choices[0].message.content
    # a conversation carrying the call and the tool's answer renders and runs
    first = client.chat.completions.create(model="scripted", messages=ASK, tools=[WEATHER], max_tokens=64)
    call = first.choices[0].message.tool_calls[0]
    history = ASK + [
        {"role": "assistant", "content": None, "reasoning_content": "I should call the tool.",
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "{\"sky\": \"sunny\"}"}]
    # NOTE: tool_choice "auto": the scripted chain writes its call without the template's newlines, which an
    #       enforced choice's grammar refuses (enforcement: test_constrained_http.py)
    again = client.chat.completions.create(model="scripted", messages=history, tools=[WEATHER], max_tokens=64,
                                           tool_choice="auto")
    assert again.choices[0].finish_reason == "tool_calls"
    assert again.usage.prompt_tokens > first.usage.prompt_tokens
