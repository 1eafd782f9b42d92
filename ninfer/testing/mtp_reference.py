"""Oracle of the Qwen3.6 MTP (multi-token prediction) layer, for tests (fp32, CPU).

Two independent implementations of the same layer, and a draft chain built on the second:

  hf_mtp_logits          Hugging Face `transformers` (`modeling_layers.MtpModel` on the main model
                         loaded from the checkpoint directory). `transformers` is imported lazily.
  mtp_logits_from_state_dict
                         a hand-written PyTorch MTP from the raw tensors (no transformers, nothing
                         from ninfer.targets).
  mtp_draft_chain        K greedy drafts reusing the one MTP layer (hand-written, KV appended step
                         by step); hf_mtp_draft_chain is the same chain run through MtpModel.

Conventions (checked against transformers 5.24 `MTPCandidateGenerator` / `MtpModel`):

  hidden     The MTP layer takes the main model's hidden AFTER the final norm: h_i =
             model.norm(x_i), the row the LM head reads (`MTPCandidateGenerator` passes
             `hidden_states[-1]`, which `capture_outputs` ties to `last_hidden_state`, the output
             of `model.norm`).
  slots      Teacher forcing over a sequence x_0..x_{n-1}: slot i (i = 0..n-2) pairs h_i with the
             next token x_{i+1}; its logits predict x_{i+2}. Slot i attends causally to slots
             0..i (the MTP layer's own KV, one entry per slot).
  positions  Slot i takes RoPE position i+1, the position of the token x_{i+1} it embeds
             (`MTPCandidateGenerator` slices `position_ids` together with the shifted input ids).
             vLLM gives slot i position i; RoPE is relative, so both give the same logits up to
             rounding (`first_position` below selects either).
  pairing    fc input = cat(norm_e(embed(x_{i+1})), norm_h(h_i)), the embedding first
             (`MtpLayer.forward` without `mtp_hidden_states_first`).
  chain      Draft k+1 reuses the layer on (its own output after mtp.norm, draft k) at the next
             slot and position; `MtpLayer` applies mtp.norm (`post_norm`) to the output it passes
             on, so HF's multi-layer chaining feeds the same post-norm value (vLLM's convention).

Weight names accepted (state dicts): checkpoint names (`model.language_model.embed_tokens.weight`,
`model.embed_tokens.weight`) or canonical artifact names (`embed_tokens.weight`); `lm_head.weight`
(the embedding when absent: tied); `mtp.*` with the MoE experts per expert
(`mtp.layers.0.mlp.experts.{e}.{gate,up,down}_proj.weight`) or fused (`experts.gate_up_proj`
[E, 2I, H], gate rows first, and `experts.down_proj` [E, H, I]).
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, NamedTuple

import torch
import torch.nn.functional as F

__all__ = ["MtpOutput", "HfMtpResult", "DraftChain", "HfMtpModels", "load_state_dict", "load_hf_mtp",
           "hf_mtp_logits", "hf_mtp_draft_chain", "mtp_logits_from_state_dict", "mtp_draft_chain"]

_EMBED_NAMES = ("model.language_model.embed_tokens.weight", "model.embed_tokens.weight", "embed_tokens.weight")


class HfMtpResult(NamedTuple):
    hidden: torch.Tensor   # [n, H]   main model, after the final norm: h_0..h_{n-1}
    logits: torch.Tensor   # [n-1, V] MTP logits; row i predicts x_{i+2}


class MtpOutput(NamedTuple):
    logits: torch.Tensor   # [m, V]   row i predicts the token two past the hidden's position
    hidden: torch.Tensor   # [m, H]   the MTP layer's output after mtp.norm (the next chain hidden)


class DraftChain(NamedTuple):
    tokens: torch.Tensor   # [K] int64  greedy drafts x_{f+1}..x_{f+K}
    logits: torch.Tensor   # [K, V]     the logits each draft was taken from


# ---------------------------------------------------------------------------------------------
# Checkpoint tensors
# ---------------------------------------------------------------------------------------------

def load_state_dict(ckpt_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors checkpoint directory (one file or an indexed set of shards)."""
    from safetensors.torch import load_file

    d = Path(ckpt_dir)
    index = d / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() \
        else ["model.safetensors"]
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(d / f)))
    return out


