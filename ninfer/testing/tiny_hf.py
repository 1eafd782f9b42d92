"""Build tiny random Qwen3.6-architecture checkpoints with Hugging Face `transformers` (test oracle).

`transformers` is a test-only dependency: import this module only from tests and benchmarks.

Layouts written:
  text        `Qwen3_5ForCausalLM` / `Qwen3_5MoeForCausalLM` save_pretrained (`model.*`, per-expert MoE)
  vl          `Qwen3_5ForConditionalGeneration` / `...Moe...` (`model.language_model.*`, `model.visual.*`)
  official    the vl layout with MoE main experts rewritten fused (`experts.gate_up_proj`, `down_proj`)
Every layout gets injected official-style `mtp.*` tensors (per-expert MTP experts for MoE) unless
`mtp=False`. The injected MTP tensors are seeded random values; HF drops them on load.

Storage dtype (`dtype`, default "bf16"): as in the official checkpoints, every tensor is stored BF16
except `linear_attn.A_log` and `linear_attn.norm.weight`, which stay F32 (as the 35B-A3B stores them).
`build_hf_model` rounds the same parameters to bf16 values while the model stays fp32, so the HF model,
the checkpoint and an artifact converted from it (fp32 or bf16) hold identical numbers. dtype="fp32"
keeps the unrounded fp32 draws and stores them F32 (a source for the converter's fp32 -> bf16 cast).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ninfer.targets.qwen3_6.dims import Qwen36Dims
from ninfer.targets.registry import lookup

KINDS = {"dense": "qwen3_6-tiny-dense", "moe": "qwen3_6-tiny-moe"}
DTYPES = ("bf16", "fp32")


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def _stored_bf16(name: str, dtype: str) -> bool:
    """Whether tensor `name` is stored (and its values rounded) as bf16 under storage `dtype`."""
    from ninfer.targets.qwen3_6.schema import FP32_KEEP_SUFFIXES

    return dtype == "bf16" and not name.endswith(FP32_KEEP_SUFFIXES)


def _to_bf16_values(name: str, t: torch.Tensor, dtype: str) -> torch.Tensor:
    """`t` (fp32) with its values rounded to bf16 where `name` is stored bf16; still fp32."""
    return t.to(torch.bfloat16).to(t.dtype) if _stored_bf16(name, dtype) else t


def hf_text_config_kwargs(d: Qwen36Dims) -> dict:
    kw = dict(vocab_size=d.vocab_size, hidden_size=d.hidden_size, num_hidden_layers=d.num_hidden_layers,
              num_attention_heads=d.num_attention_heads, num_key_value_heads=d.num_key_value_heads,
              head_dim=d.head_dim, linear_conv_kernel_dim=d.linear_conv_kernel_dim,
              linear_key_head_dim=d.linear_key_head_dim, linear_value_head_dim=d.linear_value_head_dim,
              linear_num_key_heads=d.linear_num_key_heads, linear_num_value_heads=d.linear_num_value_heads,
              layer_types=list(d.layer_types), rms_norm_eps=d.rms_norm_eps,
              max_position_embeddings=d.max_position_embeddings, tie_word_embeddings=d.tie_word_embeddings,
              rope_parameters={"rope_type": "default", "rope_theta": d.rope_theta,
                               "partial_rotary_factor": d.partial_rotary_factor,
                               "mrope_section": list(d.mrope_section),
                               "mrope_interleaved": d.mrope_interleaved},
              bos_token_id=248044, eos_token_id=248044)
    if d.is_moe:
        kw.update(num_experts=d.num_experts, num_experts_per_tok=d.num_experts_per_tok,
                  moe_intermediate_size=d.moe_intermediate_size,
                  shared_expert_intermediate_size=d.shared_expert_intermediate_size)
    else:
        kw.update(intermediate_size=d.intermediate_size)
    return kw


def hf_vision_config_kwargs(d: Qwen36Dims) -> dict:
    v = d.vision
    assert v is not None
    return dict(depth=v.depth, hidden_size=v.hidden_size, intermediate_size=v.intermediate_size,
                num_heads=v.num_heads, patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
                spatial_merge_size=v.spatial_merge_size, num_position_embeddings=v.num_position_embeddings,
                out_hidden_size=v.out_hidden_size, in_channels=v.in_channels, deepstack_visual_indexes=[])


def build_hf_model(kind: str, layout: str = "text", seed: int = 0, init_std: float = 0.02, dtype: str = "bf16"):
    """Return a seeded random HF model (eval mode, fp32) of the tiny identity `kind` (dense|moe).

    dtype "bf16": each parameter that a checkpoint stores BF16 holds bf16-rounded values (see the module
    docstring); "fp32": the fp32 draws as they are."""
    import transformers as tf

    _check_dtype(dtype)
    d = lookup(KINDS[kind]).dims
    text_kw = hf_text_config_kwargs(d)
    torch.manual_seed(seed)
    if layout == "text":
        cfg_cls = tf.Qwen3_5MoeTextConfig if d.is_moe else tf.Qwen3_5TextConfig
        cfg = cfg_cls(**text_kw, initializer_range=init_std)
        model_cls = tf.Qwen3_5MoeForCausalLM if d.is_moe else tf.Qwen3_5ForCausalLM
    else:
        cfg_cls = tf.Qwen3_5MoeConfig if d.is_moe else tf.Qwen3_5Config
        cfg = cfg_cls(text_config={**text_kw, "initializer_range": init_std},
                      vision_config=hf_vision_config_kwargs(d), tie_word_embeddings=False)
        model_cls = tf.Qwen3_5MoeForConditionalGeneration if d.is_moe else tf.Qwen3_5ForConditionalGeneration
    model = model_cls(cfg).eval()
    # Norm weights are initialised to constants by HF; perturb them so (1+w) vs w mistakes show.
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
            if name.endswith("dt_bias"):
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
        for name, p in model.named_parameters():
            p.copy_(_to_bf16_values(name, p, dtype))
    return model


def _mtp_tensors(d: Qwen36Dims, seed: int, std: float = 0.02, dtype: str = "bf16") -> dict[str, torch.Tensor]:
    """The injected `mtp.*` tensors (fp32; values rounded to bf16 under dtype "bf16")."""
    from ninfer.targets.qwen3_6.schema import tensor_specs

    g = torch.Generator().manual_seed(seed + 7)
    out: dict[str, torch.Tensor] = {}
    for spec in tensor_specs(d, groups=("mtp",)):
        if ".mlp.experts.gate_up_proj" in spec.name or ".mlp.experts.down_proj" in spec.name:
            continue
        if spec.name.endswith("norm.weight") or spec.name.endswith("layernorm.weight"):
            out[spec.name] = torch.randn(spec.shape, generator=g) * 0.1
        else:
            out[spec.name] = torch.randn(spec.shape, generator=g) * std
    if d.is_moe:  # per-expert MTP experts, as the official 35B-A3B checkpoint stores them
        E, I, H = d.num_experts, d.moe_intermediate_size, d.hidden_size
        for i in range(d.mtp_num_hidden_layers):
            for e in range(E):
                pre = f"mtp.layers.{i}.mlp.experts.{e}."
                out[pre + "gate_proj.weight"] = torch.randn((I, H), generator=g) * std
                out[pre + "up_proj.weight"] = torch.randn((I, H), generator=g) * std
                out[pre + "down_proj.weight"] = torch.randn((H, I), generator=g) * std
    return {k: _to_bf16_values(k, v, dtype) for k, v in out.items()}


def _fuse_main_experts(sd: dict[str, torch.Tensor], E: int) -> dict[str, torch.Tensor]:
    """Rewrite per-expert main-layer experts into the official fused layout."""
    out = {k: v for k, v in sd.items() if ".mlp.experts." not in k or k.startswith("mtp.")}
    prefixes = sorted({k.split(".mlp.experts.")[0] for k in sd if ".mlp.experts." in k and not k.startswith("mtp.")})
    for p in prefixes:
        gate = [sd[f"{p}.mlp.experts.{e}.gate_proj.weight"] for e in range(E)]
        up = [sd[f"{p}.mlp.experts.{e}.up_proj.weight"] for e in range(E)]
        down = [sd[f"{p}.mlp.experts.{e}.down_proj.weight"] for e in range(E)]
        out[f"{p}.mlp.experts.gate_up_proj"] = torch.stack([torch.cat([g_, u_], 0) for g_, u_ in zip(gate, up)])
        out[f"{p}.mlp.experts.down_proj"] = torch.stack(down)
    return out


def _expand_fused(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF keeps experts fused in memory; write them per expert as `save_pretrained` would."""
    out = {}
    for k, v in sd.items():
        if k.endswith(".mlp.experts.gate_up_proj"):
            p = k[: -len("gate_up_proj")]
            I = v.shape[1] // 2
            for e in range(v.shape[0]):
                out[f"{p}{e}.gate_proj.weight"] = v[e, :I].clone()
                out[f"{p}{e}.up_proj.weight"] = v[e, I:].clone()
        elif k.endswith(".mlp.experts.down_proj"):
            p = k[: -len("down_proj")]
            for e in range(v.shape[0]):
                out[f"{p}{e}.down_proj.weight"] = v[e].clone()
        else:
            out[k] = v
    return out


