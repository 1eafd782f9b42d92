"""The OpenAI-compatible HTTP Gateway (FastAPI): routes, request flow, streaming, disconnects.

Request flow (one HTTP request):
  1. auth (Bearer key), readiness, body size, JSON, schema (400 naming the field), model (404)
  2. convert.py: messages/prompt -> PreparedPrompt, SamplingParams, OutputOptions, max_tokens
  3. engine.submit per choice (n > 1: n requests); a refusal at submit maps to 429/503/400
  4. events -> a response body, or SSE chunks; a client that goes away closes its handles,
     which cancels the requests and gives their capacity back
  5. one log line per engine request (id, tokens, TTFT, tokens/s, finish reason)
The Gateway never orders requests or touches cache/pages: it only submits, reads and cancels.
"""
from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ninfer.gateway.http import responses as R
from ninfer.gateway.http.convert import (EngineCall, ModelLimits, frontend_call, frontend_messages, plan_chat,
                                  plan_completion)
from ninfer.gateway.http.echo import echo_choice, echo_usage
from ninfer.gateway.http.errors import (APIError, bad_request, body_too_large, from_engine_error,
                                 from_validation_error, internal_error, model_not_found, not_ready,
                                 unauthorized)
from ninfer.gateway.http.metrics import CONTENT_TYPE, EngineCollector, make_registry, render
from ninfer.gateway.http.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest,
                                   TokenizeRequest)
from ninfer.config import (EngineRequestError, GenerationDelta, GenerationError, GenerationResult,
                          GenerationStart)

log = logging.getLogger("ninfer.gateway.http")

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
SYNTHETIC_FINGERPRINT = "ninfer-synthetic-weights"
SYNTHETIC_HEADER = (b"x-ninfer-synthetic-weights", b"true")


@dataclass
class GatewayState:
    """What the routes share. `engine` is None until it is built (health says "starting")."""
    model_name: str
    api_key: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    engine: object | None = None
    pieces: R.TokenPieces | None = None
    startup_error: str | None = None
    draining: bool = False
    created: int = field(default_factory=R.now)
    inflight: set = field(default_factory=set)       # open GenerationHandles (drain cancels them)
    synthetic: bool = False                          # dummy weights: every response says so
    warming: bool = False                            # the serve warmup runs (health: starting)

    @property
    def fingerprint(self) -> str | None:
        """`system_fingerprint` of every completion: set only for synthetic (dummy) weights."""
        return SYNTHETIC_FINGERPRINT if self.synthetic else None

    def attach(self, engine) -> None:
        self.pieces = R.TokenPieces(engine.frontend.tokenizer)
        self.engine = engine

    @property
    def limits(self) -> ModelLimits | None:
        # NOTE: read each time: the Engine lowers max_model_len to Program's limit once it is ready.
        if self.engine is None:
            return None
        frontend = self.engine.frontend
        return ModelLimits(max_model_len=int(self.engine.max_model_len),
                           vocab_size=int(frontend.tokenizer.vocab_size),
                           sampling_defaults=getattr(frontend, "sampling_defaults", {}))

    def availability(self) -> tuple[str, bool, str]:
        """(state, ready, reason) as the Gateway reports it."""
        if self.draining:
            return "shutting_down", False, "the server is draining (SIGTERM)"
        if self.engine is None:
            if self.startup_error:
                return "failed", False, self.startup_error
            return "starting", False, "the engine is loading the model"
        a = self.engine.availability
        if a.ready and self.warming:
            return "starting", False, "warming up (first compiles and graph captures)"
        return a.state.value, a.ready, a.reason or a.state.value

    def ready_engine(self):
        state, ready, reason = self.availability()
        if not ready:
            raise not_ready(f"{state} ({reason})" if reason != state else state)
        return self.engine


# ---------------------------------------------------------------------------------------------
# Request helpers
# ---------------------------------------------------------------------------------------------
async def read_json(request: Request, limit: int) -> object:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise body_too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"Malformed JSON body: {e}", code="invalid_json") from None


def validate(model: type[BaseModel], obj: object) -> BaseModel:
    if not isinstance(obj, dict):
        raise bad_request("The request body must be a JSON object")
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        raise from_validation_error(e) from None


class ClientGone(Exception):
    """The HTTP client disconnected before its response was complete."""


async def until_disconnect(request: Request, aw, poll_s: float = 0.2):
    """Await `aw`; if the client disconnects first, cancel it and raise ClientGone."""
    task = asyncio.ensure_future(aw)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        if not task.done():
            task.cancel()