def _per_expert_mtp(sd: Mapping[str, torch.Tensor]) -> bool:
    return any(k.startswith("mtp.") and ".mlp.experts." in k and k.endswith("_proj.weight") for k in sd)


def _fused_mtp_experts(sd: Mapping[str, torch.Tensor], layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(gate_up [E, 2I, H], down [E, H, I]) of MTP layer `layer`, from either layout; None for a dense layer."""
    pre = f"mtp.layers.{layer}.mlp.experts."
    if pre + "gate_up_proj" in sd:
        return sd[pre + "gate_up_proj"], sd[pre + "down_proj"]
    experts = sorted({int(k[len(pre):].split(".")[0]) for k in sd if k.startswith(pre)})
    if not experts:
        return None
    if experts != list(range(len(experts))):
        raise ValueError(f"MTP layer {layer} experts are not numbered 0..E-1: {experts}")
    gate_up = torch.stack([torch.cat([sd[f"{pre}{e}.gate_proj.weight"], sd[f"{pre}{e}.up_proj.weight"]], 0)
                           for e in experts])
    down = torch.stack([sd[f"{pre}{e}.down_proj.weight"] for e in experts])
    return gate_up, down


def _shared_tensors(sd: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(embed_tokens [V, H], lm_head [V, H]) under any accepted name."""
    embed = next((sd[n] for n in _EMBED_NAMES if n in sd), None)
    if embed is None:
        raise KeyError(f"no embedding in the state dict (looked for {', '.join(_EMBED_NAMES)})")
    return embed, sd.get("lm_head.weight", embed)


# ---------------------------------------------------------------------------------------------
# Hugging Face reference
# ---------------------------------------------------------------------------------------------

class HfMtpModels(NamedTuple):
    main: Any   # Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM (fp32, eager attention and experts)
    mtp: Any    # transformers.modeling_layers.MtpModel sharing the main embedding, LM head and rotary


@contextlib.contextmanager
def _quiet_transformers():
    """HF's MTP weight regex also matches `model.visual.*` (listed UNEXPECTED in a load report)."""
    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)


def _write_fused_mtp_view(ckpt_dir: Path, out_dir: Path) -> None:
    """A directory holding the checkpoint's config and only its `mtp.*` tensors, experts fused."""
    from safetensors.torch import save_file

    sd = load_state_dict(ckpt_dir)
    mtp = {k: v for k, v in sd.items() if k.startswith("mtp.") and ".mlp.experts." not in k}
    layers = sorted({int(k.split(".")[2]) for k in sd if k.startswith("mtp.layers.")})
    for i in layers:
        fused = _fused_mtp_experts(sd, i)
        if fused is not None:
            mtp[f"mtp.layers.{i}.mlp.experts.gate_up_proj"] = fused[0].contiguous()
            mtp[f"mtp.layers.{i}.mlp.experts.down_proj"] = fused[1].contiguous()
    (out_dir / "config.json").write_text((ckpt_dir / "config.json").read_text())
    save_file(mtp, str(out_dir / "model.safetensors"), metadata={"format": "pt"})


def _check_loaded_mtp(mtp: Any, sd: Mapping[str, torch.Tensor]) -> None:
    """Every MtpModel parameter equals the checkpoint tensor it must come from (guards HF's key mapping)."""
    rename = {"enorm.weight": "mtp.pre_fc_norm_embedding.weight", "hnorm.weight": "mtp.pre_fc_norm_hidden.weight",
              "eh_proj.weight": "mtp.fc.weight", "post_norm.weight": "mtp.norm.weight"}
    embed, head = _shared_tensors(sd)
    for name, p in mtp.state_dict().items():
        if name == "embed_tokens.weight":
            want = embed
        elif name == "shared_head.weight":
            want = head
        else:
            layer, rest = name.split(".", 2)[1:]
            if rest.startswith("mtp_block.mlp.experts."):
                gate_up, down = _fused_mtp_experts(sd, int(layer))
                want = gate_up if rest.endswith("gate_up_proj") else down
            elif rest.startswith("mtp_block."):
                want = sd[f"mtp.layers.{layer}.{rest[len('mtp_block.'):]}"]
            else:
                want = sd[rename[rest]]
        if not torch.equal(p.detach().float(), want.float()):
            raise RuntimeError(f"MtpModel parameter {name} differs from the checkpoint tensor it maps from")


