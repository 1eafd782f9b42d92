"""The execution leaves of the Qwen3.6 family: implementations of the protocols of
`ninfer.targets.qwen3_6.program.leaves` (each package selects its own set, `ninfer.targets.qwen3_6.build_program`).

attention.GatedAttentionProjection   attention projection leaf (q/gate, k, v, q/k norm, rotary; output gate, o_proj)
gdn.GDNProjection                    GDN projection/control leaf (qkv/z/a/b projections, gates; gated norm, out_proj)
dense_mlp.DenseMLP                   post-mixer leaf: SwiGLU MLP (27B and the tiny dense identity)
moe.SparseMoE                        post-mixer leaf: routed experts + gated shared expert (35B-A3B, tiny MoE)
"""
from __future__ import annotations

from typing import Any

import torch


def main_and_gate(ops: Any, h: Any, w: torch.Tensor, split: int, side: Any = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(h @ w[:split].T, h @ w[split:].T) of a mixer's in_proj packed [main | gate]: one GEMM and its two
    column ranges, or with `side` (the schedule's `SideGemv`) two GEMVs, the second on its stream."""
    if side is not None:
        return side.pair(ops, h, w, split)
    y = ops.linear(h, w)
    return y[..., :split], y[..., split:]
