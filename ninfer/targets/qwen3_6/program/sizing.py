"""How large the Program's fixed resources are: the provisional area and the KV page pool.

Both are decided once, at start, before anything is allocated (nothing is resized later):

    StateImage entries   config.num_slots                      slots of sequences and checkpoints
                         + num_scratch(config)                 the provisional area (below)
    KV pages             pool_pages(...)                       config.num_pages, or what fits in a
                                                               share of the free device memory
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ninfer.targets.qwen3_6.dims import Qwen36Dims
from ninfer.targets.qwen3_6.program import prefill_graphs
from ninfer.targets.qwen3_6.program.config import ProgramConfig
from ninfer.targets.qwen3_6.program.model import state_planes


def graphs_may_run(config: ProgramConfig) -> bool:
    """Whether this Program may capture CUDA graphs (decode, prefill stages): CUDA, not eager, Generation."""
    return config.torch_device.type == "cuda" and not config.enforce_eager and config.purpose == "generation"


def num_scratch(config: ProgramConfig) -> int:
    """Entries of the provisional area: the caller's open batches (`config.num_scratch`, by default any
    batch of max_batch rows x max_steps steps) and what the Program's own CUDA graphs hold beside them:
    the step-ahead's entry per row between rounds (step_ahead.py) and a prefill graph capture's one."""
    own = 0
    if graphs_may_run(config):
        ahead = config.decode_step_ahead and not config.speculative_method
        own = (config.max_batch if ahead else 0) + int(prefill_graphs.MAX_TOKENS > 0)
    return (config.num_scratch or config.max_batch * config.max_steps) + own


def kv_layers(dims: Qwen36Dims, config: ProgramConfig) -> int:
    """Layers of the paged KV store: the attention layers, and the MTP layer's with MTP speculation."""
    return len(dims.attention_layers) + (config.speculative_method == "mtp")


def free_device_bytes(device: torch.device) -> tuple[int, int]:
    """`torch.cuda.mem_get_info` once the caching allocator has given its unused blocks back.

    NOTE: a load leaves blocks cached, not free (a fused matrix's parts, model_view.fuse_rows; a
          checkpoint's staging), and the driver counts them as used: sizing the pool from the raw figure
          would leave it far smaller than the memory allows."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)


def pool_pages(dims: Qwen36Dims, config: ProgramConfig, num_scratch: int, mem_get_info: Any = None,
               workspace_bytes: int = 0) -> int:
    """KV pages of the pool: `config.num_pages`, or on CUDA with `kv_memory_fraction` > 0 at most
    that share of the memory free once the weights are loaded, less the StateImage entries.
    mem_get_info: stands in for `free_device_bytes` (tests)."""
    if config.kv_memory_fraction <= 0 or (mem_get_info is None and config.torch_device.type != "cuda"):
        return config.num_pages
    free = (mem_get_info or free_device_bytes)(config.torch_device)[0]
    elem = torch.empty((), dtype=config.torch_dtype).element_size()
    page_bytes = 2 * kv_layers(dims, config) * config.page_size * dims.num_key_value_heads * dims.head_dim * elem
    entry_bytes = sum(math.prod(spec[0]) * torch.empty((), dtype=spec[1]).element_size()
                      * (spec[2] if len(spec) > 2 else len(dims.gdn_layers))
                      for spec in state_planes(dims, config.torch_dtype, bool(config.speculative_method)).values())
    entries = config.num_slots + num_scratch
    budget = int(free * config.kv_memory_fraction) - entries * entry_bytes - workspace_bytes
    pages = min(config.num_pages, max(0, budget) // page_bytes)
    if pages * config.page_size < config.max_model_len:
        raise ValueError(f"kv_memory_fraction {config.kv_memory_fraction} of {free / 2**30:.1f} GiB free leaves "
                         f"{pages} KV pages ({pages * config.page_size} tokens) after {entries} StateImage entries "
                         f"of {entry_bytes / 2**20:.1f} MiB ({entries * entry_bytes / 2**30:.1f} GiB), fewer than "
                         f"max_model_len {config.max_model_len}: raise the fraction or lower max_model_len / "
                         f"max_concurrency")
    return pages
