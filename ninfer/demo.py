"""The built-in demo model: what `ninfer generate|chat|serve` run when no model is given.

It is the registered `qwen3_6-tiny-dense` identity with deterministic seeded random weights
(normal, std 0.02, like Hugging Face's init; norm weights perturbed) and the real Qwen3.6
tokenizer and chat template. Everything but the weights is real, so its text is meaningless.
The weights are bf16, stored bf16 like the real checkpoints' (`linear_attn.A_log` and
`linear_attn.norm.weight` fp32, as the 35B-A3B stores them); the CPU computes in fp32 all the same.

The artifact is built on first use into the user cache directory
(`$NINFER_CACHE_DIR`, else `$XDG_CACHE_HOME/ninfer`, else `~/.cache/ninfer`), written atomically
with `ninfer.artifact.write_artifact`, reused later, and rebuilt when it no longer opens.
No `transformers` is needed: the weights come from a seeded `torch.Generator`.

Deliberate tweaks, so that it behaves like a language model in the ways a user sees:
1. The lm_head rows past the tokenizer's vocabulary (the 243 padding ids of the 248,320-row head)
   never win, as in a trained checkpoint. Every embedding gets a constant +0.3 in hidden dimension 0
   (so the final hidden state points that way) and each padding row is -30 in that dimension and 0
   elsewhere, which keeps their logits far below every real token's.
2. The real rows of the head are 0 in dimension 0 (the shared offset favours no token) and all of
   one norm, HEAD_ROW_NORM (to bf16 precision): no row is long enough to win whatever the state, and the next-token
   distribution is peaked (its top token holds a few percent to tens of percent) rather than flat
   over the vocabulary.
3. The output depends on the whole prompt, not only on its last token (which is the same for every
   chat prompt). Each attention layer (and the MTP layer's) attends uniformly over its context (zero
   key projection) and carries the normed hidden state through (identity added to the value
   projection, dimensions 1.. only, and to the output projection, split over the heads), so every
   position adds the mean of the context's token-specific directions to its state. Different prompts
   reach different states, and sampling with the family's own defaults (GENERATION_CONFIG:
   temperature 1.0, top-k 20, top-p 0.95) draws from different top-k sets.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterator

import torch

from ninfer.paths import file_lock, user_cache_dir

DEMO_IDENTITY = "qwen3_6-tiny-dense"
DEMO_MODEL_NAME = "ninfer-demo"
DEMO_SEED = 1234
INIT_STD = 0.02
# NOTE: bump when the produced weights or resources change, so a stale cache file is not reused.
DEMO_VERSION = 4
DEMO_NOTICE = ("note: using the built-in demo model (qwen3_6-tiny-dense with random weights): "
               "its text is meaningless; pass a .ninfer file or a Hugging Face checkpoint directory "
               "to use a real model")
EOS_TOKEN_IDS = (248046, 248044)        # <|im_end|>, <|endoftext|>
TOKENIZER_VOCAB_SIZE = 248077           # ids past this are lm_head padding
EMBED_OFFSET = 0.3
PAD_ROW_WEIGHT = -30.0
HEAD_ROW_NORM = 4.0                     # tweak 2
CONTEXT_MIX = 1.0                       # scale of the attention layers' identity path (tweak 3)
# The Qwen3.6 checkpoints' own generation_config.json.
GENERATION_CONFIG = {"bos_token_id": 248044, "do_sample": True, "eos_token_id": list(EOS_TOKEN_IDS),
                     "pad_token_id": 248044, "temperature": 1.0, "top_k": 20, "top_p": 0.95}


def demo_artifact_path() -> Path:
    return user_cache_dir() / "demo" / f"{DEMO_IDENTITY}-seed{DEMO_SEED}-v{DEMO_VERSION}.ninfer"


def demo_tensors(seed: int = DEMO_SEED, groups: tuple[str, ...] | None = None, *,
                 context_mix: float = CONTEXT_MIX) -> Iterator[tuple[str, torch.Tensor]]:
    """(canonical name, tensor) of the demo weights, generated one at a time (deterministic): computed
    in fp32, then bf16 but for the fp32 `linear_attn.A_log` / `linear_attn.norm.weight`.
    context_mix 0: the attention layers keep their plain random weights (no tweak 3)."""
    from ninfer.targets.qwen3_6.schema import FP32_KEEP_SUFFIXES, REQUIRED_GROUPS, tensor_specs
    from ninfer.targets.registry import lookup

    dims = lookup(DEMO_IDENTITY).dims
    g = torch.Generator().manual_seed(seed)
    for spec in tensor_specs(dims, groups or REQUIRED_GROUPS + ("mtp",)):
        name, shape = spec.name, spec.shape
        if name.endswith("linear_attn.A_log"):
            t = torch.empty(shape).uniform_(1.0, 16.0, generator=g).log_()
        elif name.endswith("linear_attn.dt_bias"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("linear_attn.norm.weight"):         # gated RMSNorm: weight used as is
            t = 1.0 + 0.1 * torch.randn(shape, generator=g)
        elif name.endswith("norm.weight") or name.endswith("layernorm.weight"):   # (1 + weight) norms
            t = 0.1 * torch.randn(shape, generator=g)
        else:
            t = INIT_STD * torch.randn(shape, generator=g)
        if name == "embed_tokens.weight":
            t[:, 0] += EMBED_OFFSET
        elif name == "lm_head.weight":
            real = t[:TOKENIZER_VOCAB_SIZE]
            real[:, 0] = 0.0
            real *= HEAD_ROW_NORM / real.norm(dim=1, keepdim=True)
            t[TOKENIZER_VOCAB_SIZE:] = 0.0
            t[TOKENIZER_VOCAB_SIZE:, 0] = PAD_ROW_WEIGHT
        elif not context_mix:
            pass
        elif name.endswith("self_attn.k_proj.weight"):
            t.zero_()
        elif name.endswith("self_attn.v_proj.weight"):
            eye = torch.eye(dims.hidden_size)  # NOTE: head_dim == hidden_size in the demo identity
            eye[0, 0] = 0.0                     # not the shared offset: only what tells tokens apart
            t += eye.repeat(dims.num_key_value_heads, 1)
        elif name.endswith("self_attn.o_proj.weight"):
            heads = dims.num_attention_heads
            t += (context_mix / heads) * torch.eye(dims.hidden_size).repeat(1, heads)
        yield name, (t if name.endswith(FP32_KEEP_SUFFIXES) else t.to(torch.bfloat16))


def demo_resources() -> dict[str, bytes]:
    """The real Qwen3.6 tokenizer files and chat template, and the family's generation config."""
    from ninfer.targets.qwen3_6.frontend.vocab import write_tokenizer_files

    with tempfile.TemporaryDirectory(prefix="ninfer-demo-") as d:
        write_tokenizer_files(d)
        res = {name: (Path(d) / name).read_bytes()
               for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")}
    res["generation_config.json"] = json.dumps(GENERATION_CONFIG, indent=2).encode()
    return res


def _opens(path: Path) -> bool:
    from ninfer.artifact import open_artifact

    try:
        art = open_artifact(path)
    except Exception:           # noqa: BLE001 - any failure to open means "rebuild"
        return False
    try:
        return art.identity == DEMO_IDENTITY
    finally:
        art.close()


def build_demo_artifact(path: str | os.PathLike, seed: int = DEMO_SEED,
                        on_tensor: Callable[[str, int], None] | None = None) -> Path:
    from ninfer.artifact import write_artifact

    return write_artifact(path, DEMO_IDENTITY, demo_tensors(seed), demo_resources(), dtype="bf16",
                          eos_token_ids=EOS_TOKEN_IDS,
                          source={"kind": "ninfer-demo", "seed": seed, "init_std": INIT_STD,
                                  "version": DEMO_VERSION}, on_tensor=on_tensor)


def ensure_demo_artifact(on_build: Callable[[Path], None] | None = None) -> Path:
    """The demo artifact's path, building it first if it is missing or does not open."""
    path = demo_artifact_path()
    if path.exists() and _opens(path):
        return path
    with file_lock(path.with_suffix(".lock")):
        if path.exists() and _opens(path):      # another process built it meanwhile
            return path
        if on_build is not None:
            on_build(path)
        build_demo_artifact(path)
    return path
