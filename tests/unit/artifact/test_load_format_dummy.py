"""--load-format dummy: a registered identity with synthetic weights, every response marked."""
from __future__ import annotations

import json

import pytest

from ninfer import Engine
from ninfer.gateway.cli.main import main
from ninfer.config import EngineConfig, SamplingParams

TINY = dict(load_format="dummy", identity="qwen3_6-tiny-dense", device="cpu", max_concurrency=2, max_model_len=128)


def test_config_validation():
    with pytest.raises(ValueError, match="needs an identity"):
        EngineConfig(load_format="dummy")
    with pytest.raises(ValueError, match="unknown model identity 'qwen3_6-99b'.*qwen3_6-27b"):
        EngineConfig(load_format="dummy", identity="qwen3_6-99b")
    with pytest.raises(ValueError, match="load_format must be"):
        EngineConfig(load_format="safetensors")
    with pytest.raises(ValueError, match="only used with load_format dummy"):
        EngineConfig(identity="qwen3_6-27b")
    assert EngineConfig(load_format="dummy", identity="qwen3_6-35b-a3b").synthetic
    assert not EngineConfig().synthetic


def test_dummy_engine_generates_and_marks_results():
    with Engine.from_config(EngineConfig(**TINY)) as engine:
        assert engine.wait_ready(60).ready, engine.availability
        assert engine.synthetic and engine.identity == "qwen3_6-tiny-dense"
        prompt = engine.frontend.prepare_chat([{"role": "user", "content": "Hello"}])
        r = engine.generate(prompt, SamplingParams(temperature=0.0), max_tokens=6)
        assert r.usage.num_output_tokens >= 1
        assert r.extra.get("synthetic_weights") is True
    with pytest.raises(ValueError, match="takes no artifact path"):
        Engine("model.ninfer", EngineConfig(**TINY))
    with pytest.raises(ValueError, match="needs a .ninfer artifact path"):
        Engine(None, EngineConfig(device="cpu"))


def test_cli_generate_dummy(capsys):
    rc = main(["generate", "--load-format", "dummy", "--identity", "qwen3_6-tiny-dense", "--device", "cpu",
               "--max-model-len", "128", "-p", "hi", "--max-tokens", "4", "--temperature", "0", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    data = json.loads(out.strip().splitlines()[-1])
    assert data["synthetic_weights"] is True and data["usage"]["output_tokens"] == 4
    assert "synthetic random weights" in err


def test_cli_bad_identity_and_model_with_dummy(capsys):
    rc = main(["generate", "--load-format", "dummy", "--identity", "qwen3_6-1t", "-p", "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown model identity 'qwen3_6-1t'" in err and "qwen3_6-tiny-dense" in err
    rc = main(["generate", "some.ninfer", "--load-format", "dummy", "--identity", "qwen3_6-tiny-dense", "-p", "hi"])
    err = capsys.readouterr().err
    assert rc == 2 and "takes no MODEL file" in err


def test_gateway_marks_synthetic():
    from fastapi.testclient import TestClient

    from ninfer.gateway.http.app import GatewayState, create_app
    from ninfer.gateway.http.responses import chat_chunk, completion_response

    for synthetic in (True, False):
        client = TestClient(create_app(GatewayState(model_name="m", synthetic=synthetic)))
        r = client.get("/v1/models")
        assert r.status_code == 200
        assert r.json()["data"][0].get("synthetic_weights", False) is synthetic
        assert (r.headers.get("x-ninfer-synthetic-weights") == "true") is synthetic
        assert client.get("/v1/models/m").json().get("synthetic_weights", False) is synthetic
        fp = GatewayState(model_name="m", synthetic=synthetic).fingerprint
        assert (fp == "ninfer-synthetic-weights") if synthetic else fp is None
    assert completion_response("i", "m", 0, [], {}, "x")["system_fingerprint"] == "x"
    assert chat_chunk("i", "m", 0, [], fingerprint="x")["system_fingerprint"] == "x"
