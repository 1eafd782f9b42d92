"""KV pool sizing from a device-memory fraction (the CUDA path, driven here by a fake mem_get_info)."""
from __future__ import annotations

import pytest

from ninfer.targets.qwen3_6.runtime.config import ProgramConfig
from ninfer.targets.qwen3_6.runtime.program import _pool_pages
from ninfer.targets.registry import lookup

D27 = lookup("qwen3_6-27b").dims
GiB = 1 << 30


def _cfg(**kw):
    base = dict(device="cpu", dtype="bf16", page_size=16, num_pages=4096, num_slots=8, max_model_len=8192,
                max_batch=4, max_steps=2, kv_memory_fraction=0.5)
    base.update(kw)
    return ProgramConfig(**base)


def test_fraction_caps_the_pool_at_the_free_memory_share():
    # 27B bf16: one 16-token page of all 16 attention layers' K and V = 2*16*16*4*256*2 B = 1 MiB;
    # one StateImage entry = 48 GDN layers x (conv 10240x3 bf16 + recurrent 48x128x128 fp32) = 146.8 MiB.
    entry = 48 * (10240 * 3 * 2 + 48 * 128 * 128 * 4)
    free = 40 * GiB
    pages = _pool_pages(D27, _cfg(num_pages=10**6), 8, mem_get_info=lambda dev: (free, 0))
    assert pages == (free // 2 - (8 + 8) * entry) // (1 << 20)
    # the full-length size stays the upper bound when memory is plentiful
    assert _pool_pages(D27, _cfg(num_pages=4096), 8, mem_get_info=lambda dev: (free, 0)) == 4096


def test_too_little_memory_for_one_full_length_sequence_is_a_clear_error():
    with pytest.raises(ValueError, match="fewer than max_model_len 8192"):
        _pool_pages(D27, _cfg(), 8, mem_get_info=lambda dev: (4 * GiB, 0))


def test_no_fraction_or_cpu_keeps_num_pages():
    assert _pool_pages(D27, _cfg(kv_memory_fraction=0.0), 8, mem_get_info=lambda dev: (1, 0)) == 4096
    assert _pool_pages(D27, _cfg(), 8) == 4096          # CPU: no device memory to ask about
