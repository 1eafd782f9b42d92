"""The three kinds of execution leaves a package provides to the family schedule.

The schedule owns the sequence state and everything around it (embedding, residual stream, paged KV,
conv/recurrent state, final norm, lm_head): it maps the pages and entries and hands a leaf only the
pages that the leaf's own op writes (the attention leaf's q/k norm + rotary op stores the new tokens'
k, v there, one launch, an `ops` state transformation). Leaves are the per-layer projections around it:

    attention projection   h -> (q, gate) after q/k norm and rotary;        (o, gate) -> out
                           (k, v written into the pages the schedule hands it, in the same op)
    GDN projection/control h -> (qkv pre-conv, z, g, beta);                 (o, z)    -> out
    post-mixer             h -> out   (dense SwiGLU MLP or MoE)

Every leaf method takes the schedule's OpSet (`ninfer.ops.opset.OpSet`) last and runs its GEMMs and
fused steps through it (one fast kernel per step on CUDA, the PyTorch references elsewhere).

Shapes: N tokens of a packed batch, H hidden; nh/nkv/hd attention heads; C conv channels,
nv/dv GDN value heads.

The implementations are in `ninfer.targets.qwen3_6.layers`; a package picks its post-mixer, and
`ninfer.targets.qwen3_6.build_program` assembles the set.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Protocol

import torch

from ninfer.targets.qwen3_6.program.model_view import AttentionWeights, GDNWeights


class AttentionLeaf(Protocol):
    def project(self, w: AttentionWeights, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: tuple,
                ops: Any, side: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """h [N, H], cos/sin [N, rot] -> q [N, nh, hd], gate [N, nh, hd]; k [N, nkv, hd] and v written into
        the pages, kv = (k_cache, v_cache, block_table, positions, rows) as in `write_kv_paged`.
        side: the schedule's `SideGemv` or None (the gate rows' GEMV on its stream)."""
        ...

    def output(self, w: AttentionWeights, o: torch.Tensor, gate: torch.Tensor | None, ops: Any) -> torch.Tensor:
        """o [N, nh, hd], gate [N, nh, hd] (None: o already gated) -> [N, H]."""
        ...


class GDNLeaf(Protocol):
    def project(self, w: GDNWeights, h: torch.Tensor, ops: Any, gates: bool = True, side: Any = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """h [N, H] -> qkv [N, C] (pre-conv), z [N, nv, dv], g [N, nv] fp32 log-decay, beta [N, nv];
        gates=False: the raw projections a, b [N, nv] in place of (g, beta).
        side: the schedule's `SideGemv` or None (z's GEMV on its stream)."""
        ...

    def output(self, w: GDNWeights, o: torch.Tensor, z: torch.Tensor, ops: Any) -> torch.Tensor:
        """o [N, nv, dv], z [N, nv, dv] -> [N, H]."""
        ...


class PostMixerLeaf(Protocol):
    def __call__(self, mlp: Mapping[str, torch.Tensor], h: torch.Tensor, ops: Any) -> torch.Tensor:
        """h [N, H] -> [N, H]; `ops` is the schedule's OpSet (the MoE leaf runs its routed experts
        with it)."""
        ...


class LeafSet(NamedTuple):
    attention: AttentionLeaf
    gdn: GDNLeaf
    post_mixer: PostMixerLeaf
