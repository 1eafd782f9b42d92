"""`session_id` over HTTP: the second turn of a conversation reports cached prompt tokens in
usage.prompt_tokens_details, its greedy output equals a server with the cache off, and the
Prometheus metrics count the cache queries and hits."""
from __future__ import annotations

import httpx

from support.serve_util import Server, metric


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


def test_session_id_over_http_hits_and_matches_the_cache_off():
    on, off = Server(), Server("--no-prefix-cache")
    try:
        on.wait_ready()
        off.wait_ready()
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
    finally:
        on.stop()
        off.stop()
