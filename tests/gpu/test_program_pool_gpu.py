"""KV pool sizing on a real CUDA device: the memory a load left in the caching allocator counts as free.
(The CPU-side sizing tests, with a fake mem_get_info, are tests/unit/qwen3_6/test_program_pool_size.py.)"""
from __future__ import annotations

import pytest
import torch

from ninfer.targets.qwen3_6.program.config import ProgramConfig
from ninfer.targets.qwen3_6.program.model_view import fuse_rows
from ninfer.targets.qwen3_6.program.sizing import pool_pages
from ninfer.targets.registry import lookup

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

D27 = lookup("qwen3_6-27b").dims
GiB = 1 << 30
# 27B bf16: one StateImage entry = 48 GDN layers x (conv 10240x3 bf16 + recurrent 48x128x128 fp32).
ENTRY_27B = 48 * (10240 * 3 * 2 + 48 * 128 * 128 * 4)


def test_the_pool_counts_the_blocks_a_load_left_cached_as_free():
    # A fusion (model_view.fuse_rows) leaves its parts' blocks in the caching allocator, and the driver
    # counts them as used: the pool sizing must count those cached blocks as free, or a server that
    # fused a whole model's parts sizes too few KV pages.
    dev = torch.device("cuda")
    torch.cuda.empty_cache()
    before = torch.cuda.mem_get_info(dev)[0]
    # NOTE: in a process that ran other tests first, segments their live tensors share stay reserved
    #       after empty_cache; only the slack this test adds is the fusion's.
    slack = torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev)
    t = {f"p{i}": torch.empty(256 << 20, dtype=torch.uint8, device=dev) for i in range(4)}
    fused = fuse_rows(t, tuple(t))                      # 1 GiB fused; the four 256 MiB parts now cached
    del t
    assert torch.cuda.mem_get_info(dev)[0] < before - GiB - 512 * (1 << 20)
    cfg = ProgramConfig(device="cuda", dtype="bf16", page_size=16, num_pages=10**6, num_slots=8, max_model_len=16,
                        max_batch=4, max_steps=2, kv_memory_fraction=0.5)
    pages = pool_pages(D27, cfg, 8)
    seen = (pages * (1 << 20) + (8 + 8) * ENTRY_27B) / cfg.kv_memory_fraction
    assert seen >= before - GiB - 64 * (1 << 20)        # only the fused matrix is used
    assert torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev) < slack + 64 * (1 << 20)
    del fused
