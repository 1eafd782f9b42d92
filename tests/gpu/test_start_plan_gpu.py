"""The start plan on a real CUDA device: the memory check reads the free device memory, and an Engine at the
automatic max_model_len (the native 262,144 for the tiny identity) starts, captures its graphs and serves.
(The CPU side, with NINFER_MEMORY_BUDGET, is tests/integration/test_first_hour_preflight.py.)"""
from __future__ import annotations

import pytest
import torch

from ninfer.config import EngineConfig, SamplingParams
from ninfer.engine.facade import Engine, InsufficientMemoryError, check_model

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

TINY = dict(load_format="dummy", identity="qwen3_6-tiny-dense", device="cuda")


def test_the_plan_reads_the_free_device_memory(monkeypatch):
    monkeypatch.delenv("NINFER_MEMORY_BUDGET", raising=False)
    plan = check_model(None, EngineConfig(**TINY))
    free, total = torch.cuda.mem_get_info()
    assert plan.budget_what == "free on cuda" and 0 < plan.budget <= total
    assert plan.config.max_model_len == 262144 and plan.program_config.fit_max_model_len
    assert plan.program_config.kv_memory_fraction == 0.5          # the Program sizes the pool again after loading
    with pytest.raises(InsufficientMemoryError, match="free on cuda"):
        check_model(None, EngineConfig(load_format="dummy", identity="qwen3_6-27b", device="cuda", dtype="fp32",
                                       max_model_len=8192, num_pages=total // (1 << 20)))


def test_an_engine_at_the_automatic_max_model_len_serves(monkeypatch):
    monkeypatch.delenv("NINFER_MEMORY_BUDGET", raising=False)
    with Engine.from_config(EngineConfig(**TINY)) as engine:
        assert engine.wait_ready(600).ready, engine.availability.reason
        assert engine.max_model_len == 262144 and engine.progress() is None
        prompt = engine.frontend.prepare_tokens(list(range(1000, 1300)))
        result = engine.generate(prompt, SamplingParams(temperature=0), max_tokens=4)
        assert len(result.token_ids) == 4
