"""`/v1/completions` with echo + logprobs (lm-evaluation-harness `local-completions` log-likelihood):
the legacy log-probs object over prompt + generated tokens, from the real server on loopback, and
its values equal `Engine.score` (CausalScoring) on the same artifact."""
from __future__ import annotations

import httpx
import pytest

from ninfer import Engine, EngineConfig
from ninfer.config import ScoreInput
from support.serve_util import serving

MAX_LEN = 256
REL = 1e-5


@pytest.fixture(scope="module")
def artifact(tiny_artifact_path):
    return tiny_artifact_path("dense", layout="text")


@pytest.fixture(scope="module")
def server(artifact):
    with serving(str(artifact), "--device", "cpu", "--dtype", "fp32", "--max-model-len", str(MAX_LEN),
                 "--prefill-chunk-tokens", "16", "--served-model-name", "tiny") as s:
        yield s


@pytest.fixture(scope="module")
def scorer(artifact):
    e = Engine(artifact, EngineConfig(purpose="causal_scoring", device="cpu", dtype="fp32", max_model_len=MAX_LEN))
    assert e.wait_ready().ready
    yield e
    e.close()


def post(server, body: dict) -> httpx.Response:
    return httpx.post(server.base + "/v1/completions", json={"model": "tiny", **body}, timeout=120)


def check_shape(lp: dict, text: str, num_prompt: int, num_generated: int) -> None:
    n = num_prompt + num_generated
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert all(len(lp[k]) == n for k in lp)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(isinstance(v, float) and v <= 0 for v in lp["token_logprobs"][1:])
    for tok, v, top in zip(lp["tokens"][1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
        assert isinstance(top, dict) and top[tok] == v                  # the actual token is always listed
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert "".join(lp["tokens"]) == text
    assert [len("".join(lp["tokens"][:i])) for i in range(n)] == lp["text_offset"]


def test_string_prompt_echo_with_one_generated_token(server, scorer):
    prompt = "The quick brown fox jumps over the lazy dog."
    r = post(server, {"prompt": prompt, "max_tokens": 1, "logprobs": 2, "echo": True, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    [choice] = body["choices"]
    ids = scorer.frontend.tokenizer.encode(prompt)
    assert choice["text"].startswith(prompt) and body["usage"]["completion_tokens"] == 1
    lp = choice["logprobs"]
    check_shape(lp, choice["text"], len(ids), 1)
    assert all(len(t) in (2, 3) for t in lp["top_logprobs"][1:])     # top-2 plus the token itself
    [ref] = scorer.score([ids], per_token=True)
    for j in range(1, len(ids)):
        assert abs(lp["token_logprobs"][j] - ref.token_logprobs[j].logprob) / abs(ref.token_logprobs[j].logprob) < REL
    # greedy: the generated token is the argmax, so it has the largest listed log-prob
    assert max(lp["top_logprobs"][-1].values()) == lp["token_logprobs"][-1]


def test_lm_eval_loglikelihood_request_with_token_ids(server, scorer):
    tok = scorer.frontend.tokenizer
    context, continuation = tok.encode("Question: what is two plus two?\nAnswer:"), tok.encode(" four")
    ids = context + continuation
    r = post(server, {"prompt": ids, "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    check_shape(lp, choice["text"], len(ids), 1)
    ctxlen = len(context)
    ll = sum(lp["token_logprobs"][ctxlen:-1])                          # exactly what the harness computes
    is_greedy = all(max(lp["top_logprobs"][i].values()) == lp["token_logprobs"][i] for i in range(ctxlen, len(ids)))
    [ref] = scorer.score(ScoreInput(context_ids=tuple(context), token_ids=tuple(continuation)))
    assert abs(ll - ref.logprob) / abs(ref.logprob) < REL
    assert is_greedy == ref.is_greedy


def test_batched_token_prompts_with_max_tokens_zero(server, scorer):
    prompts = [[9707, 11, 1879, 0, 576], [785, 3974, 13876, 38835, 34208, 916, 279], [3838, 374]]
    r = post(server, {"prompt": prompts, "max_tokens": 0, "logprobs": 0, "echo": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 0
    assert body["usage"]["prompt_tokens"] == sum(map(len, prompts))
    refs = scorer.score(prompts, per_token=True)
    for choice in body["choices"]:
        ids, ref = prompts[choice["index"]], refs[choice["index"]]
        assert choice["text"] == scorer.frontend.tokenizer.decode(ids) and choice["finish_reason"] == "length"
        lp = choice["logprobs"]
        check_shape(lp, choice["text"], len(ids), 0)
        assert all(len(t) == 1 for t in lp["top_logprobs"][1:])       # logprobs 0: the token itself only
        got = lp["token_logprobs"][1:]
        want = [e.logprob for e in ref.token_logprobs[1:]]
        assert max(abs(a - b) / abs(b) for a, b in zip(got, want)) < REL


def test_echo_without_logprobs_and_refusals(server):
    r = post(server, {"prompt": "Hello", "max_tokens": 0, "echo": True})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "Hello"
    assert r.json()["choices"][0]["logprobs"] is None
    r = post(server, {"prompt": "Hello", "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = post(server, {"prompt": "Hello", "max_tokens": 1, "echo": True, "logprobs": 1, "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"
