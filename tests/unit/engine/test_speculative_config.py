"""EngineConfig.speculative: its forms, its validation messages, and what the composition root
(ninfer.engine.facade) derives from it for the Program (method, K, forced acceptance, max_steps,
scratch entries) and for a model without MTP weights."""
from __future__ import annotations

import dataclasses

import pytest

from ninfer.config import EngineConfig, SpeculativeConfig


@pytest.mark.parametrize("value", [{"method": "mtp", "num_speculative_tokens": 3},
                                   SpeculativeConfig("mtp", 3)])
def test_dict_and_dataclass_forms_normalize_to_one_value(value):
    cfg = EngineConfig(speculative=value)
    assert cfg.speculative == SpeculativeConfig("mtp", 3, 0) and cfg.lookahead == 3
    assert dataclasses.replace(cfg, max_concurrency=2).speculative == cfg.speculative
    assert hash(cfg) == hash(EngineConfig(speculative=SpeculativeConfig("mtp", 3)))


def test_off_by_default():
    assert EngineConfig().speculative is None and EngineConfig().lookahead == 0


def test_force_accept_len_in_the_dict_form():
    s = EngineConfig(speculative={"method": "mtp", "num_speculative_tokens": 2, "force_accept_len": 3}).speculative
    assert s.force_accept_len == 3 and s.lookahead == 2


@pytest.mark.parametrize("value, message", [
    ({"method": "eagle", "num_speculative_tokens": 3}, "speculative method must be one of mtp, got 'eagle'"),
    ({"method": "mtp", "num_speculative_tokens": 0}, "num_speculative_tokens must be an integer in 1..7, got 0"),
    ({"method": "mtp", "num_speculative_tokens": 8}, "num_speculative_tokens must be an integer in 1..7, got 8"),
    ({"method": "mtp", "num_speculative_tokens": "3"}, "num_speculative_tokens must be an integer in 1..7, got '3'"),
    ({"method": "mtp", "num_speculative_tokens": 3, "force_accept_len": 5},
     "force_accept_len must be 0 (off) or in 1..4 (num_speculative_tokens + 1), got 5"),
    ({"method": "mtp", "num_speculative_tokens": 3, "force_accept_len": -1}, "force_accept_len must be 0 (off)"),
    ({"method": "mtp", "num_speculative_tokens": 3, "draft_model": "x"},
     "speculative: unknown key(s) 'draft_model'; known: method, num_speculative_tokens, force_accept_len"),
    ({"method": "mtp"}, "speculative needs num_speculative_tokens"),
    ({"num_speculative_tokens": 2}, "speculative needs method"),
    ("mtp", "speculative must be None, a SpeculativeConfig or a dict, got str"),
])
def test_bad_values_are_refused_with_the_reason(value, message):
    with pytest.raises(ValueError) as e:
        EngineConfig(speculative=value)
    assert message in str(e.value)


def test_causal_scoring_takes_no_speculation():
    with pytest.raises(ValueError, match="speculative decoding applies to generation"):
        EngineConfig(purpose="causal_scoring", speculative={"method": "mtp", "num_speculative_tokens": 1})


# ---- the composition root -----------------------------------------------------------------------------
class _NoConfigPackage:
    """A package module without its own ProgramConfig: the facade takes the Qwen3.6 one."""


@pytest.mark.parametrize("k, force", [(1, 0), (3, 4), (7, 0)])
def test_program_config_carries_the_method_k_and_scratch_for_k_plus_one_positions(k, force):
    from ninfer.engine.facade import PROGRAM_MAX_STEPS, _program_config

    cfg = EngineConfig(device="cpu", dtype="fp32", max_concurrency=5, max_model_len=256,
                       speculative=SpeculativeConfig("mtp", k, force))
    pc = _program_config(_NoConfigPackage, cfg, 1000)
    assert (pc.speculative_method, pc.num_speculative_tokens, pc.force_accept_len) == ("mtp", k, force)
    assert pc.lookahead == k and pc.max_steps >= k + 1 and pc.max_steps >= PROGRAM_MAX_STEPS
    assert pc.num_scratch == max(5 * (k + 1), PROGRAM_MAX_STEPS)


def test_program_config_without_speculation_is_unchanged():
    from ninfer.engine.engine_core import DECODE_STEPS
    from ninfer.engine.facade import PROGRAM_MAX_STEPS, _program_config

    pc = _program_config(_NoConfigPackage, EngineConfig(device="cpu", dtype="fp32", max_concurrency=8), 1000)
    assert pc.speculative_method == "" and pc.num_speculative_tokens == 0 and pc.lookahead == 0
    assert pc.max_steps == PROGRAM_MAX_STEPS and pc.num_scratch == max(8 * DECODE_STEPS, PROGRAM_MAX_STEPS)


def test_dummy_weights_of_every_identity_with_an_mtp_layer_carry_the_mtp_group():
    from ninfer.targets.dummy_weights import DummyWeights
    from ninfer.targets.registry import REGISTRY

    for identity, package in REGISTRY.items():
        if package.dims.mtp_num_hidden_layers >= 1:
            assert DummyWeights(identity, device="cpu").has_group("mtp"), identity