def save_safetensors(sd: dict[str, torch.Tensor], out_dir: str | os.PathLike, shards: int = 1) -> None:
    """Write `sd` as `model.safetensors`, or (shards > 1) as `model-0000i-of-0000n.safetensors` files
    with the `model.safetensors.index.json` that maps each name to its shard."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    names = sorted(sd)
    if shards <= 1:
        save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    per = (len(names) + shards - 1) // shards
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: sd[k] for k in names[s * per:(s + 1) * per]}
        save_file(part, str(out / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))


def write_tiny_checkpoint(out_dir: str | os.PathLike, kind: str, layout: str = "text", *, seed: int = 0,
                          mtp: bool = True, shards: int = 1, init_std: float = 0.02, dtype: str = "bf16") -> Path:
    """Write a tiny checkpoint directory (config.json + safetensors [+ index]); return its path.

    layout: "text" (model.*), "vl" (model.language_model.* + model.visual.*), "official" (vl with
    fused MoE main experts). dtype: "bf16" (BF16 tensors, A_log / GDN norm F32) or "fp32" (all F32);
    see the module docstring. Tokenizer files are not written here (the frontend tests build them).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    d = lookup(KINDS[kind]).dims
    model = build_hf_model(kind, "text" if layout == "text" else "vl", seed=seed, init_std=init_std, dtype=dtype)
    model.config.save_pretrained(out)
    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if d.is_moe:
        sd = _expand_fused(sd)
        if layout == "official":
            sd = _fuse_main_experts(sd, d.num_experts)
    if mtp:
        sd.update(_mtp_tensors(d, seed, dtype=dtype))
    sd = {k: v.to(torch.bfloat16) if _stored_bf16(k, dtype) else v for k, v in sd.items()}
    save_safetensors(sd, out, shards)
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 248044, "eos_token_id": [248046, 248044], "pad_token_id": 248044,
         "do_sample": True, "temperature": 1.0, "top_k": 20, "top_p": 0.95}, indent=2))
    return out
