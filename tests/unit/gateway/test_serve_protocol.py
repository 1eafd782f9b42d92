"""Unit tests of the HTTP protocol layer: schemas, error envelope, conversion, response shapes,
metrics rendering. No server, no model (the real Qwen3.6 Frontend is used for conversion)."""
from __future__ import annotations

import pytest

from ninfer.gateway.http import responses as R
from ninfer.gateway.http.convert import ModelLimits, frontend_messages, plan_chat, plan_completion
from ninfer.gateway.http.errors import APIError, from_engine_error, from_validation_error
from ninfer.gateway.http.metrics import EngineCollector, make_registry, render
from ninfer.gateway.http.protocol import ChatCompletionRequest, CompletionRequest
from ninfer.config import (Availability, AvailabilityState, EngineMetrics, ErrorKind, FinishReason,
                          GenerationError, GenerationResult, HistogramSnapshot, TokenLogprob, ToolCall, Usage)

LIMITS = ModelLimits(max_model_len=1024, vocab_size=248077)
USER = [{"role": "user", "content": "Hello"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "weather of a city",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}


@pytest.fixture(scope="module")
def frontend():
    from ninfer.targets.qwen3_6.frontend import Qwen36Frontend
    return Qwen36Frontend.builtin()


def chat(**kw) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": USER, **kw})


def invalid(model, body) -> APIError:
    from pydantic import ValidationError
    with pytest.raises(ValidationError) as e:
        model.model_validate(body)
    return from_validation_error(e.value)


@pytest.mark.parametrize("body,param", [
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}, "messages[0].content[0].text"),
    ({"messages": USER, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"messages": USER, "n": 0}, "n"),
    ({"messages": USER, "max_tokens": -1}, "max_tokens"),
    ({"messages": USER, "temperature": "hot"}, "temperature"),
    ({"messages": USER, "tool_choice": {"type": "function"}}, "tool_choice.function"),
    ({"messages": []}, "messages"),
    ({}, "messages"),
    ({"messages": USER, "stop": [""]}, "stop"),
    ({"messages": USER, "logit_bias": {"abc": 1}}, "logit_bias"),
])
def test_validation_errors_name_the_field(body, param):
    err = invalid(ChatCompletionRequest, body)
    assert err.status == 400
    assert err.param == param
    assert f"`{param}`" in err.message
    assert set(err.body()["error"]) == {"message", "type", "param", "code"}


def test_completion_prompt_shapes_and_errors():
    for p in ["hi", ["a", "b"], [1, 2, 3], [[1, 2], [3]]]:
        assert CompletionRequest.model_validate({"prompt": p}).prompt == p
    assert invalid(CompletionRequest, {"prompt": []}).param == "prompt"
    assert invalid(CompletionRequest, {"prompt": "x", "logprobs": 21}).param == "logprobs"
    assert invalid(CompletionRequest, {"prompt": "x", "stream_options": {"include_usage": True}}).status == 400


def test_engine_error_statuses():
    cases = {ErrorKind.OVERLOADED: 429, ErrorKind.NOT_READY: 503, ErrorKind.INVALID_REQUEST: 400,
             ErrorKind.QUEUE_TIMEOUT: 503, ErrorKind.ENGINE_FAILED: 500}
    for kind, status in cases.items():
        err = from_engine_error(GenerationError("r", kind, "why"))
        assert err.status == status and err.body()["error"]["message"] == "why"


def test_plan_chat_sampling_and_n(frontend):
    plan = plan_chat(frontend, chat(n=3, seed=7, temperature=0.5, top_k=-1, max_tokens=5, stop="END",
                                    logprobs=True, top_logprobs=2, logit_bias={"42": 5}), LIMITS)
    assert [c.index for c in plan.calls] == [0, 1, 2]
    assert [c.sampling.seed for c in plan.calls] == [7, 8, 9]
    s = plan.calls[0].sampling
    assert (s.temperature, s.top_k, s.logprobs, s.logit_bias) == (0.5, 0, 2, ((42, 5.0),))
    assert plan.calls[0].max_tokens == 5 and plan.calls[0].output.stop == ("END",)
    assert plan.calls[0].output.parse_reasoning and not plan.calls[0].output.parse_tool_calls
    # no max_tokens: whatever room the context leaves
    p = plan_chat(frontend, chat(), LIMITS).calls[0]
    assert p.max_tokens == LIMITS.max_model_len - p.prompt.num_prompt_tokens


