"""Dimension facts of the Qwen3.6 family (Qwen3.5 architecture).

The family owns the *schema* of the dimension facts; each target package owns one filled
instance. Field names follow the Hugging Face `text_config` / `vision_config` names so that the
converter can match a checkpoint's config field by field.
"""
from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class VisionDims:
    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    num_position_embeddings: int
    out_hidden_size: int
    in_channels: int = 3


@dataclass(frozen=True, slots=True)
class Qwen36Dims:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]          # "linear_attention" | "full_attention"
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    partial_rotary_factor: float
    rope_theta: float
    mrope_section: tuple[int, ...]
    mrope_interleaved: bool
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    mtp_num_hidden_layers: int
    max_position_embeddings: int
    # FFN: dense when num_experts == 0, MoE otherwise.
    intermediate_size: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    vision: VisionDims | None = None
    image_token_id: int = 248056
    video_token_id: int = 248057
    vision_start_token_id: int = 248053
    vision_end_token_id: int = 248054

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError("layer_types must have num_hidden_layers entries")
        bad = set(self.layer_types) - {"linear_attention", "full_attention"}
        if bad:
            raise ValueError(f"unknown layer types {sorted(bad)}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")

    # ---- derived facts (never stored) ----
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def gdn_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")

    @property
    def attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def conv_dim(self) -> int:
        """Channels of the GDN causal conv: q, k and v (not z, a, b)."""
        return (2 * self.linear_num_key_heads * self.linear_key_head_dim
                + self.linear_num_value_heads * self.linear_value_head_dim)

    def as_dict(self) -> dict:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, VisionDims):
                v = {g.name: getattr(v, g.name) for g in fields(v)}
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "Qwen36Dims":
        d = dict(d)
        if d.get("vision") is not None:
            d["vision"] = VisionDims(**d["vision"])
        d["layer_types"] = tuple(d["layer_types"])
        d["mrope_section"] = tuple(d["mrope_section"])
        return cls(**d)


def hybrid_layer_types(num_layers: int, interval: int = 4) -> tuple[str, ...]:
    return tuple("full_attention" if (i + 1) % interval == 0 else "linear_attention"
                 for i in range(num_layers))
