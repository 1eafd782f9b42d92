"""Prompt log-probs of Generation requests: every prompt token's log-prob (and top-k) from prefill,
over staged prefill, equal to transformers and to Engine.score."""
from __future__ import annotations

import pytest
import torch

from support.program_util import hf_model, prompt
from ninfer import Engine, EngineConfig, EngineRequestError, ErrorKind, SamplingParams

REL = 1e-5


@pytest.fixture(scope="module")
def engine(tiny_artifact_path):
    e = Engine(tiny_artifact_path("dense", layout="text"),
               EngineConfig(device="cpu", dtype="fp32", max_model_len=256, prefill_chunk_tokens=16))
    assert e.wait_ready().ready
    yield e
    e.close()


@pytest.mark.parametrize("n,k", [(1, 0), (16, 2), (17, 0), (70, 3)])
def test_prompt_logprobs_over_staged_prefill_equal_transformers(engine, n, k):
    ids = prompt(n, seed=n)
    res = engine.generate(engine.frontend.prepare_tokens(ids), SamplingParams(temperature=0, logprobs=1),
                          max_tokens=2, prompt_logprobs=k)
    pl = res.prompt_logprobs
    assert len(pl) == n and pl[0] is None
    with torch.no_grad():
        full = torch.log_softmax(hf_model("dense")(torch.tensor([ids])).logits[0].float(), dim=-1)
    for j in range(1, n):
        e = pl[j]
        assert e.token_id == ids[j]
        ref = full[j - 1, ids[j]].item()
        assert abs(e.logprob - ref) / abs(ref) < REL
        assert len(e.top) == k
        if k:
            assert [t for t, _ in e.top] == full[j - 1].topk(k).indices.tolist()
    assert len(res.logprobs) == 2 and res.usage.num_reused_tokens == 0


def test_without_prompt_logprobs_nothing_is_returned(engine):
    res = engine.generate(engine.frontend.prepare_tokens(prompt(20, 1)), SamplingParams(temperature=0), max_tokens=1)
    assert res.prompt_logprobs is None


def test_bad_prompt_logprobs_are_refused(engine):
    for bad in (-1, 21, True, 1.5):
        with pytest.raises(EngineRequestError) as e:
            engine.submit(engine.frontend.prepare_text("hi"), SamplingParams(), max_tokens=1, prompt_logprobs=bad)
        assert e.value.kind is ErrorKind.INVALID_REQUEST


def test_prompt_logprobs_equal_engine_score(engine, tiny_artifact_path):
    ids = prompt(60, seed=9)
    res = engine.generate(engine.frontend.prepare_tokens(ids), SamplingParams(temperature=0), max_tokens=1,
                          prompt_logprobs=0)
    scorer = Engine(tiny_artifact_path("dense", layout="text"),
                    EngineConfig(purpose="causal_scoring", device="cpu", dtype="fp32", max_model_len=64))
    try:
        assert scorer.wait_ready().ready
        [ref] = scorer.score([ids], per_token=True)
    finally:
        scorer.close()
    got = sum(e.logprob for e in res.prompt_logprobs[1:])
    assert abs(got - ref.logprob) / abs(ref.logprob) < REL
