"""End to end: the real `ninfer serve` (demo model) on loopback, driven by the official `openai`
client and by plain HTTP. One server for the module (max_concurrency 4, queue 8), plain and then with MTP
speculative decoding."""
from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from support.serve_util import Server, metric

API_KEY = "sk-test-key"
MODEL = "ninfer-demo"
MAX_MODEL_LEN = 1024
MAX_BODY = 65536
USER = [{"role": "user", "content": "Say hello."}]


# NOTE: the whole module runs twice: against a plain server and one with MTP speculation (3 drafts a round).
@pytest.fixture(scope="module", params=[None, "3"], ids=["plain", "mtp3"])
def server(request):
    spec = ("--speculative-method", "mtp", "--num-speculative-tokens", request.param) if request.param else ()
    s = Server("--max-concurrency", "4", "--queue-size", "8", "--max-model-len", str(MAX_MODEL_LEN),
               "--max-body-bytes", str(MAX_BODY), *spec, api_key=API_KEY)
    try:
        s.wait_ready()
        yield s
    finally:
        code = s.stop()
        assert code == 0, s.log_text()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


def metrics_text(server) -> str:
    r = httpx.get(server.base + "/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return r.text


def wait_idle(server, timeout: float = 60.0) -> str:
    """Wait until no request runs or waits and all outstanding capacity is free; return the metrics."""
    deadline = time.monotonic() + timeout
    while True:
        text = metrics_text(server)
        idle = (metric(text, "ninfer:num_requests_running") == 0 and metric(text, "ninfer:num_requests_waiting") == 0
                and metric(text, "ninfer:request_capacity_free") == metric(text, "ninfer:request_capacity")
                # NOTE: each inactive checkpoint of the context cache keeps one slot
                and metric(text, "ninfer:state_slots_free") + metric(text, "ninfer:prefix_cache_checkpoints")
                == metric(text, "ninfer:state_slots_total"))
        if idle:
            return text
        assert time.monotonic() < deadline, f"engine not idle:\n{text}"
        time.sleep(0.05)


def reasoning_of(obj) -> str:
    return getattr(obj, "reasoning_content", None) or ""


def test_health_and_models(server, client):
    r = httpx.get(server.base + "/health")
    assert r.status_code == 200 and r.json() == {"status": "ready"}
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_chat_stream_matches_non_stream(client):
    kw = dict(model=MODEL, messages=USER, temperature=0, max_tokens=6)
    full = client.chat.completions.create(**kw)
    choice = full.choices[0]
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    u = full.usage
    assert u.completion_tokens == 6 and u.total_tokens == u.prompt_tokens + 6
    assert u.prompt_tokens_details.cached_tokens >= 0
    # thinking is on by default: the random model never closes </think>, so everything is reasoning
    assert u.completion_tokens_details.reasoning_tokens == 6
    assert reasoning_of(choice.message) and not choice.message.content
    reasoning, content, finish = "", "", None
    for chunk in client.chat.completions.create(**kw, stream=True):
        for c in chunk.choices:
            reasoning += reasoning_of(c.delta)
            content += c.delta.content or ""
            finish = c.finish_reason or finish
    assert (reasoning, content, finish) == (reasoning_of(choice.message), choice.message.content or "", "length")


def test_thinking_off_gives_content(client):
    r = client.chat.completions.create(model=MODEL, messages=USER, temperature=0, max_tokens=4,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content and not reasoning_of(r.choices[0].message)
    assert r.usage.completion_tokens_details.reasoning_tokens == 0


def test_n_with_seeds(client):
    kw = dict(model=MODEL, messages=USER, temperature=1.0, max_tokens=4)
    a = client.chat.completions.create(**kw, n=3, seed=5)
    b = client.chat.completions.create(**kw, n=3, seed=5)
    c = client.chat.completions.create(**kw, n=1, seed=6)
    texts = [reasoning_of(ch.message) for ch in sorted(a.choices, key=lambda ch: ch.index)]
    assert [ch.index for ch in sorted(a.choices, key=lambda ch: ch.index)] == [0, 1, 2]
    assert texts == [reasoning_of(ch.message) for ch in sorted(b.choices, key=lambda ch: ch.index)]
    assert len(set(texts)) > 1                                   # different seeds per choice
    assert reasoning_of(c.choices[0].message) == texts[1]       # choice i uses seed + i
    assert a.usage.completion_tokens == 12 and a.usage.prompt_tokens == c.usage.prompt_tokens


def test_stream_include_usage(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3, stream=True,
                                                 stream_options={"include_usage": True}))
    assert all(ch.usage is None for ch in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 3
    assert last.usage.total_tokens == last.usage.prompt_tokens + 3


def test_stop_string_and_length(client):
    base = client.completions.create(model=MODEL, prompt="The weather today", temperature=0, max_tokens=8,
                                     logprobs=0)
    assert base.choices[0].finish_reason == "length" and base.usage.completion_tokens == 8
    text, tokens = base.choices[0].text, base.choices[0].logprobs.tokens
    stop = next(t for t in tokens[2:] if t.strip() and t in text)
    stopped = client.completions.create(model=MODEL, prompt="The weather today", temperature=0, max_tokens=8,
                                        stop=[stop])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].text == text[:text.index(stop)]


def test_logprob_shapes(client):
    r = client.chat.completions.create(model=MODEL, messages=USER, temperature=0, max_tokens=3, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 3
    for e in content:
        assert len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token   # greedy = raw argmax
        assert e.logprob <= 0 and bytes(e.bytes).decode("utf-8", "replace") == e.token
        assert [t.logprob for t in e.top_logprobs] == sorted((t.logprob for t in e.top_logprobs), reverse=True)
    c = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4, logprobs=2)
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert all(len(t) <= 2 for t in lp.top_logprobs) and lp.text_offset[0] == 0
    assert "".join(lp.tokens) == c.choices[0].text


def test_completions_prompt_forms(server, client):
    r = client.completions.create(model=MODEL, prompt=["a", "b"], n=2, max_tokens=2, temperature=0)
    assert sorted(ch.index for ch in r.choices) == [0, 1, 2, 3]
    by = {ch.index: ch.text for ch in r.choices}
    assert by[0] == by[1] and by[2] == by[3]                     # greedy: n copies agree
    ids = httpx.post(server.base + "/tokenize", json={"prompt": "a"}, headers=server.headers).json()["tokens"]
    t = client.completions.create(model=MODEL, prompt=ids, max_tokens=2, temperature=0)
    assert t.choices[0].text == by[0]


def test_metrics_move(server, client):
    before = wait_idle(server)
    client.completions.create(model=MODEL, prompt="count", max_tokens=3, temperature=0)
    after = wait_idle(server)
    assert metric(after, "ninfer:generation_tokens_total") - metric(before, "ninfer:generation_tokens_total") == 3
    assert metric(after, "ninfer:prompt_tokens_total") > metric(before, "ninfer:prompt_tokens_total")
    for name in ("ninfer:request_success_total",):
        assert metric(after, name, finished_reason="length") == metric(before, name, 0.0, finished_reason="length") + 1
    for h in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert metric(after, f"ninfer:{h}_count") == metric(before, f"ninfer:{h}_count") + 1
    assert metric(after, "ninfer:inter_token_latency_seconds_count") >= metric(
        before, "ninfer:inter_token_latency_seconds_count") + 2
    assert metric(after, "ninfer:kv_cache_usage_perc") >= 0


def test_tokenizer_endpoints(server):
    h = server.headers
    tok = httpx.post(server.base + "/tokenize", json={"prompt": "Hello world", "return_token_strs": True}, headers=h)
    assert tok.status_code == 200
    body = tok.json()
    assert body["count"] == len(body["tokens"]) and "".join(body["token_strs"]) == "Hello world"
    assert body["max_model_len"] == MAX_MODEL_LEN
    de = httpx.post(server.base + "/detokenize", json={"tokens": body["tokens"]}, headers=h)
    assert de.json() == {"prompt": "Hello world"}
    chat = httpx.post(server.base + "/tokenize", json={"messages": USER}, headers=h).json()
    assert chat["count"] > body["count"]
    info = httpx.get(server.base + "/tokenizer_info", headers=h).json()
    assert info["vocab_size"] == 248077 and 248046 in info["eos_token_ids"] and "chat_template" in info


# ---------------------------------------------------------------------------------------------
# Bad requests
# ---------------------------------------------------------------------------------------------
def _chat(**kw) -> dict:
    return {"model": MODEL, "messages": USER, "max_tokens": 2, **kw}


BAD = [
    ("malformed json", "/v1/chat/completions", b'{"model": "ninfer-demo", "messages": [', 400, None),
    ("wrong type", "/v1/chat/completions", {"model": MODEL, "messages": "hello"}, 400, "messages"),
    ("wrong field type", "/v1/chat/completions", _chat(temperature="hot"), 400, "temperature"),
    ("unknown model", "/v1/chat/completions", _chat(model="gpt-4"), 404, "model"),
    ("top_logprobs 21", "/v1/chat/completions", _chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    ("n 0", "/v1/chat/completions", _chat(n=0), 400, "n"),
    ("negative max_tokens", "/v1/chat/completions", _chat(max_tokens=-1), 400, "max_tokens"),
    ("over the context", "/v1/chat/completions",
     {"model": MODEL, "messages": [{"role": "user", "content": "word " * 2000}]}, 400, "messages"),
    ("completion over the context", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 5000},
     400, "max_tokens"),
    ("huge body", "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x" * 100_000}]},
     413, None),
    ("bad prompt token", "/v1/completions", {"model": MODEL, "prompt": [1, 10 ** 9]}, 400, "prompt[1]"),
    ("not an object", "/v1/completions", [1, 2], 400, None),
    ("unknown route", "/v1/nothing", {}, 404, None),
]


