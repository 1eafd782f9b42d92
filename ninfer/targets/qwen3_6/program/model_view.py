"""The family's semantic weight view: immutable, typed per-layer views over canonical tensors.

A package fills one `ModelView` from an artifact (or, in tests, a mapping of canonical names) by
`load_model_view`. The family schedule reads only these views; the post-mixer's tensors are kept
as a name -> tensor mapping (relative to `layers.{i}.mlp.`) because each post-mixer leaf (dense
MLP, MoE) knows its own names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from ninfer.targets.qwen3_6.dims import Qwen36Dims
from ninfer.targets.qwen3_6.schema import FP32_KEEP_SUFFIXES, tensor_specs


@dataclass(frozen=True)
class AttentionWeights:
    q_rows: torch.Tensor      # [nh * hd, H]  the query halves of q_proj's heads (the checkpoint's q_proj is
                              #               per head [query | gate]), head after head
    k_proj: torch.Tensor      # [nkv * hd, H]
    v_proj: torch.Tensor      # [nkv * hd, H]
    gate_rows: torch.Tensor   # [nh * hd, H]  the gate halves of q_proj's heads
    o_proj: torch.Tensor      # [H, nh * hd]
    q_norm: torch.Tensor      # [hd]  zero-centred
    k_norm: torch.Tensor      # [hd]  zero-centred
    in_proj: torch.Tensor     # [q_rows | k_proj | v_proj | gate_rows]: the four above are views of it


@dataclass(frozen=True)
class GDNWeights:
    in_proj_qkv: torch.Tensor  # [C, H]  contiguous [q | k | v]
    in_proj_z: torch.Tensor    # [nv * dv, H]
    in_proj_b: torch.Tensor    # [nv, H]
    in_proj_a: torch.Tensor    # [nv, H]
    conv1d: torch.Tensor       # [C, K]  (checkpoint [C, 1, K] squeezed)
    dt_bias: torch.Tensor      # [nv]
    A_log: torch.Tensor        # [nv]  (may be fp32 in a bf16 model)
    norm: torch.Tensor         # [dv]  plain weight (may be fp32)
    out_proj: torch.Tensor     # [H, nv * dv]
    in_proj: torch.Tensor      # [in_proj_qkv | in_proj_b | in_proj_a | in_proj_z] rows (parts are views)


@dataclass(frozen=True)
class LayerView:
    index: int
    kind: str                              # "linear_attention" | "full_attention"
    input_norm: torch.Tensor               # [H] zero-centred
    post_norm: torch.Tensor                # [H] zero-centred
    mixer: AttentionWeights | GDNWeights
    mlp: Mapping[str, torch.Tensor]        # names relative to `layers.{i}.mlp.`


@dataclass(frozen=True)
class MtpView:
    """The checkpoint's multi-token-prediction layer (`mtp.*`): it drafts the token after next from the
    main model's final hidden state and the next token, sharing the embedding and the lm_head."""
    fc: torch.Tensor                       # [H, 2H]  input: [norm_embedding(embed(t)) | norm_hidden(h)]
    norm_embedding: torch.Tensor           # [H] zero-centred
    norm_hidden: torch.Tensor              # [H] zero-centred
    layer: LayerView                       # one full-attention decoder layer (dense MLP or MoE), its own KV
    norm: torch.Tensor                     # [H] zero-centred, before the shared lm_head


@dataclass(frozen=True)
class ModelView:
    dims: Qwen36Dims
    embed_tokens: torch.Tensor             # [V, H]
    layers: tuple[LayerView, ...]
    norm: torch.Tensor                     # [H] zero-centred
    lm_head: torch.Tensor                  # [V, H]
    mtp: MtpView | None = None             # loaded only for speculation (`load_model_view(mtp=True)`)


def tensor_getter(weights: Any) -> Callable[[str], torch.Tensor]:
    """A canonical-name getter over an artifact (`.tensor(name)`) or a Mapping[str, Tensor]."""
    if hasattr(weights, "tensor") and callable(weights.tensor):
        return weights.tensor
    if isinstance(weights, Mapping):
        def get(name: str) -> torch.Tensor:
            try:
                return weights[name]
            except KeyError:
                raise KeyError(f"weights lack canonical tensor {name!r}") from None
        return get
    raise TypeError(f"weights must be an Artifact or a Mapping[str, Tensor], got {type(weights).__name__}")


# NOTE: projections that read the same input are one wider matrix (one GEMM per group in decode);
#       the canonical parts stay available as row views of it (no second copy is kept). The mixers'
#       in_proj put the rows the state step reads first and the output gate's rows last (GDN z,
#       attention gate), so each group is one contiguous row range: the decode graph may run the gate
#       rows as a second GEMV beside the state step (`ninfer.targets.qwen3_6.program.model`, SIDE_GATE).
#       post-mixer groups: fused name -> parts, rows in this order.
MLP_FUSED = {
    "gate_up_proj.weight": ("gate_proj.weight", "up_proj.weight"),
    "shared_in.weight": ("shared_expert.gate_proj.weight", "shared_expert.up_proj.weight",
                         "shared_expert_gate.weight", "gate.weight"),
}


# NOTE: shared_in gets zero rows after its parts up to a multiple of 8, so its GEMM's output rows are
#       16-byte aligned: cuBLAS runs the 35B-A3B's 1281-row shared_in on a slow kernel for unaligned
#       operands in prefill. Its user (the SparseMoE leaf) slices the parts
#       by offset and length. The other groups are not padded: their last part runs to the end of the
#       matrix (`main_and_gate`, `silu_mul_halves`), and at the real sizes their row counts are
#       multiples of 8 already.
ROW_MULTIPLE = {"shared_in.weight": 8}


