"""The HTTP app's strictness about what it is sent and its self-description (FastAPI TestClient over
the app factory, the real Qwen3.6 Frontend, a FakeProgram behind the public Engine): a JSON route
refuses any other content type with 415 in the OpenAI envelope; an unknown field is ignored and
logged once per field name; /openapi.json describes every POST route's request model with the
extension fields, and /docs answers FastAPI's Swagger UI page without the server fetching anything."""
from __future__ import annotations

import json
import logging
import socket
import uuid

import pytest

from ninfer.config import EngineConfig
from support.fakes import FakeProgram

USER = [{"role": "user", "content": "Hello"}]
POSTS = {"/v1/chat/completions": {"model": "m", "messages": USER, "max_tokens": 2},
         "/v1/completions": {"model": "m", "prompt": "Hello", "max_tokens": 2},
         "/tokenize": {"prompt": "Hello"},
         "/detokenize": {"tokens": [1, 2]}}


@pytest.fixture(scope="module")
def client():
    from fastapi.testclient import TestClient

    from ninfer.engine.facade import Engine
    from ninfer.gateway.http.app import create_app
    from ninfer.gateway.http.state import GatewayState
    from ninfer.targets.qwen3_6.frontend import Qwen36Frontend

    engine = Engine.from_program(FakeProgram(num_pages=64, page_size=16, max_model_len=512, vocab=5000),
                                 Qwen36Frontend.builtin(), EngineConfig(max_model_len=512))
    assert engine.wait_ready(10).ready
    state = GatewayState(model_name="m")
    state.attach(engine)
    try:
        with TestClient(create_app(state)) as c:
            yield c
    finally:
        engine.close()


def test_json_routes_refuse_other_content_types(client):
    for path, body in POSTS.items():
        raw = json.dumps(body).encode()
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None):
            headers = {"content-type": content_type} if content_type else {}
            r = client.post(path, content=raw, headers=headers)
            assert r.status_code == 415, (path, content_type, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["code"] == "unsupported_media_type"
            assert "application/json" in err["message"] and (content_type or "Missing") in err["message"]
        for content_type in ("application/json", "application/json; charset=utf-8", "Application/JSON"):
            r = client.post(path, content=raw, headers={"content-type": content_type})
            assert r.status_code == 200, (path, content_type, r.text)


def test_unknown_fields_are_ignored_and_logged_once_per_name(client, caplog):
    top, nested = f"x_top_{uuid.uuid4().hex[:8]}", f"x_nested_{uuid.uuid4().hex[:8]}"
    body = {**POSTS["/v1/chat/completions"], top: 1, "messages": [{**USER[0], nested: True}]}
    with caplog.at_level(logging.WARNING, logger="ninfer.gateway.http"):
        for _ in range(3):
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["finish_reason"] == "length"
    warned = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert sum(top in m for m in warned) == 1 and sum(nested in m for m in warned) == 1, warned
    assert any(f"'{top}' of ChatCompletionRequest" in m for m in warned)
    assert any(f"'{nested}' of ChatMessage" in m for m in warned)
    known = [m for m in warned if "'messages'" in m or "'max_tokens'" in m or "'content'" in m]
    assert known == []                    # known fields are never reported


def test_unknown_field_names_logged_are_bounded(monkeypatch, caplog):
    from ninfer.gateway.http import protocol

    monkeypatch.setattr(protocol._Model, "_warned_fields", set())
    monkeypatch.setattr(protocol, "MAX_WARNED_FIELDS", 3)
    with caplog.at_level(logging.WARNING, logger="ninfer.gateway.http"):
        for batch in range(2):
            body = {"messages": USER, **{f"f{batch}_{i}_" + "x" * 100: i for i in range(5)}}
            protocol.ChatCompletionRequest.model_validate(body)
    warned = [rec.getMessage() for rec in caplog.records]
    assert len(warned) == 4 and "no more are logged" in warned[-1]
    assert all(len(m) < 200 for m in warned)                  # a long name is cut
    assert len(protocol._Model._warned_fields) == 4


def _refs(node):
    if isinstance(node, dict):
        if "$ref" in node:
            yield node["$ref"]
        for v in node.values():
            yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def test_openapi_describes_the_request_models(client):
    r = client.get("/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    schemas = doc["components"]["schemas"]
    for ref in _refs(doc):                # every reference resolves inside the document
        assert ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in schemas, ref
    models = {"/v1/chat/completions": "ChatCompletionRequest", "/v1/completions": "CompletionRequest",
              "/tokenize": "TokenizeRequest", "/detokenize": "DetokenizeRequest"}
    for path, name in models.items():
        op = doc["paths"][path]["post"]
        assert op["requestBody"]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{name}"}
        assert op["responses"]["415"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    chat = schemas["ChatCompletionRequest"]
    assert chat["required"] == ["messages"]
    for field in ("messages", "tools", "temperature", "thinking_budget", "session_id", "top_k", "stop_token_ids",
                  "chat_template_kwargs"):
        assert field in chat["properties"], field
    assert chat["properties"]["thinking_budget"]["anyOf"][0] == {"type": "integer", "minimum": 0}
    assert "reasoning_content" in schemas["ChatMessage"]["properties"]
    assert {"prompt", "echo", "logprobs"} <= set(schemas["CompletionRequest"]["properties"])
    assert "text/event-stream" in doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    assert {"/health", "/v1/models", "/tokenizer_info"} <= set(doc["paths"])
    assert "/docs" not in doc["paths"] and "securitySchemes" not in doc["components"]


def test_docs_page_is_served_without_network(client, monkeypatch):
    def no_network(*a, **kw):
        raise AssertionError("the server opened a network connection")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    r = client.get("/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "swagger-ui" in r.text and "/openapi.json" in r.text
    assert client.get("/redoc").status_code == 404


def test_docs_need_no_key_and_describe_the_bearer_scheme():
    from fastapi.testclient import TestClient

    from ninfer.gateway.http.app import create_app
    from ninfer.gateway.http.state import GatewayState

    c = TestClient(create_app(GatewayState(model_name="m", api_key="sk-test")))
    assert c.get("/docs").status_code == 200
    doc = c.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    assert doc["security"] == [{"bearer": []}] and doc["paths"]["/health"]["get"]["security"] == []
    assert c.get("/v1/models").status_code == 401
    assert c.get("/v1/models", headers={"Authorization": "Bearer sk-test"}).status_code == 200
