"""POST /v1/chat/completions and /v1/completions.

  1. readiness, body, schema, model (`parsing.parse`)
  2. media_parts.py: image/video parts fetched and decoded under the server's MediaPolicy (400 naming
     the part); convert.py: messages/prompt -> PreparedPrompt, SamplingParams, OutputOptions, max_tokens;
     structured.py: the output constraint compiled off the event loop (400 naming the field)
  3. engine.submit per choice (`runs.submit_all`; n > 1: n requests)
  4. stream: an SSE body (`streams.py`); otherwise wait for every choice, then one response body
"""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import Response

from ninfer.gateway.http import responses as R
from ninfer.gateway.http.convert import plan_chat, plan_completion
from ninfer.gateway.http.echo import echo_choice, echo_usage
from ninfer.gateway.http.media_parts import acquire_async, call_with_media
from ninfer.gateway.http.parsing import parse
from ninfer.gateway.http.protocol import ChatCompletionRequest, CompletionRequest
from ninfer.gateway.http.runs import finished_runs, submit_all
from ninfer.gateway.http.structured import check_constraints
from ninfer.gateway.http.state import GatewayState
from ninfer.gateway.http.streams import SSEResponse, chat_stream, completion_stream, end_stream


def add_completion_routes(app: FastAPI, state: GatewayState) -> None:
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        engine, req = await parse(state, request, ChatCompletionRequest)
        media = await acquire_async(req.messages, state.media)
        plan = await call_with_media(media, plan_chat, engine.frontend, req, state.limits, media)
        await check_constraints(engine.frontend, plan.calls)
        rid, created, model_name = R.new_id("chatcmpl"), R.now(), state.model_name
        runs = submit_all(state, engine, plan.calls, rid)
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return SSEResponse(chat_stream(state, runs, rid, created, model_name, plan, include_usage),
                               on_close=lambda: end_stream(state, runs, rid))
        ordered = await finished_runs(request, state, runs, rid)
        if isinstance(ordered, Response):
            return ordered
        choices = [R.chat_choice(r.call.index, r.final, state.pieces, plan.logprobs, plan.tools.max_calls)
                   for r in ordered]
        usage = R.merge_usage([(0, r.final.usage) for r in ordered])
        return R.chat_response(rid, model_name, created, choices, usage, state.fingerprint)

    @app.post("/v1/completions")
    async def completions(request: Request):
        engine, req = await parse(state, request, CompletionRequest)
        plan = plan_completion(engine.frontend, req, state.limits)
        await check_constraints(engine.frontend, plan.calls)
        rid, created, model_name = R.new_id("cmpl"), R.now(), state.model_name
        runs = submit_all(state, engine, plan.calls, rid)
        want_logprobs = req.logprobs is not None
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return SSEResponse(completion_stream(state, runs, rid, created, model_name, plan,
                                                 want_logprobs, include_usage),
                               on_close=lambda: end_stream(state, runs, rid))
        ordered = await finished_runs(request, state, runs, rid)
        if isinstance(ordered, Response):
            return ordered
        choices = []
        for r in ordered:
            echo = plan.echo_texts[r.call.prompt_index]
            if r.call.prompt_logprobs is not None or r.call.discard_output:
                choices.append(echo_choice(r.call.index, echo, r.call.prompt.token_ids, r.final, state.pieces,
                                           r.call.discard_output))
            else:
                choices.append(R.completion_choice(r.call.index, echo + r.final.text, r.final, state.pieces,
                                                   want_logprobs))
        usage = R.merge_usage([(r.call.prompt_index, echo_usage(r.final, r.call.discard_output))
                               for r in ordered])
        return R.completion_response(rid, model_name, created, choices, usage, state.fingerprint)
