"""The HTTP gateway over an Engine with speculative decoding (a FakeProgram running speculative rounds
with a scripted acceptance, the real Qwen3.6 Frontend): /metrics exposes vLLM's spec_decode counters
with the values of the rounds run, a request without max_tokens gets the room left by the lookahead,
and the OpenAI usage object keeps its schema."""
from __future__ import annotations

import pytest

from ninfer.config import EngineConfig
from support.fakes import FakeProgram
from support.serve_util import metric

K = 3
MAX_MODEL_LEN = 64


@pytest.fixture()
def client():
    from fastapi.testclient import TestClient

    from ninfer.engine.facade import Engine
    from ninfer.gateway.http.app import create_app
    from ninfer.gateway.http.state import GatewayState
    from ninfer.targets.qwen3_6.frontend import Qwen36Frontend

    # NOTE: rounds accept 2, 0, 1, 3, 2, 0, ... drafts (per sequence, in round order)
    prog = FakeProgram(speculative=K, spec_accept=lambda sid, rnd: (2, 0, 1, 3)[rnd % 4], num_pages=64,
                       page_size=16, max_model_len=MAX_MODEL_LEN, vocab=5000)
    config = EngineConfig(max_model_len=MAX_MODEL_LEN, speculative={"method": "mtp", "num_speculative_tokens": K})
    engine = Engine.from_program(prog, Qwen36Frontend.builtin(), config)
    assert engine.wait_ready(10).ready
    state = GatewayState(model_name="m")
    state.attach(engine)
    try:
        with TestClient(create_app(state)) as c:
            yield c, prog
    finally:
        engine.close()


def test_metrics_and_default_max_tokens_with_speculation(client):
    c, prog = client
    prompt = list(range(1000, 1010))
    r = c.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                                             "ignore_eos": True, "temperature": 0})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    # no max_tokens: all the room the prompt leaves, less the lookahead
    assert usage["completion_tokens"] == MAX_MODEL_LEN - usage["prompt_tokens"] - K
    assert set(usage) <= {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details",
                          "completion_tokens_details"}
    too_long = c.post("/v1/completions", json={"model": "m", "prompt": prompt, "temperature": 0,
                                               "max_tokens": MAX_MODEL_LEN - len(prompt) - K + 1})
    assert too_long.status_code == 400 and "reserved for speculative decoding" in too_long.json()["error"]["message"]

    text = c.get("/metrics").text
    produced = [p for _, _, p in prog.spec_rounds]
    assert metric(text, "ninfer:spec_decode_num_drafts_total") == len(produced)
    assert metric(text, "ninfer:spec_decode_num_draft_tokens_total") == K * len(produced)
    assert metric(text, "ninfer:spec_decode_num_accepted_tokens_total") == sum(p - 1 for p in produced)
    for i in range(K):
        assert metric(text, "ninfer:spec_decode_num_accepted_tokens_per_pos_total",
                      position=str(i)) == sum(1 for p in produced if p - 1 > i)
    assert 1 + sum(produced) >= usage["completion_tokens"] > sum(produced[:-1])
