"""Semantic weight-view schema of the Qwen3.6 family: canonical tensor names and shapes.

Canonical names are the official checkpoint names with the `model.language_model.` / `model.`
prefix removed and `model.visual.` shortened to `visual.`. MoE experts are always stored fused:
`mlp.experts.gate_up_proj [E, 2I, H]` (gate rows first) and `mlp.experts.down_proj [E, H, I]`.

Groups:
  embedding  embed_tokens
  gdn        linear_attn.* of GDN layers
  attention  self_attn.* of attention layers
  ffn        mlp.* of decoder layers, input/post-attention layernorms, final norm
  mtp        mtp.*            (optional as a whole: text-only checkpoints have none)
  vision     visual.*         (optional as a whole)
  head       lm_head
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ninfer.targets.qwen3_6.dims import Qwen36Dims

REQUIRED_GROUPS = ("embedding", "gdn", "attention", "ffn", "head")
OPTIONAL_GROUPS = ("mtp", "vision")

# Tensors that may stay float32 in the artifact when the source stores them as F32
# (the 35B-A3B checkpoint does); everything else is cast to the requested dtype.
FP32_KEEP_SUFFIXES = ("linear_attn.A_log", "linear_attn.norm.weight")


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    group: str


def _attention(prefix: str, d: Qwen36Dims, group: str) -> list[TensorSpec]:
    H, hd = d.hidden_size, d.head_dim
    return [
        TensorSpec(f"{prefix}self_attn.q_proj.weight", (d.num_attention_heads * 2 * hd, H), group),
        TensorSpec(f"{prefix}self_attn.k_proj.weight", (d.num_key_value_heads * hd, H), group),
        TensorSpec(f"{prefix}self_attn.v_proj.weight", (d.num_key_value_heads * hd, H), group),
        TensorSpec(f"{prefix}self_attn.o_proj.weight", (H, d.num_attention_heads * hd), group),
        TensorSpec(f"{prefix}self_attn.q_norm.weight", (hd,), group),
        TensorSpec(f"{prefix}self_attn.k_norm.weight", (hd,), group),
    ]


def _gdn(prefix: str, d: Qwen36Dims) -> list[TensorSpec]:
    H, nv, dv = d.hidden_size, d.linear_num_value_heads, d.linear_value_head_dim
    g = "gdn"
    return [
        TensorSpec(f"{prefix}linear_attn.in_proj_qkv.weight", (d.conv_dim, H), g),
        TensorSpec(f"{prefix}linear_attn.in_proj_z.weight", (nv * dv, H), g),
        TensorSpec(f"{prefix}linear_attn.in_proj_b.weight", (nv, H), g),
        TensorSpec(f"{prefix}linear_attn.in_proj_a.weight", (nv, H), g),
        TensorSpec(f"{prefix}linear_attn.conv1d.weight", (d.conv_dim, 1, d.linear_conv_kernel_dim), g),
        TensorSpec(f"{prefix}linear_attn.dt_bias", (nv,), g),
        TensorSpec(f"{prefix}linear_attn.A_log", (nv,), g),
        TensorSpec(f"{prefix}linear_attn.norm.weight", (dv,), g),
        TensorSpec(f"{prefix}linear_attn.out_proj.weight", (H, nv * dv), g),
    ]


def _ffn(prefix: str, d: Qwen36Dims, group: str) -> list[TensorSpec]:
    H = d.hidden_size
    out = [TensorSpec(f"{prefix}input_layernorm.weight", (H,), group),
           TensorSpec(f"{prefix}post_attention_layernorm.weight", (H,), group)]
    if not d.is_moe:
        I = d.intermediate_size
        out += [TensorSpec(f"{prefix}mlp.gate_proj.weight", (I, H), group),
                TensorSpec(f"{prefix}mlp.up_proj.weight", (I, H), group),
                TensorSpec(f"{prefix}mlp.down_proj.weight", (H, I), group)]
    else:
        E, I, S = d.num_experts, d.moe_intermediate_size, d.shared_expert_intermediate_size
        out += [TensorSpec(f"{prefix}mlp.gate.weight", (E, H), group),
                TensorSpec(f"{prefix}mlp.experts.gate_up_proj", (E, 2 * I, H), group),
                TensorSpec(f"{prefix}mlp.experts.down_proj", (E, H, I), group),
                TensorSpec(f"{prefix}mlp.shared_expert.gate_proj.weight", (S, H), group),
                TensorSpec(f"{prefix}mlp.shared_expert.up_proj.weight", (S, H), group),
                TensorSpec(f"{prefix}mlp.shared_expert.down_proj.weight", (H, S), group),
                TensorSpec(f"{prefix}mlp.shared_expert_gate.weight", (1, H), group)]
    return out


def _vision(d: Qwen36Dims) -> list[TensorSpec]:
    v = d.vision
    assert v is not None
    C, p, tp, m = v.hidden_size, v.patch_size, v.temporal_patch_size, v.spatial_merge_size
    g = "vision"
    out = [TensorSpec("visual.patch_embed.proj.weight", (C, v.in_channels, tp, p, p), g),
           TensorSpec("visual.patch_embed.proj.bias", (C,), g),
           TensorSpec("visual.pos_embed.weight", (v.num_position_embeddings, C), g)]
    for b in range(v.depth):
        pre = f"visual.blocks.{b}."
        out += [TensorSpec(pre + "norm1.weight", (C,), g), TensorSpec(pre + "norm1.bias", (C,), g),
                TensorSpec(pre + "norm2.weight", (C,), g), TensorSpec(pre + "norm2.bias", (C,), g),
                TensorSpec(pre + "attn.qkv.weight", (3 * C, C), g), TensorSpec(pre + "attn.qkv.bias", (3 * C,), g),
                TensorSpec(pre + "attn.proj.weight", (C, C), g), TensorSpec(pre + "attn.proj.bias", (C,), g),
                TensorSpec(pre + "mlp.linear_fc1.weight", (v.intermediate_size, C), g),
                TensorSpec(pre + "mlp.linear_fc1.bias", (v.intermediate_size,), g),
                TensorSpec(pre + "mlp.linear_fc2.weight", (C, v.intermediate_size), g),
                TensorSpec(pre + "mlp.linear_fc2.bias", (C,), g)]
    M = C * m * m
    out += [TensorSpec("visual.merger.norm.weight", (C,), g), TensorSpec("visual.merger.norm.bias", (C,), g),
            TensorSpec("visual.merger.linear_fc1.weight", (M, M), g),
            TensorSpec("visual.merger.linear_fc1.bias", (M,), g),
            TensorSpec("visual.merger.linear_fc2.weight", (v.out_hidden_size, M), g),
            TensorSpec("visual.merger.linear_fc2.bias", (v.out_hidden_size,), g)]
    return out


def _mtp(d: Qwen36Dims) -> list[TensorSpec]:
    H = d.hidden_size
    out = [TensorSpec("mtp.fc.weight", (H, 2 * H), "mtp"),
           TensorSpec("mtp.pre_fc_norm_embedding.weight", (H,), "mtp"),
           TensorSpec("mtp.pre_fc_norm_hidden.weight", (H,), "mtp"),
           TensorSpec("mtp.norm.weight", (H,), "mtp")]
    for i in range(d.mtp_num_hidden_layers):
        out += _attention(f"mtp.layers.{i}.", d, "mtp") + _ffn(f"mtp.layers.{i}.", d, "mtp")
    return out


def tensor_specs(d: Qwen36Dims, groups: tuple[str, ...] = REQUIRED_GROUPS + OPTIONAL_GROUPS) -> list[TensorSpec]:
    """Every tensor of the given groups, in a stable order."""
    H = d.hidden_size
    specs = [TensorSpec("embed_tokens.weight", (d.vocab_size, H), "embedding")]
    for i, kind in enumerate(d.layer_types):
        pre = f"layers.{i}."
        specs += _gdn(pre, d) if kind == "linear_attention" else _attention(pre, d, "attention")
        specs += _ffn(pre, d, "ffn")
    specs.append(TensorSpec("norm.weight", (H,), "ffn"))
    if not d.tie_word_embeddings:
        specs.append(TensorSpec("lm_head.weight", (d.vocab_size, H), "head"))
    if d.mtp_num_hidden_layers:
        specs += _mtp(d)
    if d.vision is not None:
        specs += _vision(d)
    return [s for s in specs if s.group in groups]


def active_matrix_params(d: Qwen36Dims) -> int:
    """Matrix parameters one token goes through (MoE: k of E routed experts), lm_head included, the
    embedding not (a row gather)."""
    total = 0
    for s in tensor_specs(d, REQUIRED_GROUPS):
        if len(s.shape) < 2 or s.name == "embed_tokens.weight":
            continue
        n = math.prod(s.shape)
        if ".mlp.experts." in s.name:
            n = n * d.num_experts_per_tok // d.num_experts
        total += n
    return total

