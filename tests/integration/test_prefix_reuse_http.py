"""`session_id` over HTTP: the second turn of a conversation reports cached prompt tokens in
usage.prompt_tokens_details, its greedy output equals a server with the cache off, and the
Prometheus metrics count the cache queries and hits. Then the SIGTERM drain on the same (demo model)
server, the module's last test: one server start less than a server of its own."""
from __future__ import annotations

import json
import signal
import threading
import time

import httpx
import pytest

from support.serve_util import Server, metric


@pytest.fixture(scope="module")
def servers():
    """(cache on, cache off) demo-model servers, started together; the first one's drain timeout is short
    for test_sigterm_drains_and_exits_zero."""
    on, off = Server("--drain-timeout-s", "1"), Server("--no-prefix-cache")
    try:
        on.wait_ready()
        off.wait_ready()
        yield on, off
    finally:
        on.stop()
        off.stop()


def _chat(server: Server, messages, **extra) -> dict:
    body = {"messages": messages, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "chat_template_kwargs": {"enable_thinking": False}, **extra}
    r = httpx.post(server.base + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _conversation(server: Server, **extra) -> list[dict]:
    msgs = [{"role": "system", "content": "Be brief."}]
    out = []
    for user in ("Hello", "Go on", "Thanks"):
        msgs.append({"role": "user", "content": user})
        resp = _chat(server, msgs, **extra)
        out.append(resp)
        msgs.append({"role": "assistant", "content": resp["choices"][0]["message"]["content"]})
    return out


def test_session_id_over_http_hits_and_matches_the_cache_off(servers):
    on, off = servers
    cached = _conversation(on, session_id="http-session")
    plain = _conversation(off, session_id="http-session")
    assert [c["choices"][0]["message"]["content"] for c in cached] == \
        [p["choices"][0]["message"]["content"] for p in plain]
    hits = [c["usage"]["prompt_tokens_details"]["cached_tokens"] for c in cached]
    assert hits[0] == 0 and all(0 < h < c["usage"]["prompt_tokens"] for h, c in zip(hits[1:], cached[1:]))
    assert all(p["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 for p in plain)
    text = httpx.get(on.base + "/metrics", timeout=10).text
    assert metric(text, "ninfer:prefix_cache_queries_total") == 3
    assert metric(text, "ninfer:prefix_cache_hits_total") == 2
    bad = httpx.post(on.base + "/v1/chat/completions", timeout=30,
                     json={"messages": [{"role": "user", "content": "x"}], "session_id": ""})
    assert bad.status_code == 400


def test_sigterm_drains_and_exits_zero(servers):
    """In-flight streams end properly (cancelled at the drain timeout), new connections are
    refused, and the process exits 0. (Demo model: it never produces the scripted stop.)
    NOTE: it stops the module's cache-on server, so it stays the last test of this module."""
    s = servers[0]
    try:
        events: list[str] = []
        started = threading.Event()

        def stream() -> None:
            body = {"prompt": "tell me a long story", "max_tokens": 2000, "stream": True, "ignore_eos": True}
            with httpx.stream("POST", s.base + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        started.set()

        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(60)
        t0 = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(httpx.HTTPError):
            httpx.get(s.base + "/health", timeout=2)
        t.join(60)
        assert not t.is_alive()
        code = s.proc.wait(60)
        assert code == 0, s.log_text()
        assert time.monotonic() - t0 < 30
        assert events[-1] == "[DONE]"
        finish = [c["finish_reason"] for e in events[:-1] for c in json.loads(e)["choices"] if c.get("finish_reason")]
        assert finish == ["abort"]
        assert "draining" in s.log_text()
    finally:
        s.stop()