def stored_rows(fused_name: str, rows: int) -> int:
    """The row count a fused matrix of `rows` part rows is stored with (ROW_MULTIPLE)."""
    return rows + -rows % ROW_MULTIPLE.get(fused_name, 1)


def fuse_rows(t: dict[str, torch.Tensor], names: tuple[str, ...], fused_name: str = "") -> torch.Tensor:
    """Concatenate t[names] along rows into one tensor, with zero rows after them up to
    `stored_rows(fused_name, ...)`, and replace each t[name] by its row view."""
    parts = [t[n] for n in names]
    rows = sum(p.shape[0] for p in parts)
    pad = stored_rows(fused_name, rows) - rows
    if pad:
        parts.append(parts[0].new_zeros((pad,) + tuple(parts[0].shape[1:])))
    fused = torch.cat(parts, dim=0)
    r = 0
    for n in names:
        rows = t[n].shape[0]
        t[n] = fused[r:r + rows]
        r += rows
    return fused


def load_model_view(dims: Qwen36Dims, weights: Any, device: torch.device | str, dtype: torch.dtype,
                    mtp: bool = False) -> ModelView:
    """Copy the text model's tensors to `device`/`dtype` (fp32-stored A_log / GDN norm stay fp32); with
    `mtp`, also the MTP layer's (`mtp.*`; its one decoder layer takes index num_hidden_layers).

    Each layer's groups are fused as soon as its tensors are loaded, so the parts a fusion frees are
    reused by the next layer's same-shaped parts; loading all first would hold every part's block in
    the CUDA caching allocator beside its fused copy."""
    get = tensor_getter(weights)
    per_layer: dict[int, list] = {}
    t: dict[str, torch.Tensor] = {}

    def load(spec) -> None:
        src = get(spec.name)
        if tuple(src.shape) != spec.shape:
            raise ValueError(f"tensor {spec.name} has shape {tuple(src.shape)}, schema says {spec.shape}")
        keep = src.dtype == torch.float32 and spec.name.endswith(FP32_KEEP_SUFFIXES)
        t[spec.name] = src.to(device=device, dtype=torch.float32 if keep else dtype).contiguous()

    for spec in tensor_specs(dims, ("embedding", "gdn", "attention", "ffn", "head")):
        if spec.name.startswith("layers."):
            per_layer.setdefault(int(spec.name.split(".")[1]), []).append(spec)
        else:
            load(spec)
    layers = []
    for i, kind in enumerate(dims.layer_types):
        for spec in per_layer.pop(i, ()):
            load(spec)
        layers.append(_layer_view(dims, i, kind, t))
    lm_head = t["embed_tokens.weight"] if dims.tie_word_embeddings else t["lm_head.weight"]
    view = None
    if mtp:
        if dims.mtp_num_hidden_layers != 1:
            raise ValueError(f"the MTP drafter runs one MTP layer; this model has {dims.mtp_num_hidden_layers}")
        for spec in tensor_specs(dims, ("mtp",)):
            load(spec)
        view = MtpView(t["mtp.fc.weight"], t["mtp.pre_fc_norm_embedding.weight"], t["mtp.pre_fc_norm_hidden.weight"],
                       _layer_view(dims, dims.num_hidden_layers, "full_attention", t, "mtp.layers.0."),
                       t["mtp.norm.weight"])
    return ModelView(dims, t["embed_tokens.weight"], tuple(layers), t["norm.weight"], lm_head, view)


def _layer_view(dims: Qwen36Dims, i: int, kind: str, t: dict[str, torch.Tensor], prefix: str = "") -> LayerView:
    """Layer i's view over its loaded tensors in `t` (names under `prefix`, default `layers.{i}.`), its
    groups fused (their parts become row views)."""
    p = prefix or f"layers.{i}."
    if kind == "full_attention":
        a = p + "self_attn."
        qg = t.pop(a + "q_proj.weight").view(dims.num_attention_heads, 2, dims.head_dim, -1)
        t[a + "q_rows"] = qg[:, 0].reshape(-1, qg.shape[-1])
        t[a + "gate_rows"] = qg[:, 1].reshape(-1, qg.shape[-1])
        fused = fuse_rows(t, (a + "q_rows", a + "k_proj.weight", a + "v_proj.weight", a + "gate_rows"))
        mixer: AttentionWeights | GDNWeights = AttentionWeights(
            t[a + "q_rows"], t[a + "k_proj.weight"], t[a + "v_proj.weight"], t[a + "gate_rows"],
            t[a + "o_proj.weight"], t[a + "q_norm.weight"], t[a + "k_norm.weight"], fused)
    else:
        g = p + "linear_attn."
        fused = fuse_rows(t, (g + "in_proj_qkv.weight", g + "in_proj_b.weight", g + "in_proj_a.weight",
                              g + "in_proj_z.weight"))
        mixer = GDNWeights(
            t[g + "in_proj_qkv.weight"], t[g + "in_proj_z.weight"], t[g + "in_proj_b.weight"],
            t[g + "in_proj_a.weight"], t[g + "conv1d.weight"].squeeze(1), t[g + "dt_bias"], t[g + "A_log"],
            t[g + "norm.weight"], t[g + "out_proj.weight"], fused)
    m = p + "mlp."
    for fname, parts in MLP_FUSED.items():
        if all(m + n in t for n in parts):
            t[m + fname] = fuse_rows(t, tuple(m + n for n in parts), fname)
    mlp = {k[len(m):]: v for k, v in t.items() if k.startswith(m)}
    return LayerView(i, kind, t[p + "input_layernorm.weight"], t[p + "post_attention_layernorm.weight"], mixer, mlp)
