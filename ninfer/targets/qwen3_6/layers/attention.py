"""Attention projection leaf of the gated full-attention layers."""
from __future__ import annotations

from typing import Any

import torch

from ninfer.targets.qwen3_6.dims import Qwen36Dims
from ninfer.targets.qwen3_6.layers import main_and_gate
from ninfer.targets.qwen3_6.program.model_view import AttentionWeights


class GatedAttentionProjection:
    def __init__(self, dims: Qwen36Dims) -> None:
        self.nh, self.nkv, self.hd = dims.num_attention_heads, dims.num_key_value_heads, dims.head_dim
        self.eps = dims.rms_norm_eps

    def project(self, w: AttentionWeights, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: tuple,
                ops: Any, side: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """h [N, H] (or `NormedRows`: the op applies the norm) -> q [N, nh, hd] (normed and rotated), gate
        [N, nh, hd] (a view of the projection: no copy). k (normed and rotated) and v are written into
        the pages: kv = (k_cache, v_cache, block_table, positions, rows) as in `write_kv_paged`.
        side: a `SideGemv` (CUDA): the gate rows are a second GEMV on its stream, beside what the caller
        runs next; the caller joins the stream before reading the gate."""
        N = h.shape[0]
        nq, nk = self.nh * self.hd, self.nkv * self.hd
        qkv, gate = main_and_gate(ops, h, w.in_proj, nq + 2 * nk, side)    # in_proj [q | k | v | gate]
        gate = gate.view(N, self.nh, self.hd)
        q = qkv[:, :nq].view(N, self.nh, self.hd)
        k = qkv[:, nq:nq + nk].view(N, self.nkv, self.hd)
        v = qkv[:, nq + nk:nq + 2 * nk].view(N, self.nkv, self.hd)
        q = ops.qk_norm_rope_write_kv(q, k, v, w.q_norm, w.k_norm, cos, sin, self.eps, *kv)
        return q, gate

    def output(self, w: AttentionWeights, o: torch.Tensor, gate: torch.Tensor | None, ops: Any,
               residual: torch.Tensor | None = None) -> Any:
        """o [N, nh, hd], gate [N, nh, hd] (None: o is already gated) -> [N, H] (or the op's Residual when
        it folds `residual`)."""
        if gate is not None:
            o = ops.sigmoid_gate_mul(o, gate)
        return ops.linear(o.reshape(o.shape[0], -1), w.o_proj, residual=residual)
