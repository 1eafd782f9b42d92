"""How large the Program's fixed resources are: the provisional area and the KV page pool, and what
the whole Program will take of the device's memory (`estimate_memory`, read before anything loads).

Both are decided once, at start, before anything is allocated (nothing is resized later):

    StateImage entries   config.num_slots                      slots of sequences and checkpoints
                         + num_scratch(config)                 the provisional area (below)
    KV pages             pool_pages(...)                       config.num_pages, or what fits in a
                                                               share of the free device memory

What a Program takes (`MemoryEstimate`; the Engine compares it with the device's memory before loading):

    weights      every tensor loaded, in the model dtype (A_log and the GDN norm in fp32)
    kv_pool      (num_pages + 1 spare) x page_bytes          2 x KV layers x page_size x nkv x hd
    state        (num_slots + num_scratch) x entry_bytes     conv + recurrent (+ mtp_hidden) of every GDN layer
    workspace    one prefill stage's activations (an estimate), a decode round's logits, the vision tower's
                 workspace for the largest admitted media (CUDA), the CausalScoring staging (scoring.py)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ninfer.targets.qwen3_6.dims import Qwen36Dims
from ninfer.targets.qwen3_6.program import prefill_graphs
from ninfer.targets.qwen3_6.program.config import ProgramConfig
from ninfer.targets.qwen3_6.program.model import state_planes
from ninfer.targets.qwen3_6.schema import FP32_KEEP_SUFFIXES, REQUIRED_GROUPS, tensor_specs


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


def element_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def page_bytes(dims: Qwen36Dims, config: ProgramConfig, layers: int | None = None) -> int:
    """One KV page of every KV layer (`kv_layers`, or `layers`): K and V."""
    layers = kv_layers(dims, config) if layers is None else layers
    return 2 * layers * config.page_size * dims.num_key_value_heads * dims.head_dim * element_bytes(config.torch_dtype)


def entry_bytes(dims: Qwen36Dims, config: ProgramConfig, mtp: bool | None = None) -> int:
    """One StateImage entry: every plane of every GDN layer (`state_planes`)."""
    mtp = bool(config.speculative_method) if mtp is None else mtp
    return sum(math.prod(spec[0]) * element_bytes(spec[1]) * (spec[2] if len(spec) > 2 else len(dims.gdn_layers))
               for spec in state_planes(dims, config.torch_dtype, mtp).values())


def kv_budget_pages(dims: Qwen36Dims, config: ProgramConfig, free: int, entries: int, workspace_bytes: int = 0) -> int:
    """The KV pages that `kv_memory_fraction` of `free` bytes (the memory free once the weights are loaded)
    holds after `entries` StateImage entries and the workspace."""
    budget = int(free * config.kv_memory_fraction) - entries * entry_bytes(dims, config) - workspace_bytes
    return max(0, budget) // page_bytes(dims, config)


def pool_pages(dims: Qwen36Dims, config: ProgramConfig, num_scratch: int, mem_get_info: Any = None,
               workspace_bytes: int = 0) -> int:
    """KV pages of the pool: `config.num_pages`, or on CUDA with `kv_memory_fraction` > 0 at most
    that share of the memory free once the weights are loaded, less the StateImage entries.
    A pool that holds fewer than max_model_len tokens is an error, unless `config.fit_max_model_len`
    (the caller then lowers max_model_len to what it holds: `fitted_max_model_len`).
    mem_get_info: stands in for `free_device_bytes` (tests)."""
    if config.kv_memory_fraction <= 0 or (mem_get_info is None and config.torch_device.type != "cuda"):
        return config.num_pages
    free = (mem_get_info or free_device_bytes)(config.torch_device)[0]
    entries = config.num_slots + num_scratch
    pages = min(config.num_pages, kv_budget_pages(dims, config, free, entries, workspace_bytes))
    if pages * config.page_size < config.max_model_len and not (config.fit_max_model_len and pages):
        entry_bytes_ = entry_bytes(dims, config)
        raise ValueError(f"kv_memory_fraction {config.kv_memory_fraction} of {free / 2**30:.1f} GiB free leaves "
                         f"{pages} KV pages ({pages * config.page_size} tokens) after {entries} StateImage entries "
                         f"of {entry_bytes_ / 2**20:.1f} MiB ({entries * entry_bytes_ / 2**30:.1f} GiB), fewer than "
                         f"max_model_len {config.max_model_len}: raise the fraction or lower max_model_len / "
                         f"max_concurrency")
    return pages


def fitted_max_model_len(config: ProgramConfig, pages: int) -> int:
    """max_model_len for a pool of `pages`: config.max_model_len, or with `fit_max_model_len` at most what
    the pool holds (the estimate made before loading can exceed what the memory left after it allows)."""
    if not config.fit_max_model_len:
        return config.max_model_len
    return max(2, min(config.max_model_len, pages * config.page_size))


# ---- the memory a Program will take (read before anything is loaded) ---------------------------
@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a Program takes on its device, by region (module docstring); `page_bytes`, `entry_bytes`:
    one KV page, one StateImage entry (for sizing the pool within a budget)."""
    weights: int
    kv_pool: int
    state: int
    workspace: int
    page_bytes: int
    entry_bytes: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_pool + self.state + self.workspace