class Run:
    """One engine request of an HTTP request: its handle, progress and timings for the log line."""

    def __init__(self, call: EngineCall, handle, request_id: str):
        self.call = call
        self.handle = handle
        self.request_id = request_id
        self.t_submit = time.monotonic()
        self.t_first: float | None = None
        self.num_prompt_tokens = call.prompt.num_prompt_tokens
        self.num_reused_tokens = 0
        self.num_output_tokens = 0
        self.final: GenerationResult | GenerationError | None = None
        self.text_offset = 0                  # legacy logprobs text_offset in streamed text
        self.logged = False

    def observe(self, ev) -> None:
        if isinstance(ev, GenerationStart):
            self.num_prompt_tokens = ev.num_prompt_tokens
            self.num_reused_tokens = ev.num_reused_tokens
        elif isinstance(ev, GenerationDelta):
            if ev.token_ids and self.t_first is None:
                self.t_first = time.monotonic()
            self.num_output_tokens += len(ev.token_ids)
        elif isinstance(ev, (GenerationResult, GenerationError)):
            self.final = ev
            if ev.usage is not None:
                self.num_output_tokens = ev.usage.num_output_tokens
                self.num_reused_tokens = ev.usage.num_reused_tokens
            self.log_line()

    def log_line(self) -> None:
        self.logged = True
        end = time.monotonic()
        ttft = f"{self.t_first - self.t_submit:.3f}s" if self.t_first is not None else "-"
        elapsed = end - self.t_submit
        rate = self.num_output_tokens / elapsed if elapsed > 0 else 0.0
        if self.final is None:
            outcome = "finish=abort (client gone)"
        elif isinstance(self.final, GenerationError):
            outcome = f"error={self.final.kind.value}"
        else:
            outcome = f"finish={R.FINISH.get(self.final.finish_reason, self.final.finish_reason.value)}"
        log.info("request %s prompt_tokens=%d cached_tokens=%d output_tokens=%d ttft=%s tokens/s=%.1f "
                 "e2e=%.3fs %s", self.request_id, self.num_prompt_tokens, self.num_reused_tokens,
                 self.num_output_tokens, ttft, rate, elapsed, outcome)


def submit_all(state: GatewayState, engine, calls: tuple[EngineCall, ...], rid: str) -> list[Run]:
    runs: list[Run] = []
    try:
        for c in calls:
            request_id = rid if len(calls) == 1 else f"{rid}-{c.index}"
            kw = {} if c.prompt_logprobs is None else {"prompt_logprobs": c.prompt_logprobs}
            if c.session_id is not None:
                kw["session_id"] = c.session_id
            handle = engine.submit(c.prompt, c.sampling, max_tokens=c.max_tokens, output=c.output,
                                   request_id=request_id, **kw)
            state.inflight.add(handle)
            runs.append(Run(c, handle, request_id))
    except EngineRequestError as e:
        close_runs(state, runs, log_unfinished=False)
        log.info("request %s refused: %s", rid, e)
        raise from_engine_error(GenerationError(rid, e.kind, e.message)) from None
    except BaseException:
        close_runs(state, runs, log_unfinished=False)      # NOTE: choices already submitted give capacity back
        raise
    return runs


def close_runs(state: GatewayState, runs: list[Run], log_unfinished: bool = True) -> None:
    for r in runs:
        r.handle.close()            # cancels a request that has not ended; releases the consumer side
        state.inflight.discard(r.handle)
        if log_unfinished and r.final is None and not r.logged:
            r.log_line()


async def merged_events(runs: list[Run]) -> AsyncIterator[tuple[Run, object]]:
    """Events of several runs in arrival order, until every run has its final event."""
    if len(runs) == 1:
        run = runs[0]
        async for ev in run.handle:
            run.observe(ev)
            yield run, ev
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(run: Run) -> None:
        async for ev in run.handle:
            await queue.put((run, ev))

    tasks = [asyncio.ensure_future(pump(r)) for r in runs]
    try:
        remaining = len(runs)
        while remaining:
            run, ev = await queue.get()
            run.observe(ev)
            if isinstance(ev, (GenerationResult, GenerationError)):
                remaining -= 1
            yield run, ev
    finally:
        for t in tasks:
            t.cancel()


async def collect(runs: list[Run]) -> None:
    async for _ in merged_events(runs):
        pass


def first_error(runs: list[Run]) -> GenerationError | None:
    for r in sorted(runs, key=lambda r: r.call.index):
        if isinstance(r.final, GenerationError):
            return r.final
    return None


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


