"""Server-sent event bodies of the streaming routes (`stream: true`): chat and completion chunks.

A stream sends its head chunks, one chunk per delta or final result of any choice (in arrival
order), an error envelope for a failed choice, the usage chunk when asked for, then [DONE]. When
the response closes, however it ends, its engine requests are closed (`end_stream`).
"""
from __future__ import annotations

import logging
from typing import AsyncIterator

from fastapi.responses import StreamingResponse

from ninfer.config import GenerationDelta, GenerationError, GenerationResult
from ninfer.gateway.http import responses as R
from ninfer.gateway.http.errors import from_engine_error
from ninfer.gateway.http.runs import Run, close_runs, first_error, merged_events
from ninfer.gateway.http.state import GatewayState

log = logging.getLogger("ninfer.gateway.http")


class SSEResponse(StreamingResponse):
    """Server-sent events; always closes the body iterator, then calls `on_close`.

    NOTE: `on_close` (not a `finally` inside the generator) gives the engine requests back: a
    client that leaves before the first chunk cancels the response before the generator starts,
    and closing a generator that never started does not run its `finally`.
    """
    media_type = "text/event-stream"

    def __init__(self, content, on_close) -> None:
        super().__init__(content)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    await aclose()
            finally:
                self.on_close()


def end_stream(state: GatewayState, runs: list[Run], rid: str) -> None:
    """SSEResponse's `on_close`: cancel what still runs and give every engine request back."""
    if any(r.final is None for r in runs):
        log.info("request %s: stream ended early (client disconnected?); cancelling", rid)
    close_runs(state, runs)


async def sse_events(runs: list[Run], head: list[bytes], render, usage_chunk) -> AsyncIterator[bytes]:
    """The SSE body of both endpoints: the `head` chunks, `render(run, event)` per Delta/Result
    (None: nothing to send), an error envelope per GenerationError, the usage chunk (when asked
    for and nothing failed), then [DONE]."""
    for b in head:
        yield b
    async for run, ev in merged_events(runs):
        out = R.sse(from_engine_error(ev).body()) if isinstance(ev, GenerationError) else render(run, ev)
        if out is not None:
            yield out
    if usage_chunk is not None and first_error(runs) is None:
        yield usage_chunk()
    yield R.SSE_DONE


def chat_stream(state: GatewayState, runs: list[Run], rid: str, created: int, model: str,
                plan, include_usage: bool) -> AsyncIterator[bytes]:
    max_calls = plan.tools.max_calls
    ordered = sorted(runs, key=lambda r: r.call.index)
    tool_calls_sent: dict[int, bool] = {}

    def chunk(choices: list[dict], usage: dict | None = None) -> bytes:
        return R.sse(R.chat_chunk(rid, model, created, choices, usage, with_usage_field=include_usage,
                                  fingerprint=state.fingerprint))

    def render(run: Run, ev) -> bytes | None:
        i = run.call.index
        if isinstance(ev, GenerationResult):
            reason = R.finish_reason(ev.finish_reason, tool_calls_sent.get(i, False) or bool(ev.tool_calls))
            return chunk([{"index": i, "delta": {}, "logprobs": None, "finish_reason": reason,
                           "stop_reason": None}])
        if not isinstance(ev, GenerationDelta):
            return None
        delta: dict = {}
        if ev.delta.reasoning:
            delta["reasoning_content"] = ev.delta.reasoning
        if ev.delta.text:
            delta["content"] = ev.delta.text
        calls = [d for d in ev.delta.tool_calls if max_calls is None or d.index < max_calls]
        if calls:
            delta["tool_calls"] = [R.tool_delta_json(d) for d in calls]
            tool_calls_sent[i] = True
        lp = R.chat_logprobs(state.pieces, ev.logprobs) if plan.logprobs and ev.logprobs else None
        if not (delta or lp):
            return None
        return chunk([{"index": i, "delta": delta, "logprobs": lp, "finish_reason": None}])

    head = [chunk([{"index": r.call.index, "delta": {"role": "assistant", "content": ""},
                    "logprobs": None, "finish_reason": None}]) for r in ordered]
    usage = None
    if include_usage:
        usage = lambda: chunk([], R.merge_usage([(0, r.final.usage) for r in ordered]))
    return sse_events(runs, head, render, usage)


def completion_stream(state: GatewayState, runs: list[Run], rid: str, created: int, model: str,
                      plan, want_logprobs: bool, include_usage: bool) -> AsyncIterator[bytes]:
    ordered = sorted(runs, key=lambda r: r.call.index)

    def chunk(choices: list[dict], usage: dict | None = None) -> bytes:
        return R.sse(R.completion_chunk(rid, model, created, choices, usage, with_usage_field=include_usage,
                                        fingerprint=state.fingerprint))

    def render(run: Run, ev) -> bytes | None:
        i = run.call.index
        if isinstance(ev, GenerationResult):
            return chunk([{"index": i, "text": "", "logprobs": None,
                           "finish_reason": R.finish_reason(ev.finish_reason, False), "stop_reason": None}])
        if not isinstance(ev, GenerationDelta):
            return None
        lp = None
        if want_logprobs and ev.logprobs:
            lp = R.completion_logprobs(state.pieces, ev.logprobs, run.text_offset)
        run.text_offset += len(ev.delta.text)
        if not (ev.delta.text or lp):
            return None
        return chunk([{"index": i, "text": ev.delta.text, "logprobs": lp, "finish_reason": None}])

    head = []
    for r in ordered:
        echo = plan.echo_texts[r.call.prompt_index]
        r.text_offset = len(echo)
        if echo:
            head.append(chunk([{"index": r.call.index, "text": echo, "logprobs": None, "finish_reason": None}]))
    usage = None
    if include_usage:
        usage = lambda: chunk([], R.merge_usage([(r.call.prompt_index, r.final.usage) for r in ordered]))
    return sse_events(runs, head, render, usage)