def test_plan_chat_context_limit(frontend):
    with pytest.raises(APIError) as e:
        plan_chat(frontend, chat(max_tokens=1020), LIMITS)
    assert e.value.status == 400 and e.value.param == "max_tokens" and e.value.code == "context_length_exceeded"
    long = [{"role": "user", "content": "word " * 1500}]
    with pytest.raises(APIError) as e:
        plan_chat(frontend, ChatCompletionRequest.model_validate({"messages": long}), LIMITS)
    assert e.value.status == 400 and e.value.param == "messages"


def test_tool_choice_modes(frontend):
    auto = plan_chat(frontend, chat(tools=[TOOL]), LIMITS)
    assert auto.tools.parse and auto.tools.instruction is None and auto.calls[0].output.tools == (TOOL,)
    none = plan_chat(frontend, chat(tools=[TOOL], tool_choice="none"), LIMITS)
    assert not none.tools.parse and none.calls[0].output.tools == ()
    assert none.calls[0].prompt.num_prompt_tokens < auto.calls[0].prompt.num_prompt_tokens   # tools not shown
    req = plan_chat(frontend, chat(tools=[TOOL], tool_choice="required"), LIMITS)
    named = plan_chat(frontend, chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}}),
                      LIMITS)
    for plan in (req, named):
        text = frontend.tokenizer.decode(plan.calls[0].prompt.token_ids, skip_special_tokens=False)
        assert plan.tools.parse and plan.tools.instruction in text
    with pytest.raises(APIError) as e:
        plan_chat(frontend, chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "nope"}}), LIMITS)
    assert e.value.param == "tool_choice.function.name"
    with pytest.raises(APIError) as e:
        plan_chat(frontend, chat(tool_choice="required"), LIMITS)
    assert e.value.param == "tool_choice"
    assert plan_chat(frontend, chat(tools=[TOOL], parallel_tool_calls=False), LIMITS).tools.max_calls == 1


