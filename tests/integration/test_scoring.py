"""CausalScoring: Engine.score equals transformers (fp32) computing the sliding-window perplexity recipe.

The reference below is the Hugging Face recipe written out independently (window max_length,
stride; labels of the overlap set to -100; `outputs.loss` is the mean over the shifted valid labels).
"""
from __future__ import annotations

import math

import pytest
import torch

from support.program_util import hf_model, prompt
from ninfer import Engine, EngineConfig, EngineRequestError, ErrorKind, SamplingParams
from ninfer.engine.causal_score_core import plan_windows
from ninfer.config import ScoreInput

MAX_LEN = 160
REL = 1e-5


def _engine(tiny_artifact_path, kind: str, **kw) -> Engine:
    cfg = dict(purpose="causal_scoring", device="cpu", dtype="fp32", max_model_len=MAX_LEN)
    cfg.update(kw)
    engine = Engine(tiny_artifact_path(kind, layout="text"), EngineConfig(**cfg))
    assert engine.wait_ready().ready
    return engine


@pytest.fixture(scope="module")
def scorer(tiny_artifact_path):
    engines: dict[str, Engine] = {}

    def get(kind: str) -> Engine:
        if kind not in engines:
            engines[kind] = _engine(tiny_artifact_path, kind)
        return engines[kind]

    yield get
    for e in engines.values():
        e.close()


def hf_recipe(model, ids: list[int], max_length: int, stride: int):
    """The transformers perplexity recipe; returns (nll sum, tokens scored, {position: log-prob})."""
    seq_len, prev_end = len(ids), 0
    nll, count, per = 0.0, 0, {}
    with torch.no_grad():
        for begin in range(0, seq_len, stride):
            end = min(begin + max_length, seq_len)
            trg_len = end - prev_end
            input_ids = torch.tensor([ids[begin:end]])
            target_ids = input_ids.clone()
            target_ids[:, :-trg_len] = -100
            out = model(input_ids, labels=target_ids)
            n_loss = int((target_ids[:, 1:] != -100).sum())
            if n_loss:
                nll += out.loss.double().item() * n_loss
                count += n_loss
            lp = torch.log_softmax(out.logits[0].float(), dim=-1)
            for j in range(1, end - begin):
                if target_ids[0, j] != -100:
                    per[begin + j] = lp[j - 1, ids[begin + j]].item()
            prev_end = end
            if end == seq_len:
                break
    return nll, count, per


def hf_full(model, ids: list[int]) -> torch.Tensor:
    """log_softmax of a full-context forward: [len, V]; row j predicts token j + 1."""
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)


def rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# ---------------------------------------------------------------------------------------------
# The window plan
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n,window,stride", [(1, 8, 8), (2, 8, 8), (8, 8, 8), (9, 8, 8), (50, 8, 3),
                                             (50, 8, 8), (50, 8, 1), (7, 64, 5), (100, 16, 15)])
def test_plan_scores_each_token_at_most_once_and_follows_the_recipe(n, window, stride):
    plans = plan_windows(n, window, stride)
    scored = [j for p in plans for j in range(p.first_scored, p.end)]
    assert len(scored) == len(set(scored))
    assert 0 not in scored
    assert sum(p.advance for p in plans) <= n
    for p in plans:
        assert p.end - p.begin <= window and p.begin < p.first_scored < p.end
    if stride < window:                       # overlapping windows: every token but the first
        assert sorted(scored) == list(range(1, n))
    else:                                     # disjoint windows: each window's first token has no context
        assert sorted(scored) == [j for j in range(1, n) if j % window != 0]


def test_plan_rejects_bad_strides():
    with pytest.raises(ValueError):
        plan_windows(10, 8, 9)
    with pytest.raises(ValueError):
        plan_windows(10, 8, 0)


# ---------------------------------------------------------------------------------------------
# Parity with transformers
# ---------------------------------------------------------------------------------------------
CASES = [  # (kind, length, window, stride): shorter than, equal to and much longer than the window
    ("dense", 40, 64, 64), ("dense", 64, 64, 64), ("dense", 64, 64, 20),
    ("dense", 300, 64, 64), ("dense", 300, 64, 17), ("dense", 300, 160, 100),
    ("moe", 40, 64, 64), ("moe", 300, 64, 24),
]