def load_groups(config: ProgramConfig, groups: tuple[str, ...]) -> tuple[str, ...]:
    """The weight groups a Program loads of a model that stores `groups`: the text model, the MTP layer with
    MTP speculation, the vision tower for generation."""
    out = REQUIRED_GROUPS + (("mtp",) if config.speculative_method == "mtp" else ())
    return out + (("vision",) if "vision" in groups and config.purpose == "generation" else ())


def loaded_bytes(dtype: torch.dtype, name: str, numel: int) -> int:
    """The device bytes of tensor `name` of `numel` elements once loaded in `dtype` (A_log and the GDN norm
    stay fp32)."""
    return numel * (4 if name.endswith(FP32_KEEP_SUFFIXES) else element_bytes(dtype))


def weight_bytes(dims: Qwen36Dims, dtype: torch.dtype, groups: tuple[str, ...]) -> int:
    """The loaded weights of these groups in `dtype` (`loaded_bytes`)."""
    return sum(loaded_bytes(dtype, s.name, math.prod(s.shape)) for s in tensor_specs(dims, groups))


def stage_bytes(dims: Qwen36Dims, config: ProgramConfig, tokens: int) -> int:
    """An estimate of one prefill stage's activations over `tokens` tokens (the widest layer's projections,
    the residual stream and its norms) and a decode unit's fp32 logits."""
    d = dims
    ffn = d.intermediate_size if not d.is_moe else (d.num_experts_per_tok * d.moe_intermediate_size
                                                   + d.shared_expert_intermediate_size)
    gdn = d.conv_dim + d.linear_num_value_heads * (d.linear_value_head_dim + 2)
    attn = 2 * d.num_attention_heads * d.head_dim + 2 * d.num_key_value_heads * d.head_dim
    width = 6 * d.hidden_size + 3 * max(2 * ffn, gdn, attn)
    logits = config.max_batch * config.max_steps * d.vocab_size * 4
    return tokens * width * element_bytes(config.torch_dtype) + logits


def scoring_bytes(dims: Qwen36Dims, config: ProgramConfig) -> int:
    """The CausalScoring staging (scoring.py) of a window of `scoring_window` (or max_model_len) tokens:
    its KV and one State entry, the logits rows and their fp32 log_softmax and rank mask."""
    from ninfer.targets.qwen3_6.program.scoring import LOGIT_BYTES
    window = config.scoring_window or config.max_model_len
    kv = math.ceil(window / config.page_size) * page_bytes(dims, config, len(dims.attention_layers))
    return kv + entry_bytes(dims, config, False) + LOGIT_BYTES * 2


def estimate_memory(dims: Qwen36Dims, config: ProgramConfig, groups: tuple[str, ...], *, prefill_tokens: int,
                    media_workspace: int = 0) -> MemoryEstimate:
    """What a Program of `config` over a model storing weight `groups` takes (module docstring); for a
    pool sized from the memory (`kv_memory_fraction` on CUDA), `config.num_pages` is its upper bound."""
    dt = config.torch_dtype
    pb, eb = page_bytes(dims, config), entry_bytes(dims, config)
    work = stage_bytes(dims, config, min(prefill_tokens, config.max_model_len)) + media_workspace
    if config.purpose == "causal_scoring":
        work += scoring_bytes(dims, config)
    return MemoryEstimate(weights=weight_bytes(dims, dt, load_groups(config, groups)),
                          kv_pool=(config.num_pages + 1) * pb, state=(config.num_slots + num_scratch(config)) * eb,
                          workspace=work, page_bytes=pb, entry_bytes=eb)


def media_workspace_bytes(dims: Qwen36Dims, config: ProgramConfig, groups: tuple[str, ...]) -> int:
    """The vision tower's workspace for the largest admitted media (media.py), where the Program sets it
    aside before sizing the pool: on CUDA, for generation, with a tower in `groups`. (The CPU's reference
    tower is not planned: its [heads, L, L] scores for the largest image exceed any host.)"""
    if "vision" not in load_groups(config, groups) or dims.vision is None or config.torch_device.type != "cuda":
        return 0
    from ninfer.targets.qwen3_6.program.vision import VisionTower
    side = max(2, int(config.max_media_patches ** 0.5) // 2 * 2)
    return VisionTower(None, dims, config.torch_device, config.torch_dtype).activation_bytes([(1, side, side)])