def test_history_with_reasoning_and_tool_calls(frontend):
    msgs = ChatCompletionRequest.model_validate({"messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "weather"}, {"type": "text", "text": "in Paris?"}]},
        {"role": "assistant", "content": None, "reasoning_content": "call the tool",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]}).messages
    out = frontend_messages(msgs)
    assert out[0]["role"] == "system" and out[1]["content"] == "weather\nin Paris?"
    assert out[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    plan = plan_chat(frontend, ChatCompletionRequest.model_validate(
        {"messages": [m.model_dump(exclude_none=True) for m in msgs], "tools": [TOOL]}), LIMITS)
    text = frontend.tokenizer.decode(plan.calls[0].prompt.token_ids, skip_special_tokens=False)
    assert "<parameter=city>\nParis\n</parameter>" in text and "<tool_response>\nsunny\n</tool_response>" in text
    bad = ChatCompletionRequest.model_validate({"messages": [
        {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]})
    with pytest.raises(APIError) as e:
        plan_chat(frontend, bad, LIMITS)
    assert e.value.param == "messages[0].tool_calls[0].function.arguments"
    image = ChatCompletionRequest.model_validate({"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]})
    with pytest.raises(APIError) as e:
        plan_chat(frontend, image, LIMITS)
    assert e.value.param == "messages[0].content[0].type"


def test_plan_completion_prompts_and_indices(frontend):
    plan = plan_completion(frontend, CompletionRequest.model_validate({"prompt": ["a", "b"], "n": 2, "seed": 1}),
                           LIMITS)
    assert [(c.index, c.prompt_index, c.sampling.seed) for c in plan.calls] == [(0, 0, 1), (1, 0, 2), (2, 1, 1), (3, 1, 2)]
    assert plan.calls[0].max_tokens == 16 and not plan.calls[0].output.parse_reasoning
    hello = frontend.tokenizer.encode("Hello,")
    ids = plan_completion(frontend, CompletionRequest.model_validate({"prompt": hello, "echo": True}), LIMITS)
    assert ids.calls[0].prompt.token_ids == tuple(hello) and ids.echo_texts == ("Hello,",)
    with pytest.raises(APIError) as e:
        plan_completion(frontend, CompletionRequest.model_validate({"prompt": [[1], [300000]]}), LIMITS)
    assert e.value.param == "prompt[1][0]"


def test_logprob_shapes(frontend):
    pieces = R.TokenPieces(frontend.tokenizer)
    (hello,), (dot,), (comma,) = (frontend.tokenizer.encode(t) for t in ("Hello", ".", ","))
    lp = (TokenLogprob(hello, -0.5, ((hello, -0.5), (dot, -1.0))),
          TokenLogprob(248046, -0.1, ((248046, -0.1), (comma, -3.0))))
    c = R.chat_logprobs(pieces, lp)["content"]
    assert c[0]["token"] == "Hello" and c[0]["bytes"] == list(b"Hello") and len(c[0]["top_logprobs"]) == 2
    assert c[1]["token"] == "<|im_end|>" and c[1]["top_logprobs"][1] == {"token": ",", "logprob": -3.0, "bytes": [44]}
    legacy = R.completion_logprobs(pieces, lp, offset=3)
    assert legacy["tokens"] == ["Hello", "<|im_end|>"] and legacy["text_offset"] == [3, 8]
    assert legacy["token_logprobs"] == [-0.5, -0.1] and legacy["top_logprobs"][0] == {"Hello": -0.5, ".": -1.0}


def test_usage_and_choice_shapes():
    u = Usage(num_prompt_tokens=10, num_output_tokens=4, num_reused_tokens=6, num_reasoning_tokens=3)
    merged = R.merge_usage([(0, u), (0, u), (1, u)])
    assert merged == {"prompt_tokens": 20, "completion_tokens": 12, "total_tokens": 32,
                      "prompt_tokens_details": {"cached_tokens": 12},
                      "completion_tokens_details": {"reasoning_tokens": 9}}
    calls = (ToolCall("c1", "f", "{}"), ToolCall("c2", "g", "{}"))
    res = GenerationResult("r", "", "thought", calls, (1, 2), FinishReason.TOOL_CALLS, u)
    choice = R.chat_choice(0, res, None, False, max_calls=1)
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["reasoning_content"] == "thought"
    assert [c["id"] for c in choice["message"]["tool_calls"]] == ["c1"]
    assert R.sse({"a": 1}) == b'data: {"a":1}\n\n' and R.SSE_DONE == b"data: [DONE]\n\n"


def _metrics(**kw) -> EngineMetrics:
    h = HistogramSnapshot(bounds=(0.1, 1.0), counts=(1, 2), sum=1.5, count=3)
    base = dict(availability=Availability(AvailabilityState.READY), running=2, waiting=1, max_concurrency=4,
                queue_size=8, outstanding=3, outstanding_capacity=12, outstanding_capacity_free=9,
                pages_total=100, pages_free=75, slots_total=4, slots_free=2, page_size=16,
                num_requests_submitted=5, num_requests_rejected={"overloaded": 2}, num_prompt_tokens=40,
                num_reused_tokens=8, num_generation_tokens=30, num_finished={"stop": 1, "cancelled": 1},
                num_errors={}, num_prefill_units=3, num_decode_rounds=9, num_control_units=0,
                queue_time_s=h, ttft_s=h, inter_token_s=h, e2e_s=h, decode_batch_size=h)
    base.update(kw)
    return EngineMetrics(**base)


def test_metrics_text():
    from support.serve_util import metric

    text = render(make_registry(EngineCollector(_metrics, "m", lambda: ("ready", True)))).decode()
    assert metric(text, "ninfer:num_requests_running") == 2
    assert metric(text, "ninfer:num_requests_waiting") == 1
    assert metric(text, "ninfer:kv_cache_usage_perc") == 0.25
    assert metric(text, "ninfer:state_slot_usage_perc") == 0.5
    assert metric(text, "ninfer:generation_tokens_total") == 30
    assert metric(text, "ninfer:prompt_tokens_total") == 40
    assert metric(text, "ninfer:request_success_total", finished_reason="abort") == 1
    assert metric(text, "ninfer:request_rejected_total", kind="overloaded") == 2
    assert metric(text, "ninfer:time_to_first_token_seconds_bucket", le="1.0") == 2
    assert metric(text, "ninfer:e2e_request_latency_seconds_count") == 3
    starting = render(make_registry(EngineCollector(lambda: None, "m", lambda: ("starting", False)))).decode()
    assert metric(starting, "ninfer:engine_ready", state="starting") == 0
    assert "ninfer:num_requests_running" not in starting
