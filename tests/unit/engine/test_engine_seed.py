"""EngineConfig.seed (`--seed`) makes unseeded sampled requests reproducible per run, and another
seed changes them; an explicit request seed does not depend on it."""
from __future__ import annotations

from ninfer import Engine
from ninfer.config import EngineConfig, SamplingParams


def _sampled(path, run_seed: int, request_seed: int | None) -> list[tuple[int, ...]]:
    cfg = EngineConfig(device="cpu", dtype="fp32", max_concurrency=1, max_model_len=64, seed=run_seed,
                       prefix_cache=False)
    with Engine(path, cfg) as eng:
        assert eng.wait_ready().ready
        prompt = eng.frontend.prepare_text("The weather today is")
        sp = SamplingParams(temperature=1.0, seed=request_seed)
        return [eng.generate(prompt, sp, max_tokens=6).token_ids for _ in range(2)]


def test_run_seed_reproduces_and_varies_unseeded_streams(tiny_artifact_path):
    path = tiny_artifact_path("dense")
    a = _sampled(path, 1, None)
    assert a == _sampled(path, 1, None)              # same run seed: the same two streams
    assert a[0] != a[1]                              # two requests of one run: different streams
    assert a != _sampled(path, 2, None)              # another run seed: other streams


def test_request_seed_is_independent_of_the_run_seed(tiny_artifact_path):
    path = tiny_artifact_path("dense")
    x = _sampled(path, 1, 7)
    assert x[0] == x[1] == _sampled(path, 2, 7)[0]