def load_hf_mtp(ckpt_dir: str | os.PathLike, *, fuse_mtp_experts: bool | None = None) -> HfMtpModels:
    """Load the checkpoint's main model and an HF MtpModel on it (fp32, CPU, eager).

    fuse_mtp_experts: present per-expert MTP experts to MtpModel fused ([E, 2I, H] / [E, H, I]) through
    a temporary copy of the `mtp.*` tensors. None: only where MtpModel refuses the per-expert keys
    (transformers 5.24 merges them itself). Raises RuntimeError when a loaded MTP parameter differs
    from the checkpoint tensor it maps from, or the checkpoint has no `mtp.*` tensors.
    """
    import transformers
    from transformers.modeling_layers import MtpModel

    ckpt = Path(ckpt_dir)
    sd = load_state_dict(ckpt)
    if not any(k.startswith("mtp.") for k in sd):
        raise RuntimeError(f"{ckpt} has no mtp.* tensors")
    with _quiet_transformers():
        main = transformers.AutoModelForCausalLM.from_pretrained(
            ckpt, dtype=torch.float32, attn_implementation="eager", experts_implementation="eager").eval()
        cfg = main.config
        n_mtp = int(getattr(cfg, "mtp_num_hidden_layers", None) or 1)
        cfg.num_mtp_layers = n_mtp
        cfg.mtp_layer_types = ["full_attention"] * n_mtp

        def load(fuse: bool) -> Any:
            if not fuse:
                cfg.name_or_path = str(ckpt)
                return MtpModel.from_pretrained(main)
            with tempfile.TemporaryDirectory(prefix="mtp-fused-") as tmp:
                _write_fused_mtp_view(ckpt, Path(tmp))
                cfg.name_or_path = tmp
                try:
                    return MtpModel.from_pretrained(main)
                finally:
                    cfg.name_or_path = str(ckpt)

        if fuse_mtp_experts is None:
            try:
                mtp = load(False)
            except RuntimeError:
                if not _per_expert_mtp(sd):
                    raise
                mtp = load(True)
        else:
            mtp = load(bool(fuse_mtp_experts))
    mtp = mtp.float().eval()
    _check_loaded_mtp(mtp, sd)
    return HfMtpModels(main, mtp)


def _models(source: str | os.PathLike | HfMtpModels) -> HfMtpModels:
    return source if isinstance(source, HfMtpModels) else load_hf_mtp(source)


def _ids(input_ids: Any) -> torch.Tensor:
    ids = torch.as_tensor(input_ids, dtype=torch.long).reshape(-1)
    if ids.numel() < 2:
        raise ValueError(f"input_ids needs at least 2 tokens (one MTP slot), got {ids.numel()}")
    return ids


def _hf_main_hidden(main: Any, ids: torch.Tensor) -> torch.Tensor:
    """[n, H] post-final-norm hidden, taken the way MTPCandidateGenerator takes it."""
    out = main(input_ids=ids[None], output_hidden_states=-1, use_cache=False)
    return out.hidden_states[-1][0]


@torch.no_grad()
def hf_mtp_logits(source: str | os.PathLike | HfMtpModels, input_ids: Any) -> HfMtpResult:
    """Teacher-forced MTP logits of `input_ids` [n] (n >= 2) through HF.

    source: a checkpoint directory or what `load_hf_mtp` returned. The main model runs over x_0..x_{n-1}
    (one sequence, positions 0..n-1) and yields h_0..h_{n-1} after the final norm. The MTP layer then runs
    once over the n-1 slots (slot i: h_i with x_{i+1}, RoPE position i+1, causal over the slots, a fresh
    MtpCache), and the shared LM head gives the logits. Returns (hidden [n, H], logits [n-1, V]).
    """
    from transformers.cache_utils import MtpCache

    models = _models(source)
    ids = _ids(input_ids)
    n = ids.numel()
    hidden = _hf_main_hidden(models.main, ids)
    cache = MtpCache(config=models.main.config.get_mtp_config())
    out = models.mtp.forward_layer(0, hidden[None, : n - 1], torch.arange(1, n)[None], cache, input_ids=ids[None, 1:])
    return HfMtpResult(hidden, models.mtp._project_to_logits(out)[0])


