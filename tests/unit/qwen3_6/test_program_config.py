"""ProgramConfig checks the physical invariants only; EngineConfig owns the user-facing ranges."""
from __future__ import annotations

import pytest

from support.program_util import greedy_reference, prompt, tiny_program
from ninfer.config import EngineConfig
from ninfer.targets.qwen3_6.program.config import ProgramConfig


def test_every_page_size_the_engine_offers_is_a_program_page_size():
    for ps in (16, 32, 64, 128, 256):
        assert EngineConfig(page_size=ps).page_size == ProgramConfig(page_size=ps).page_size == ps
    for ps in (8, 24, 512):
        with pytest.raises(ValueError, match="page_size"):
            EngineConfig(page_size=ps)
    for ps in (0, -16):
        with pytest.raises(ValueError, match="page_size must be >= 1"):
            ProgramConfig(page_size=ps)


def test_a_page_size_that_is_no_power_of_two_computes_the_same_tokens(tiny_artifact_path):
    # the Program addresses position p as (p // page_size, p % page_size) and needs nothing more
    p = prompt(23, seed=3)
    ref = greedy_reference(tiny_program(tiny_artifact_path, "dense", page_size=16, max_model_len=64), p, 6)
    odd = greedy_reference(tiny_program(tiny_artifact_path, "dense", page_size=3, num_pages=40,
                                        max_model_len=64), p, 6)
    assert odd == ref