@pytest.mark.parametrize("kind,n,window,stride", CASES)
def test_perplexity_and_per_token_logprobs_equal_transformers(scorer, kind, n, window, stride):
    ids = prompt(n, seed=n + window + stride)
    nll, count, per = hf_recipe(hf_model(kind), ids, window, stride)
    [res] = scorer(kind).score(ScoreInput(token_ids=tuple(ids)), window=window, stride=stride, per_token=True)
    assert res.token_ids == tuple(ids)
    assert res.num_scored_tokens == count == len(per)
    assert rel(-res.logprob, nll) < REL
    assert rel(res.perplexity, math.exp(nll / count)) < REL
    scored = {j: e.logprob for j, e in enumerate(res.token_logprobs) if e is not None}
    assert sorted(scored) == sorted(per)
    for j, lp in scored.items():
        assert res.token_logprobs[j].token_id == ids[j]
        assert rel(lp, per[j]) < REL, j


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_window_covering_the_text_equals_a_full_context_forward(scorer, kind):
    ids = prompt(150, seed=7)
    full = hf_full(hf_model(kind), ids)
    [res] = scorer(kind).score([ids], window=MAX_LEN, per_token=True, top_k=3)
    assert res.token_logprobs[0] is None
    for j in range(1, len(ids)):
        e = res.token_logprobs[j]
        assert rel(e.logprob, full[j - 1, ids[j]].item()) < REL
        ref_lp, ref_ids = full[j - 1].topk(3)
        assert [t for t, _ in e.top] == ref_ids.tolist()
        assert max(rel(a, b) for (_, a), b in zip(e.top, ref_lp.tolist())) < REL
    ref_sum = sum(full[j - 1, ids[j]].item() for j in range(1, len(ids)))
    assert rel(res.logprob, ref_sum) < REL
    ranks_ok = all(full[j - 1].argmax().item() == ids[j] for j in range(1, len(ids)))
    assert res.is_greedy == ranks_ok


def test_short_windows_really_cut_the_context(scorer):
    """Guards the parity test: windowed scores differ from full-context ones where context was cut."""
    ids = prompt(200, seed=11)
    full = hf_full(hf_model("dense"), ids)
    [res] = scorer("dense").score([ids], window=32, stride=32, per_token=True)
    diffs = [abs(res.token_logprobs[j].logprob - full[j - 1, ids[j]].item())
             for j in range(40, 200) if res.token_logprobs[j] is not None]
    assert max(diffs) > 1e-3


def test_greedy_tokens_are_reported_greedy(scorer):
    ids = prompt(20, seed=3)
    full = hf_full(hf_model("dense"), ids)
    for _ in range(10):                       # extend by the model's own argmax: all greedy
        ids.append(int(full[-1].argmax()))
        full = hf_full(hf_model("dense"), ids)
    [res] = scorer("dense").score([ScoreInput(context_ids=tuple(ids[:20]), token_ids=tuple(ids[20:]))])
    assert res.is_greedy and res.num_scored_tokens == 10
    [res] = scorer("dense").score([ids])
    assert not res.is_greedy                  # random prompt tokens are not the argmax


# ---------------------------------------------------------------------------------------------
# Continuation scoring, texts, BOS
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_continuation_scores_only_the_continuation(scorer, kind):
    ctx, cont = prompt(90, seed=21), prompt(25, seed=22)
    ids = ctx + cont
    full = hf_full(hf_model(kind), ids)
    ref = sum(full[j - 1, ids[j]].item() for j in range(len(ctx), len(ids)))
    [res] = scorer(kind).score(ScoreInput(context_ids=tuple(ctx), token_ids=tuple(cont)), per_token=True)
    assert res.num_context_tokens == 90 and res.num_scored_tokens == 25
    assert rel(res.logprob, ref) < REL
    assert all(e is None for e in res.token_logprobs[:90])
    assert all(e is not None for e in res.token_logprobs[90:])