@torch.no_grad()
def hf_mtp_draft_chain(source: str | os.PathLike | HfMtpModels, input_ids: Any, num_draft_tokens: int) -> DraftChain:
    """The draft chain of `mtp_draft_chain` through HF: `input_ids` [f+1] = x_0..x_f (x_f the token the
    target produced last). The main model gives h_0..h_{f-1}; the MTP layer fills its cache over slots
    0..f-1 in one call (the last slot drafts x_{f+1}), then each further draft is one `forward_layer`
    step on (the previous MtpLayer output, which is after mtp.norm; the previous draft) at the next
    position, appending to the same MtpCache."""
    from transformers.cache_utils import MtpCache

    if num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
    models = _models(source)
    ids = _ids(input_ids)
    f = ids.numel() - 1
    hidden = _hf_main_hidden(models.main, ids[:f])
    cache = MtpCache(config=models.main.config.get_mtp_config())
    out = models.mtp.forward_layer(0, hidden[None], torch.arange(1, f + 1)[None], cache, input_ids=ids[None, 1:])
    tokens, logits = [], []
    for k in range(num_draft_tokens):
        row = models.mtp._project_to_logits(out[:, -1:])[0, 0]
        tok = row.argmax()
        tokens.append(tok)
        logits.append(row)
        if k + 1 < num_draft_tokens:
            out = models.mtp.forward_layer(0, out[:, -1:], torch.tensor([[f + 1 + k]]), cache,
                                           input_ids=tok.view(1, 1))
    return DraftChain(torch.stack(tokens), torch.stack(logits))


# ---------------------------------------------------------------------------------------------
# Hand-written reference
# ---------------------------------------------------------------------------------------------

