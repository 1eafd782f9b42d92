"""Dimension facts of a Hugging Face config, and the exact match against registered identities.

Accepts the multimodal config (`text_config` + `vision_config`) and the flat text-only config
that `Qwen3_5(Moe)ForCausalLM.save_pretrained` writes. Only facts the checkpoint states are
compared: a text-only config carries no vision facts, and HF-saved configs omit
`mtp_num_hidden_layers` (the caller infers it from the `mtp.layers.*` tensors).
"""
from __future__ import annotations

import math
from typing import Mapping

from ninfer.convert.source import ConvertError
from ninfer.targets.package import TargetPackage
from ninfer.targets.qwen3_6.dims import VisionDims, hybrid_layer_types

MODEL_TYPES = ("qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text")
_TEXT_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                "linear_value_head_dim", "linear_conv_kernel_dim", "rms_norm_eps", "max_position_embeddings")
_DENSE_FIELDS = ("intermediate_size",)
_MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
_TOP_IDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
_VISION_FIELDS = tuple(f for f in VisionDims.__dataclass_fields__)


def config_facts(config: dict) -> dict:
    """Flattened dimension facts ({Qwen36Dims field: value}, vision facts as "vision.<field>")."""
    mt = config.get("model_type")
    if mt not in MODEL_TYPES:
        raise ConvertError(f"config.json model_type {mt!r} is not a Qwen3.6 (Qwen3.5-architecture) model; "
                           f"expected one of {', '.join(MODEL_TYPES)}")
    text = config.get("text_config", config)
    facts: dict = {}
    for f in _TEXT_FIELDS:
        if f in text:
            facts[f] = text[f]
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    for f in ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved"):
        if f in rope:
            facts[f] = rope[f]
        elif f in text:
            facts[f] = text[f]
    if "layer_types" in text:
        facts["layer_types"] = tuple(text["layer_types"])
    elif "num_hidden_layers" in text:
        facts["layer_types"] = hybrid_layer_types(text["num_hidden_layers"], text.get("full_attention_interval", 4))
    if "mrope_section" in facts:
        facts["mrope_section"] = tuple(facts["mrope_section"])
    tie = config.get("tie_word_embeddings", text.get("tie_word_embeddings"))
    if tie is not None:
        facts["tie_word_embeddings"] = bool(tie)
    if "mtp_num_hidden_layers" in text:
        facts["mtp_num_hidden_layers"] = text["mtp_num_hidden_layers"]
    moe = bool(text.get("num_experts"))
    for f in (_MOE_FIELDS if moe else _DENSE_FIELDS):
        if f in text:
            facts[f] = text[f]
    if not moe:
        facts["num_experts"] = 0
    if "vision_config" in config:
        vc = config["vision_config"]
        for f in _VISION_FIELDS:
            if f in vc:
                facts[f"vision.{f}"] = vc[f]
        for f in _TOP_IDS:
            if f in config:
                facts[f] = config[f]
    return facts


def package_facts(package: TargetPackage) -> dict:
    d = package.dims.as_dict()
    vision = d.pop("vision") or {}
    out = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items()}
    out.update({f"vision.{k}": v for k, v in vision.items()})
    return out


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and float(a) == float(b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return tuple(a) == tuple(b)
    return a == b


def differences(facts: dict, package: TargetPackage) -> list[str]:
    want = package_facts(package)
    out = []
    for k, v in facts.items():
        if k not in want:
            continue
        if not _same(v, want[k]):
            shown = v if not isinstance(v, tuple) or len(v) <= 8 else f"{len(v)} entries"
            exp = want[k] if not isinstance(want[k], tuple) or len(want[k]) <= 8 else f"{len(want[k])} entries"
            out.append(f"{k}={shown!r} (expected {exp!r})")
    return out


def _ffn_kind(num_experts) -> str:
    return "MoE" if num_experts else "dense"


def _size_distance(facts: dict, package: TargetPackage) -> float:
    """How far the checkpoint's sizes are from the package's (sum of |log ratio| of the main sizes)."""
    want = package_facts(package)
    out = 0.0
    for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "moe_intermediate_size", "num_experts"):
        a, b = facts.get(k), want.get(k)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > 0 and b > 0:
            out += abs(math.log(a / b))
    return out


def _summary(facts: dict) -> str:
    ffn = (f"MoE {facts.get('num_experts')} experts" if facts.get("num_experts")
           else f"dense FFN {facts.get('intermediate_size', '?')}")
    return f"{ffn}, {facts.get('num_hidden_layers', '?')} layers, hidden {facts.get('hidden_size', '?')}"


def match_identity(facts: dict, candidates: Mapping[str, TargetPackage], target: str | None = None) -> TargetPackage:
    """The one candidate whose dimension facts equal the checkpoint's; else a ConvertError naming
    every differing field of the closest candidate (or of `target` when given). Closest compares
    like with like: among the candidates of the checkpoint's FFN kind (dense or MoE) where there are
    any, the fewest differing fields, then the nearest sizes."""
    if target is not None:
        if target not in candidates:
            raise ConvertError(f"unknown --target {target!r}; known identities: {', '.join(sorted(candidates))}")
        diff = differences(facts, candidates[target])
        if diff:
            raise ConvertError(f"checkpoint does not match {target}: {len(diff)} differing field(s): {'; '.join(diff)}")
        return candidates[target]
    exact = sorted(ident for ident, p in candidates.items() if not differences(facts, p))
    if len(exact) == 1:
        return candidates[exact[0]]
    if len(exact) > 1:
        raise ConvertError(f"checkpoint matches several identities ({', '.join(exact)}); choose one with --target")
    kind = _ffn_kind(facts.get("num_experts"))
    same_kind = {i: p for i, p in candidates.items() if _ffn_kind(p.dims.num_experts) == kind} or candidates
    closest = min(same_kind, key=lambda i: (len(differences(facts, same_kind[i])), _size_distance(facts, same_kind[i]), i))
    diff = differences(facts, candidates[closest])
    raise ConvertError(f"checkpoint matches no known identity (`ninfer identities` lists them): it has "
                       f"{_summary(facts)}; of the {_ffn_kind(candidates[closest].dims.num_experts)} identities the "
                       f"closest is {closest}, with {len(diff)} differing field(s): {'; '.join(diff)}")
