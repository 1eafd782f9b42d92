"""SSEResponse gives the engine requests back on every path, including a client that leaves
before the body generator ever started (closing an unstarted generator skips its `finally`)."""
from __future__ import annotations

import asyncio

from ninfer.gateway.http.streams import SSEResponse


def _scope() -> dict:
    return {"type": "http", "asgi": {"spec_version": "2.4"}, "method": "POST", "path": "/v1/completions",
            "headers": []}


def _run(send) -> tuple[list[str], list[str]]:
    trace: list[str] = []
    closed: list[str] = []

    async def body():
        try:
            trace.append("started")
            yield b"data: 1\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            trace.append("finally")

    async def receive():
        await asyncio.sleep(3600)

    async def main():
        resp = SSEResponse(body(), on_close=lambda: closed.append("closed"))
        try:
            await resp(_scope(), receive, send)
        except Exception:  # noqa: BLE001 - the client-gone error itself is not under test
            pass

    asyncio.run(main())
    return trace, closed


def test_on_close_runs_when_the_client_left_before_the_first_chunk():
    async def send(message):
        raise OSError("client gone")            # fails at http.response.start: the body never starts

    trace, closed = _run(send)
    assert trace == []                          # the generator never ran ...
    assert closed == ["closed"]                 # ... and the engine requests were still given back


def test_on_close_runs_once_after_a_complete_stream():
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    trace, closed = _run(send)
    assert trace == ["started", "finally"]
    assert closed == ["closed"]
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


def test_on_close_runs_when_the_client_leaves_mid_stream():
    async def send(message):
        if message.get("body") == b"data: 1\n\n":
            raise OSError("client gone")

    trace, closed = _run(send)
    assert trace == ["started", "finally"]
    assert closed == ["closed"]