def test_continuation_given_as_text(scorer):
    engine = scorer("dense")
    context, continuation = "The capital of France is", " Paris, a city on the Seine."
    enc = engine.frontend.tokenizer.encode
    ids = enc(context) + enc(continuation)
    full = hf_full(hf_model("dense"), ids)
    ref = sum(full[j - 1, ids[j]].item() for j in range(len(enc(context)), len(ids)))
    [res] = engine.score(ScoreInput(context=context, text=continuation))
    assert res.token_ids == tuple(ids)
    assert rel(res.logprob, ref) < REL
    [plain] = engine.score(context + continuation)
    assert plain.num_scored_tokens == len(enc(context + continuation)) - 1


def test_add_bos_scores_the_first_token(scorer):
    engine = scorer("dense")
    ids = prompt(30, seed=5)
    bos = engine.frontend.tokenizer.token_to_id("<|endoftext|>")
    full = hf_full(hf_model("dense"), [bos] + ids)
    [res] = engine.score([ids], add_bos=True)
    assert res.token_ids == (bos, *ids) and res.num_scored_tokens == 30
    assert rel(res.logprob, sum(full[j, ids[j]].item() for j in range(30))) < REL


def test_degenerate_inputs(scorer):
    engine = scorer("dense")
    one, = engine.score([[5]])
    assert one.num_scored_tokens == 0 and one.logprob == 0.0 and one.perplexity is None
    a, b = engine.score([[1, 2, 3], ScoreInput(token_ids=(4, 5))])
    assert (a.num_scored_tokens, b.num_scored_tokens) == (2, 1)
    progress = []
    engine.score([prompt(100, 1)], window=32, stride=16, progress=progress.append)
    assert sum(progress) == 100


# ---------------------------------------------------------------------------------------------
# Purpose separation and errors
# ---------------------------------------------------------------------------------------------
def test_scoring_engine_refuses_generation_and_bad_options(scorer):
    engine = scorer("dense")
    with pytest.raises(EngineRequestError) as e:
        engine.submit(engine.frontend.prepare_text("hi"), SamplingParams(), max_tokens=4)
    assert e.value.kind is ErrorKind.INVALID_REQUEST and "causal_scoring" in e.value.message
    for kw in (dict(window=MAX_LEN + 1), dict(window=1), dict(window=32, stride=33), dict(stride=0),
               dict(top_k=21)):
        with pytest.raises(EngineRequestError) as e:
            engine.score("some text", **kw)
        assert e.value.kind is ErrorKind.INVALID_REQUEST
    with pytest.raises(EngineRequestError):
        engine.score([[1, 2, 10 ** 7]])
    with pytest.raises(EngineRequestError):
        engine.score([3.5])
    program = engine._core.program
    assert program.scoring is not None and program.scoring.staging.nbytes > 0
    assert engine.availability.ready                    # refusals leave the engine usable


def test_generation_engine_refuses_score_and_has_no_scoring_staging(tiny_artifact_path):
    engine = Engine(tiny_artifact_path("dense", layout="text"),
                    EngineConfig(device="cpu", dtype="fp32", max_model_len=MAX_LEN))
    try:
        assert engine.wait_ready().ready
        assert engine._core.program.scoring is None and engine._core.program.scoring_window == 0
        with pytest.raises(EngineRequestError) as e:
            engine.score("some text")
        assert e.value.kind is ErrorKind.INVALID_REQUEST and "causal_scoring" in e.value.message
    finally:
        engine.close()


def test_scoring_engine_over_a_generation_program_does_not_start(tiny_artifact_path):
    from support.program_util import tiny_program
    from ninfer.artifact import open_artifact
    from ninfer.targets.qwen3_6.frontend import Qwen36Frontend

    path = tiny_artifact_path("dense", layout="text")
    frontend = Qwen36Frontend.from_resources(open_artifact(path).frontend_resources())
    engine = Engine.from_program(tiny_program(tiny_artifact_path, "dense"), frontend,
                                 EngineConfig(purpose="causal_scoring", device="cpu"))
    try:
        a = engine.wait_ready(30)
        assert a.state.value == "failed" and "causal_scoring" in a.reason
        with pytest.raises(EngineRequestError) as e:
            engine.score("some text")
        assert e.value.kind is ErrorKind.NOT_READY
    finally:
        engine.close()