@pytest.mark.parametrize("name,path,body,status,param", BAD, ids=[b[0] for b in BAD])
def test_bad_requests(server, name, path, body, status, param):
    headers = dict(server.headers)
    if isinstance(body, bytes):
        r = httpx.post(server.base + path, content=body, headers={**headers, "content-type": "application/json"})
    else:
        r = httpx.post(server.base + path, json=body, headers=headers)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert "Traceback" not in r.text
    if param is not None:
        assert err["param"] == param
    assert httpx.get(server.base + "/health").status_code == 200


def test_api_key(server):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.post(server.base + "/v1/chat/completions", json=_chat(), headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    bad = openai.OpenAI(base_url=server.base + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.get(server.base + "/health").status_code == 200       # probes need no key
    assert httpx.get(server.base + "/metrics").status_code == 200


def test_openai_client_error_types(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=USER)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=USER, n=0)
    assert e.value.body["param"] == "n"


# ---------------------------------------------------------------------------------------------
# Disconnects and load
# ---------------------------------------------------------------------------------------------
def _stream_body(max_tokens: int) -> dict:
    return {"model": MODEL, "messages": USER, "max_tokens": max_tokens, "stream": True}


def test_disconnect_mid_stream_cancels(server):
    before = wait_idle(server)
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", server.base + "/v1/chat/completions", json=_stream_body(500),
                         headers=server.headers) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = 0
            for line in lines:
                if line.startswith("data: "):
                    got += 1
                if got >= 3:
                    break
    after = wait_idle(server)
    assert metric(after, "ninfer:request_success_total", finished_reason="abort") == \
        metric(before, "ninfer:request_success_total", 0.0, finished_reason="abort") + 1
    assert metric(after, "ninfer:generation_tokens_total") - metric(before, "ninfer:generation_tokens_total") < 500


