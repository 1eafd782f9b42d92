"""Attention projection leaf of the gated full-attention layers."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.ops.attention import attention_output_gate
from ninfer.ops.norms import rms_norm
from ninfer.ops.rope import apply_rotary_qk
from ninfer.targets.qwen3_6.dims import Qwen36Dims
from ninfer.targets.qwen3_6.runtime.model_view import AttentionWeights


class GatedAttentionProjection:
    def __init__(self, dims: Qwen36Dims) -> None:
        self.nh, self.nkv, self.hd = dims.num_attention_heads, dims.num_key_value_heads, dims.head_dim
        self.eps = dims.rms_norm_eps

    def project(self, w: AttentionWeights, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """h [N, H] -> q [N, nh, hd], k/v [N, nkv, hd] (q/k normed and rotated), gate [N, nh*hd]."""
        N = h.shape[0]
        nq, nk = self.nh * 2 * self.hd, self.nkv * self.hd
        qkv = F.linear(h, w.in_proj)                                   # one GEMM: [q|gate per head, k, v]
        qg = qkv[:, :nq].view(N, self.nh, 2 * self.hd)                 # per head [query | gate]
        q, gate = qg[..., : self.hd], qg[..., self.hd:].reshape(N, self.nh * self.hd)
        k = qkv[:, nq:nq + nk].view(N, self.nkv, self.hd)
        v = qkv[:, nq + nk:].view(N, self.nkv, self.hd)
        q = rms_norm(q, w.q_norm, self.eps)
        k = rms_norm(k, w.k_norm, self.eps)
        q, k = apply_rotary_qk(q, k, cos, sin)
        return q, k, v, gate

    def output(self, w: AttentionWeights, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """o [N, nh, hd], gate [N, nh*hd] -> [N, H]."""
        o = attention_output_gate(o.reshape(o.shape[0], -1), gate)
        return F.linear(o, w.o_proj)
