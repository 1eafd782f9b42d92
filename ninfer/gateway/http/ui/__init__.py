"""The browser playground: a static chat page at `/`, its assets under `/ui/`.

The page (static/: HTML, CSS and ES modules, no build step) talks only to the public routes
(`/health`, `/v1/models`, `/tokenize`, `/v1/chat/completions` streamed). Model text is untrusted:
the page builds DOM nodes with `textContent` only, and every UI response carries a strict
Content-Security-Policy (scripts and connections to this origin only, no inline script, no eval).
The CSP is scoped to the UI paths; the JSON routes are left as they are.
`ninfer serve --no-ui` leaves these routes out (`/` answers 404).
"""
from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["CSP", "STATIC_DIR", "UI_PREFIX", "add_ui_routes", "is_ui_path"]

STATIC_DIR = Path(__file__).parent / "static"
UI_PREFIX = "/ui/"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
       "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    # NOTE: revalidate each load (ETag -> 304), so an upgraded server never pairs old and new assets
    (b"cache-control", b"no-cache"),
)


def is_ui_path(path: str) -> bool:
    return path == "/" or path.startswith(UI_PREFIX)


class _SecureHeaders:
    """ASGI wrapper adding SECURITY_HEADERS to every response of `app` (the UI routes only)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        async def send_with_headers(message) -> None:
            if message["type"] == "http.response.start":
                drop = {k for k, _ in SECURITY_HEADERS}
                headers = [h for h in message.get("headers", ()) if h[0].lower() not in drop]
                message = {**message, "headers": [*headers, *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def add_ui_routes(app: FastAPI) -> None:
    """`GET /` (the page) and the `/ui/` static mount, both with SECURITY_HEADERS."""
    index = STATIC_DIR / "index.html"

    async def page(scope, receive, send) -> None:
        await FileResponse(index, media_type="text/html; charset=utf-8")(scope, receive, send)

    app.add_route("/", _SecureHeaders(page), methods=["GET", "HEAD"], include_in_schema=False)
    app.mount(UI_PREFIX.rstrip("/"), _SecureHeaders(StaticFiles(directory=STATIC_DIR)), name="ui")
