"""Start-time configuration of one Program (fixed resources; nothing is resized at run time)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
           "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or a torch.dtype, got {dtype!r}") from None


@dataclass(frozen=True)
class ProgramConfig:
    """Fixed resources of one Program. Validation checks only what the Program itself needs to run;
    which values a user may choose is `ninfer.config.EngineConfig`'s rule, checked there once (the
    Engine builds this config from it, `ninfer.engine.facade`; tests build it directly).

    page_size      KV page size in tokens, >= 1: the pools, block tables and kernels address position p
                   as (page p // page_size, offset p % page_size) and need nothing more (the Engine
                   offers the powers of two 16..256; tests use small pages)
    num_pages      pages of the shared paged KV pool (one pool per attention layer, same page ids)
    num_slots      StateImage slots (one per active sequence; checkpoints take more later)
    max_model_len  prompt + output + lookahead limit of one sequence
    fit_max_model_len  where the pool is sized from the free memory (kv_memory_fraction), lower max_model_len
                   to what the pool holds instead of refusing (the Engine's automatic max_model_len: its
                   figure is an estimate made before the weights are loaded; sizing.fitted_max_model_len)
    max_batch      rows of one decode unit (1..8)
    max_steps      provisional depth: tokens one decode/control unit may produce per row
    num_scratch    StateImage entries for the caller's open batches (0 = max_batch x max_steps: any batch
                   of max_batch rows x max_steps steps at once); a caller whose batches are smaller sizes it
                   to them (the Engine: `ninfer.engine.facade._num_scratch`). At least max(max_batch, max_steps).
                   The Program adds the entries its own graphs hold (sizing.num_scratch)
    purpose        "generation" | "causal_scoring": only the latter allocates the scoring staging
                   (temporary window State/KV and lm_head buffers, see scoring.py)
    scoring_window longest scoring window in tokens (0 = max_model_len); causal_scoring only
    sampleable_vocab_size  ids >= this are never sampled (0 = every lm_head row): the lm_head has
                   padding rows past the tokenizer's vocabulary (248,077 of 248,320) that name no token
    enforce_eager  no CUDA graphs; otherwise a CUDA device with the fast op set captures one decode
                   graph per exact batch size 1..max_batch at start (cuda_graphs.py)
    speculative_method   "" (off) or "mtp": each decode unit is one speculative round per row (draft
                   num_speculative_tokens tokens with the checkpoint's MTP layer, verify them in one forward,
                   produce the accepted drafts and one token of the target's); the artifact must hold the
                   MTP weights (speculate.py)
    num_speculative_tokens  K, 1..7 with a method, 0 without; fixed at start (graph shapes, lookahead)
    max_media_patches  the largest image or video group the vision tower is planned for, in 16 x 16 patches
                   (65536: the family's 16.8M-pixel image): its activations are set aside before the KV pool is
                   sized, and a larger one is refused
    draft_vocab_size  the drafts are the argmax over token ids < this (0: the whole sampleable vocabulary): the
                   lm_head rows a draft step reads. Byte-level BPE ids follow the merge rank, so a prefix of the
                   ids holds the frequent tokens; verification is unchanged, so any value is lossless
    force_accept_len  0 (off) or 1..K+1: every round keeps exactly this many tokens whatever the target says
                   (a benchmarking aid for synthetic weights; the verify and commit run in full)
    decode_step_ahead  rounds of plain rows (greedy or drawn; no penalties, logit bias or log-probs)
                   through the decode graphs launch the rows' next step before they wait for their own
                   tokens, for the next round to adopt (step_ahead.py)
    """
    device: str | torch.device = "cpu"
    dtype: str | torch.dtype = "fp32"
    page_size: int = 16
    num_pages: int = 256
    num_slots: int = 8
    max_model_len: int = 4096
    fit_max_model_len: bool = False
    max_batch: int = 8
    max_steps: int = 8
    num_scratch: int = 0
    purpose: str = "generation"
    scoring_window: int = 0
    sampleable_vocab_size: int = 0
    seed: int = 0                 # unseeded sequences get consecutive RNG streams derived from it
    kv_memory_fraction: float = 0.0   # > 0 on CUDA: num_pages is an upper bound, the pool gets at most
                                      # this share of the device memory free after the weights and state
    enforce_eager: bool = False
    decode_step_ahead: bool = True
    speculative_method: str = ""
    num_speculative_tokens: int = 0
    force_accept_len: int = 0
    draft_vocab_size: int = 0
    max_media_patches: int = 65536

    def __post_init__(self) -> None:
        resolve_dtype(self.dtype)
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {self.num_pages}")
        if self.num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {self.num_slots}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if not (1 <= self.max_batch <= 8):
            raise ValueError(f"max_batch must be in 1..8, got {self.max_batch}")
        if not (1 <= self.max_steps <= 64):
            raise ValueError(f"max_steps must be in 1..64, got {self.max_steps}")
        if self.num_scratch and self.num_scratch < max(self.max_batch, self.max_steps):
            raise ValueError(f"num_scratch must be 0 (max_batch x max_steps) or at least max(max_batch, max_steps) = "
                             f"{max(self.max_batch, self.max_steps)}, got {self.num_scratch}")
        if self.purpose not in ("generation", "causal_scoring"):
            raise ValueError(f"purpose must be 'generation' or 'causal_scoring', got {self.purpose!r}")
        if self.scoring_window < 0 or (self.scoring_window and self.purpose != "causal_scoring"):
            raise ValueError(f"scoring_window must be >= 0 and is only for purpose 'causal_scoring', "
                             f"got {self.scoring_window}")

        if not (0.0 <= self.kv_memory_fraction <= 0.95):
            raise ValueError(f"kv_memory_fraction must be in [0, 0.95], got {self.kv_memory_fraction}")
        if self.speculative_method not in ("", "mtp"):
            raise ValueError(f"speculative_method must be '' (off) or 'mtp', got {self.speculative_method!r}")
        if self.speculative_method and not (1 <= self.num_speculative_tokens <= 7):
            raise ValueError(f"num_speculative_tokens must be in 1..7 with a speculative method, "
                             f"got {self.num_speculative_tokens}")
        if not self.speculative_method and (self.num_speculative_tokens or self.force_accept_len):
            raise ValueError("num_speculative_tokens and force_accept_len need a speculative_method")
        if not (0 <= self.force_accept_len <= self.num_speculative_tokens + 1):
            raise ValueError(f"force_accept_len must be 0 (off) or in 1..{self.num_speculative_tokens + 1}, "
                             f"got {self.force_accept_len}")
        if self.max_media_patches < 1:
            raise ValueError(f"max_media_patches must be >= 1, got {self.max_media_patches}")
        if self.draft_vocab_size < 0:
            raise ValueError(f"draft_vocab_size must be >= 0 (0 = the whole vocabulary), got {self.draft_vocab_size}")
        if self.speculative_method and self.max_steps < self.num_speculative_tokens + 1:
            raise ValueError(f"max_steps must be at least num_speculative_tokens + 1 = "
                             f"{self.num_speculative_tokens + 1} with speculation, got {self.max_steps}")
        if self.sampleable_vocab_size < 0:
            raise ValueError(f"sampleable_vocab_size must be >= 0, got {self.sampleable_vocab_size}")

    @property
    def lookahead(self) -> int:
        """Positions past a row's last token that one decode unit may write (the verify's drafts)."""
        return self.num_speculative_tokens if self.speculative_method else 0

    @property
    def torch_dtype(self) -> torch.dtype:
        return resolve_dtype(self.dtype)

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)