def test_disconnect_non_streaming_cancels(server):
    before = wait_idle(server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base + "/v1/completions", json={"prompt": "x", "max_tokens": 500, "ignore_eos": True},
                   headers=server.headers, timeout=httpx.Timeout(10, read=1.0))
    after = wait_idle(server)
    assert metric(after, "ninfer:request_success_total", finished_reason="abort") == \
        metric(before, "ninfer:request_success_total", 0.0, finished_reason="abort") + 1
    assert "client disconnected; cancelled" in server.log_text()


def test_load_32_streaming_clients_with_disconnects(server):
    before = wait_idle(server)
    n = 32
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def client_main(i: int) -> None:
        disconnect = i % 3 == 0
        try:
            with httpx.Client(timeout=120) as http:
                barrier.wait()
                with http.stream("POST", server.base + "/v1/chat/completions", json=_stream_body(12),
                                 headers=server.headers) as r:
                    if r.status_code != 200:
                        r.read()
                        results[i] = (r.status_code, r.json()["error"]["code"])
                        return
                    events = []
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            events.append(line[6:])
                            if disconnect and len(events) >= 2:
                                results[i] = (200, "disconnected")
                                return
                    assert events[-1] == "[DONE]"
                    finish = [c["finish_reason"] for e in events[:-1] for c in json.loads(e)["choices"]
                              if c.get("finish_reason")]
                    results[i] = (200, finish[-1])
        except Exception as e:  # noqa: BLE001 - recorded and asserted below
            results[i] = ("error", repr(e))

    threads = [threading.Thread(target=client_main, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not any(t.is_alive() for t in threads), "a client hung"
    statuses = {r[0] for r in results}
    assert statuses <= {200, 429}, results
    assert any(r == (429, "queue_full") for r in results), results
    assert any(r == (200, "length") for r in results), results
    after = wait_idle(server)
    assert metric(after, "ninfer:num_requests_running") == 0 and metric(after, "ninfer:num_requests_waiting") == 0
    assert metric(after, "ninfer:request_rejected_total", 0.0, kind="overloaded") - \
        metric(before, "ninfer:request_rejected_total", 0.0, kind="overloaded") == sum(r[0] == 429 for r in results)
    assert httpx.get(server.base + "/health").status_code == 200
    log = server.log_text()
    assert log.count("finish=") >= sum(r[0] == 200 for r in results)


@pytest.mark.parametrize("where", ["field", "chat_template_kwargs"])
def test_thinking_budget_caps_the_reasoning(client, where):
    budget = 3
    kw = {"thinking_budget": budget} if where == "field" else {}
    ctk = {"enable_thinking": True, **({"thinking_budget": budget} if where != "field" else {})}
    r = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=24, temperature=0.0,
                                       extra_body={"chat_template_kwargs": ctk, "ignore_eos": True, **kw})
    assert r.usage.completion_tokens_details.reasoning_tokens <= budget
    assert r.usage.completion_tokens == 24


def test_a_bad_thinking_budget_is_a_400(server):
    r = httpx.post(server.base + "/v1/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"model": MODEL, "messages": USER, "chat_template_kwargs": {"thinking_budget": "x"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs.thinking_budget"
    r = httpx.post(server.base + "/v1/chat/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                   json={"model": MODEL, "messages": USER, "thinking_budget": -1})
    assert r.status_code == 400 and "thinking_budget" in r.json()["error"]["param"]