class GuardMiddleware:
    """API key check, and any unexpected exception -> 500 without a stack trace in the body.

    NOTE: a plain ASGI middleware (not `@app.middleware("http")`): Starlette's BaseHTTPMiddleware
    wraps `receive`, and `Request.is_disconnected()` then never sees the client go away.
    """

    OPEN_PATHS = ("/health", "/metrics")

    def __init__(self, app, state: GatewayState):
        self.app = app
        self.state = state

    def _authorized(self, scope) -> bool:
        if not self.state.api_key or scope["path"] in self.OPEN_PATHS:
            return True
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(),
                                                                     self.state.api_key.encode())

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._authorized(scope):
            err = unauthorized()
            await JSONResponse(err.body(), status_code=err.status)(scope, receive, send)
            return
        started = False

        async def send_tracking(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if self.state.synthetic:
                    message = {**message, "headers": [*message.get("headers", ()), SYNTHETIC_HEADER]}
            await send(message)

        try:
            await self.app(scope, receive, send_tracking)
        except Exception:  # noqa: BLE001 - the HTTP boundary: log it, answer 500
            log.exception("internal error while serving %s %s", scope.get("method"), scope["path"])
            if not started:
                err = internal_error()
                await JSONResponse(err.body(), status_code=err.status)(scope, receive, send)


# ---------------------------------------------------------------------------------------------
# The app
# ---------------------------------------------------------------------------------------------
def create_app(state: GatewayState, lifespan=None) -> FastAPI:
    collector = EngineCollector(lambda: state.engine.metrics() if state.engine is not None else None,
                                state.model_name, lambda: state.availability()[:2])
    registry = make_registry(collector)

    @asynccontextmanager
    async def _lifespan(app):
        if lifespan is None:
            yield
        else:
            async with lifespan(app):
                yield

    app = FastAPI(title="NInfer", docs_url=None, redoc_url=None, openapi_url=None, lifespan=_lifespan)
    app.state.gateway = state

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return JSONResponse(APIError(exc.status_code, str(exc.detail), code=code).body(),
                            status_code=exc.status_code)

    app.add_middleware(GuardMiddleware, state=state)

    def check_model(name: str | None) -> None:
        if name is not None and name != state.model_name:
            raise model_not_found(name)

    # ---- health, metrics, models ----------------------------------------------------------
    @app.get("/health")
    async def health():
        st, ready, reason = state.availability()
        if ready:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": st, "reason": reason}, status_code=503)

    @app.get("/metrics")
    async def metrics():
        return Response(render(registry), media_type=CONTENT_TYPE)

    def model_card() -> dict:
        card = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": "ninfer"}
        if state.synthetic:
            card["synthetic_weights"] = True
        if state.limits is not None:
            card["max_model_len"] = state.limits.max_model_len
        return card

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        check_model(model_id)
        return model_card()

    async def parse(request: Request, schema: type[BaseModel]):
        """(engine, request): readiness, body, schema and model checks shared by every POST route."""
        engine = state.ready_engine()
        req = validate(schema, await read_json(request, state.max_body_bytes))
        check_model(req.model)
        return engine, req

    # ---- tokenizer ------------------------------------------------------------------------
    @app.post("/tokenize")
    async def tokenize(request: Request):
        engine, req = await parse(request, TokenizeRequest)
        fe = engine.frontend
        if req.prompt is not None:
            prompt = frontend_call(fe.prepare_text, req.prompt, param="prompt", what="cannot tokenize")
        else:
            tools = [t.model_dump(exclude_none=True) for t in req.tools or ()] or None
            prompt = frontend_call(fe.prepare_chat, frontend_messages(req.messages), tools=tools,
                                   chat_template_kwargs=req.chat_template_kwargs,
                                   add_generation_prompt=req.add_generation_prompt,
                                   param="messages", what="cannot tokenize")
        ids = list(prompt.token_ids)
        body = {"count": len(ids), "max_model_len": state.limits.max_model_len, "tokens": ids}
        if req.return_token_strs:
            body["token_strs"] = [state.pieces.text(t) for t in ids]
        return body

    @app.post("/detokenize")
    async def detokenize(request: Request):
        engine, req = await parse(request, DetokenizeRequest)
        vocab = state.limits.vocab_size
        for j, t in enumerate(req.tokens):
            if not (0 <= t < vocab):
                raise bad_request(f"token id {t} is outside the vocabulary (0..{vocab - 1})",
                                  param=f"tokens[{j}]")
        return {"prompt": engine.frontend.tokenizer.decode(list(req.tokens))}

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        engine = state.ready_engine()
        fe = engine.frontend
        info = {"model": state.model_name, "tokenizer_class": "Qwen2Tokenizer",
                "vocab_size": state.limits.vocab_size, "max_model_len": state.limits.max_model_len,
                "eos_token_ids": list(fe.eos_token_ids)}
        if fe.chat_template is not None:
            info["chat_template"] = fe.chat_template.source
        return info

    async def finished_runs(request: Request, state, runs, rid: str):
        """Wait for every run of a non-streaming request: the runs in choice order, a 499 Response
        when the client left (its requests are cancelled), or the engine's error raised."""
        try:
            await until_disconnect(request, collect(runs))
        except ClientGone:
            log.info("request %s: client disconnected; cancelled", rid)
            return Response(status_code=499)
        finally:
            close_runs(state, runs)
        err = first_error(runs)
        if err is not None:
            raise from_engine_error(err)
        return sorted(runs, key=lambda r: r.call.index)

    # ---- completions ----------------------------------------------------------------------
    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        engine, req = await parse(request, ChatCompletionRequest)
        plan = plan_chat(engine.frontend, req, state.limits)
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
        engine, req = await parse(request, CompletionRequest)
        plan = plan_completion(engine.frontend, req, state.limits)
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

    return app


# ---------------------------------------------------------------------------------------------
# Streams
# ---------------------------------------------------------------------------------------------
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
