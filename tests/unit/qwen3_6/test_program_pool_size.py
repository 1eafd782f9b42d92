"""KV pool sizing from a device-memory fraction (the CUDA path, driven here by a fake mem_get_info)."""
from __future__ import annotations

import importlib

import pytest

from ninfer.targets.qwen3_6.program.config import ProgramConfig
from ninfer.engine.engine_core import DECODE_STEPS
from ninfer.targets.qwen3_6.program import sizing
from ninfer.targets.registry import lookup

D27 = lookup("qwen3_6-27b").dims
GiB = 1 << 30
# 27B bf16: one 16-token page of all 16 attention layers' K and V = 2*16*16*4*256*2 B = 1 MiB;
# one StateImage entry = 48 GDN layers x (conv 10240x3 bf16 + recurrent 48x128x128 fp32) = 146.8 MiB.
ENTRY_27B = 48 * (10240 * 3 * 2 + 48 * 128 * 128 * 4)


def _cfg(**kw):
    base = dict(device="cpu", dtype="bf16", page_size=16, num_pages=4096, num_slots=8, max_model_len=8192,
                max_batch=4, max_steps=2, kv_memory_fraction=0.5)
    base.update(kw)
    return ProgramConfig(**base)


def test_fraction_caps_the_pool_at_the_free_memory_share():
    free = 40 * GiB
    pages = sizing.pool_pages(D27, _cfg(num_pages=10**6), 8, mem_get_info=lambda dev: (free, 0))
    assert pages == (free // 2 - (8 + 8) * ENTRY_27B) // (1 << 20)
    # the full-length size stays the upper bound when memory is plentiful
    assert sizing.pool_pages(D27, _cfg(num_pages=4096), 8, mem_get_info=lambda dev: (free, 0)) == 4096


def test_too_little_memory_for_one_full_length_sequence_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than max_model_len 8192"):
        sizing.pool_pages(D27, _cfg(), 8, mem_get_info=lambda dev: (4 * GiB, 0))


def test_no_fraction_or_cpu_keeps_num_pages():
    assert sizing.pool_pages(D27, _cfg(kv_memory_fraction=0.0), 8, mem_get_info=lambda dev: (1, 0)) == 4096
    assert sizing.pool_pages(D27, _cfg(), 8) == 4096          # CPU: no device memory to ask about


def _engine_program_config(identity, max_concurrency=8, max_model_len=8192):
    from ninfer.engine.facade import _program_config
    from ninfer.config import EngineConfig
    ent = lookup(identity)
    cfg = EngineConfig(load_format="dummy", identity=identity, device="cuda", dtype="bf16",
                       max_concurrency=max_concurrency, max_model_len=max_model_len)
    return ent.dims, _program_config(importlib.import_module(ent.module), cfg, 248077)


@pytest.mark.parametrize("identity, free_gib", [("qwen3_6-35b-a3b", 11.3), ("qwen3_6-27b", 26.2)])
def test_an_engine_serves_eight_lanes_of_8k_on_an_80gb_card(identity, free_gib):
    # NOTE: free_gib is what an 80 GB card has free once each model's weights are loaded (docs/performance.md,
    #       "Memory and loading"). A provisional area of max_batch x max_steps = 64 entries (61 MiB each on the
    #       35B-A3B, 147 on the 27B) would take more than the KV budget and leave 0 KV pages; the Engine sizes it
    #       to its largest unit, plus what the Program's graphs hold (the step-ahead's entry per lane, a capture's).
    dims, pc = _engine_program_config(identity)
    assert pc.num_scratch == max(8 * DECODE_STEPS, pc.max_steps) < pc.max_batch * pc.max_steps
    mem = lambda dev: (int(free_gib * GiB), 80 * GiB)          # noqa: E731
    pages = sizing.pool_pages(dims, pc, sizing.num_scratch(pc), mem_get_info=mem)
    assert pages * pc.page_size >= 8192
    with pytest.raises(ValueError, match="leaves 0 KV pages"):
        sizing.pool_pages(dims, pc, pc.max_batch * pc.max_steps, mem_get_info=mem)


def test_the_engine_provisional_area_fits_its_largest_units():
    _, pc = _engine_program_config("qwen3_6-tiny-dense", max_concurrency=1, max_model_len=512)
    # one lane: a control unit's forced suffix (up to max_steps tokens) is the largest batch
    assert pc.num_scratch >= pc.max_steps and pc.num_scratch >= 2 * pc.max_batch
    # the Program adds its graphs' entries on CUDA: the step-ahead's one per row, a prefill capture's one
    assert sizing.num_scratch(pc) == pc.num_scratch + pc.max_batch + 1
    with pytest.raises(ValueError, match="num_scratch must be 0"):
        _cfg(max_batch=4, max_steps=2, num_scratch=3)
    assert _cfg(max_batch=4, max_steps=2, num_scratch=4).num_scratch == 4


def test_the_program_adds_its_graphs_entries_to_the_callers_area():
    eager = dict(device="cuda", enforce_eager=True)
    assert sizing.num_scratch(_cfg()) == 4 * 2                                  # CPU: no graphs, the default area
    assert sizing.num_scratch(_cfg(num_scratch=5)) == 5
    assert sizing.num_scratch(_cfg(**eager)) == 4 * 2
    assert sizing.num_scratch(_cfg(device="cuda")) == 4 * 2 + 4 + 1            # + the step-ahead's rows, a capture
    assert sizing.num_scratch(_cfg(device="cuda", num_scratch=5, decode_step_ahead=False)) == 5 + 1

