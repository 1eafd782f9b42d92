"""The OpenAI-compatible HTTP Gateway (FastAPI): the app, its error handlers and its guard.

Request flow (one HTTP request):
  1. auth (Bearer key: GuardMiddleware), readiness, content type (415 unless JSON), body size, JSON,
     schema (400 naming the field; unknown fields ignored, logged once per name), model (404): parsing.py
  2. media_parts.py: image/video parts -> decoded MediaItems (ninfer/gateway/media/; 400 naming
     the part); convert.py: messages/prompt -> PreparedPrompt, SamplingParams, OutputOptions, max_tokens
  3. engine.submit per choice (n > 1: n requests); a refusal at submit maps to 429/503/400: runs.py
  4. events -> a response body (routes_completions.py), or SSE chunks (streams.py); a client that
     goes away closes its handles, which cancels the requests and gives their capacity back
  5. one log line per engine request (id, tokens, TTFT, tokens/s, finish reason): runs.py
The routes: routes_completions.py (/v1/chat/completions, /v1/completions) and routes_info.py
(/health, /metrics, /v1/models, /tokenize, /detokenize, /tokenizer_info); FastAPI's /openapi.json
(openapi.py adds the request models) and its Swagger UI at /docs; the browser playground (`/` and `/ui/`,
off with `state.ui = False`) in ui/.
The Gateway never orders requests or touches cache/pages: it only submits, reads and cancels.
"""
from __future__ import annotations

import logging
import secrets
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ninfer.gateway.http.errors import APIError, internal_error, unauthorized
from ninfer.gateway.http.metrics import EngineCollector, make_registry
from ninfer.gateway.http.openapi import serve_openapi
from ninfer.gateway.http.routes_completions import add_completion_routes
from ninfer.gateway.http.routes_info import add_info_routes
from ninfer.gateway.http.state import GatewayState
from ninfer.gateway.http.ui import add_ui_routes, is_ui_path

__all__ = ["GatewayState", "GuardMiddleware", "create_app"]
log = logging.getLogger("ninfer.gateway.http")

SYNTHETIC_HEADER = (b"x-ninfer-synthetic-weights", b"true")


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

    # NOTE: /docs is FastAPI's Swagger UI page: the browser loads its script and style from a CDN
    app = FastAPI(title="NInfer", description="OpenAI-compatible API of NInfer, with vLLM's extensions",
                  docs_url="/docs", redoc_url=None, openapi_url="/openapi.json", lifespan=_lifespan)
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
    add_info_routes(app, state, registry)
    add_completion_routes(app, state)
    serve_openapi(app, bool(state.api_key), GuardMiddleware.OPEN_PATHS)
    if state.ui:
        add_ui_routes(app)
    return app


class GuardMiddleware:
    """API key check, and any unexpected exception -> 500 without a stack trace in the body.

    NOTE: a plain ASGI middleware (not `@app.middleware("http")`): Starlette's BaseHTTPMiddleware
    wraps `receive`, and `Request.is_disconnected()` then never sees the client go away.
    """

    # NOTE: the API description is the same for every NInfer server, and a browser opening /docs
    # sends no key (Swagger UI's Authorize button adds it to the requests it makes)
    OPEN_PATHS = ("/health", "/metrics", "/docs", "/docs/oauth2-redirect", "/openapi.json")

    def __init__(self, app, state: GatewayState):
        self.app = app
        self.state = state

    def _authorized(self, scope) -> bool:
        if not self.state.api_key or scope["path"] in self.OPEN_PATHS:
            return True
        if is_ui_path(scope["path"]):     # the playground asks for the key itself (404 with --no-ui)
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