def _rmsnorm1p(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm: the stored weight w scales by (1 + w)."""
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())


class _Layer(NamedTuple):
    """Tensors of one MTP layer plus the shared ones, fp32, and the dims it needs."""
    t: dict[str, torch.Tensor]
    experts: tuple[torch.Tensor, torch.Tensor] | None
    embed: torch.Tensor
    head: torch.Tensor
    dims: Any


def _mtp_layer(state_dict: Mapping[str, torch.Tensor], dims: Any, layer: int = 0) -> _Layer:
    if not any(k.startswith(f"mtp.layers.{layer}.") for k in state_dict):
        raise KeyError(f"the state dict has no mtp.layers.{layer}.* tensors")
    embed, head = _shared_tensors(state_dict)
    pre = f"mtp.layers.{layer}."
    # layer tensors without their prefix ("self_attn.q_proj.weight"), the head's own with it ("mtp.fc.weight")
    t = {k.removeprefix(pre): v.float() for k, v in state_dict.items() if k.startswith("mtp.")
         and ".mlp.experts." not in k and (k.startswith(pre) or not k.startswith("mtp.layers."))}
    experts = _fused_mtp_experts(state_dict, layer)
    if (experts is not None) != bool(getattr(dims, "num_experts", 0)):
        raise ValueError(f"dims say num_experts={getattr(dims, 'num_experts', 0)} but MTP layer {layer} "
                         f"{'has' if experts is not None else 'has no'} routed experts")
    experts = None if experts is None else (experts[0].float(), experts[1].float())
    return _Layer(t, experts, embed.float(), head.float(), dims)


def _rope_angles(dims: Any, positions: torch.Tensor) -> torch.Tensor:
    """[T, rot/2] rotation angles. positions: [T] (text: all three MRoPE axes equal) or [3, T]
    (t, h, w); with interleaved MRoPE frequency j takes axis H where j % 3 == 1 and j < 3*sec[1],
    axis W where j % 3 == 2 and j < 3*sec[2], axis T otherwise."""
    rot = int(dims.head_dim * dims.partial_rotary_factor)
    inv_freq = 1.0 / (float(dims.rope_theta) ** (torch.arange(0, rot, 2, dtype=torch.int64).float() / rot))
    pos = positions.float()
    if pos.ndim == 1:
        return pos[:, None] * inv_freq[None, :]
    if not dims.mrope_interleaved:
        raise NotImplementedError("3-D positions are implemented for interleaved MRoPE only")
    axis = torch.zeros(rot // 2, dtype=torch.long)
    for a, offset in ((1, 1), (2, 2)):
        axis[offset: 3 * dims.mrope_section[a]: 3] = a
    return pos[axis].T * inv_freq[None, :]


def _apply_rope(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """x [T, heads, hd]; NeoX half-split rotation of the first `rot` dims, the rest passes through."""
    rot = 2 * angles.shape[-1]
    cos = torch.cat([angles, angles], -1).cos()[:, None, :]
    sin = torch.cat([angles, angles], -1).sin()[:, None, :]
    xr, xp = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = torch.cat([-xr[..., half:], xr[..., :half]], -1)
    return torch.cat([xr * cos + rotated * sin, xp], -1)


_KV = tuple[torch.Tensor, torch.Tensor]   # (k, v) [slots, nkv, hd] after k_norm and RoPE


def _attention(L: _Layer, x: torch.Tensor, positions: torch.Tensor, past: _KV | None) -> tuple[torch.Tensor, _KV]:
    """Gated full attention of m new slots over `past` (k, v [P, nkv, hd]) and themselves, causal."""
    d, t = L.dims, L.t
    m, nh, nkv, hd, eps = x.shape[0], d.num_attention_heads, d.num_key_value_heads, d.head_dim, d.rms_norm_eps
    qg = (x @ t["self_attn.q_proj.weight"].T).view(m, nh, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(m, nh * hd)
    k = (x @ t["self_attn.k_proj.weight"].T).view(m, nkv, hd)
    v = (x @ t["self_attn.v_proj.weight"].T).view(m, nkv, hd)
    q = _rmsnorm1p(q, t["self_attn.q_norm.weight"], eps)
    k = _rmsnorm1p(k, t["self_attn.k_norm.weight"], eps)
    ang = _rope_angles(d, positions)
    q, k = _apply_rope(q, ang), _apply_rope(k, ang)
    if past is not None:
        k, v = torch.cat([past[0], k], 0), torch.cat([past[1], v], 0)
    P = k.shape[0] - m
    rep = nh // nkv
    kh, vh = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)     # q head h -> kv head h // rep
    scores = torch.einsum("qhd,khd->hqk", q, kh) * hd ** -0.5
    allowed = torch.arange(P + m)[None, :] <= (P + torch.arange(m))[:, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    o = torch.einsum("hqk,khd->qhd", torch.softmax(scores, -1), vh).reshape(m, nh * hd)
    o = o * torch.sigmoid(gate)
    return o @ t["self_attn.o_proj.weight"].T, (k, v)


def _swiglu(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    return (F.silu(x @ gate.T) * (x @ up.T)) @ down.T


def _ffn(L: _Layer, x: torch.Tensor) -> torch.Tensor:
    t = L.t
    if L.experts is None:
        return _swiglu(x, t["mlp.gate_proj.weight"], t["mlp.up_proj.weight"], t["mlp.down_proj.weight"])
    gate_up, down = L.experts
    inter = gate_up.shape[1] // 2
    probs = torch.softmax(x @ t["mlp.gate.weight"].T, -1)
    w, idx = torch.topk(probs, L.dims.num_experts_per_tok, -1)
    w = w / w.sum(-1, keepdim=True)
    routed = torch.zeros_like(x)
    for e in idx.unique().tolist():
        rows, k = torch.where(idx == e)
        y = _swiglu(x[rows], gate_up[e, :inter], gate_up[e, inter:], down[e])
        routed.index_add_(0, rows, w[rows, k, None] * y)
    shared = _swiglu(x, t["mlp.shared_expert.gate_proj.weight"], t["mlp.shared_expert.up_proj.weight"],
                     t["mlp.shared_expert.down_proj.weight"])
    return routed + torch.sigmoid(x @ t["mlp.shared_expert_gate.weight"].T) * shared


def _mtp_slots(L: _Layer, hidden: torch.Tensor, next_ids: torch.Tensor, positions: torch.Tensor,
               past: _KV | None, *, hidden_first: bool = False) -> tuple[MtpOutput, _KV]:
    """m slots: hidden [m, H] paired with next_ids [m] at `positions`, after `past` slots."""
    t, eps = L.t, L.dims.rms_norm_eps
    e = _rmsnorm1p(L.embed[next_ids], t["mtp.pre_fc_norm_embedding.weight"], eps)
    h = _rmsnorm1p(hidden, t["mtp.pre_fc_norm_hidden.weight"], eps)
    u = torch.cat([h, e] if hidden_first else [e, h], -1) @ t["mtp.fc.weight"].T
    a, kv = _attention(L, _rmsnorm1p(u, t["input_layernorm.weight"], eps), positions, past)
    u = u + a
    u = u + _ffn(L, _rmsnorm1p(u, t["post_attention_layernorm.weight"], eps))
    y = _rmsnorm1p(u, t["mtp.norm.weight"], eps)
    return MtpOutput(y @ L.head.T, y), kv


def _check_inputs(dims: Any, hidden: torch.Tensor, ids: torch.Tensor, extra: int) -> None:
    if hidden.ndim != 2 or hidden.shape[1] != dims.hidden_size:
        raise ValueError(f"hidden must be [n, {dims.hidden_size}], got {tuple(hidden.shape)}")
    if ids.numel() != hidden.shape[0] + extra:
        raise ValueError(f"input_ids must have {hidden.shape[0] + extra} tokens for {hidden.shape[0]} hidden rows, "
                         f"got {ids.numel()}")


@torch.no_grad()
def mtp_logits_from_state_dict(state_dict: Mapping[str, torch.Tensor], dims: Any, hidden: torch.Tensor,
                               input_ids: Any, *, first_position: int = 1, hidden_first: bool = False) -> MtpOutput:
    """Teacher-forced MTP logits, hand-written in PyTorch (fp32).

    state_dict: the checkpoint's tensors (names in the module docstring). dims: an object with the
    Qwen3.6 text dims (`Qwen36Dims` or alike: hidden_size, num_attention_heads, num_key_value_heads,
    head_dim, partial_rotary_factor, rope_theta, mrope_section, mrope_interleaved, rms_norm_eps,
    num_experts, num_experts_per_tok). hidden: [n, H] main-model hidden after the final norm,
    h_0..h_{n-1}. input_ids: [n] x_0..x_{n-1}.
    Slot i (i = 0..n-2) pairs h_i with x_{i+1} at RoPE position first_position + i (1: HF's convention,
    0: vLLM's), causal over slots 0..i. Returns MtpOutput(logits [n-1, V] (row i predicts x_{i+2}),
    hidden [n-1, H] (the layer's output after mtp.norm)). hidden_first=True swaps the fc input order
    (a wrong variant, for tests that must be able to fail).
    """
    ids = _ids(input_ids)
    hidden = hidden.float()
    _check_inputs(dims, hidden, ids, 0)
    L = _mtp_layer(state_dict, dims)
    n = ids.numel()
    out, _ = _mtp_slots(L, hidden[: n - 1], ids[1:], first_position + torch.arange(n - 1), None,
                        hidden_first=hidden_first)
    return out


@torch.no_grad()
def mtp_draft_chain(state_dict: Mapping[str, torch.Tensor], dims: Any, hidden: torch.Tensor, input_ids: Any,
                    num_draft_tokens: int, *, first_position: int = 1) -> DraftChain:
    """Greedy draft chain of `num_draft_tokens` K >= 1 tokens, reusing the one MTP layer K times.

    hidden: [f, H] main-model hidden after the final norm, h_0..h_{f-1}; input_ids: [f+1] x_0..x_f, x_f
    the token the target produced from h_{f-1}. The MTP KV of slots 0..f-2 is recomputed from the
    teacher-forced prefix in the same call as slot f-1 (h_{f-1} with x_f), whose argmax is draft 1
    (predicting x_{f+1}). Draft k+1 runs one more slot, pairing the previous slot's output after
    mtp.norm with draft k at the next position, its K/V appended to the layer's KV (vLLM's
    convention). Returns DraftChain(tokens [K], logits [K, V]).
    """
    if num_draft_tokens < 1:
        raise ValueError(f"num_draft_tokens must be >= 1, got {num_draft_tokens}")
    ids = _ids(input_ids)
    hidden = hidden.float()
    _check_inputs(dims, hidden, ids, 1)
    L = _mtp_layer(state_dict, dims)
    f = hidden.shape[0]
    out, kv = _mtp_slots(L, hidden, ids[1:], first_position + torch.arange(f), None)
    tokens, logits = [], []
    for k in range(num_draft_tokens):
        row = out.logits[-1]
        tokens.append(row.argmax())
        logits.append(row)
        if k + 1 < num_draft_tokens:
            out, kv = _mtp_slots(L, out.hidden[-1:], tokens[-1].view(1), torch.tensor([first_position + f + k]), kv)
    return DraftChain(torch.stack(tokens), torch.stack(logits))
