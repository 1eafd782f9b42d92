"""Dense SwiGLU feed-forward (27B FFN, the MoE shared expert, each routed expert)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["silu_mul", "swiglu_mlp"]


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up in the input dtype. gate, up: [..., I]."""
    return F.silu(gate) * up


def swiglu_mlp(
    x: torch.Tensor, gate_proj: torch.Tensor, up_proj: torch.Tensor, down_proj: torch.Tensor
) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)), everything in x.dtype (as HF `Qwen3_5MLP`).

    Args:
        x: [..., H];  gate_proj, up_proj: [I, H];  down_proj: [H, I]  (nn.Linear weight layout).
    Returns:
        [..., H] in x.dtype.
    """
    return F.linear(silu_mul(F.linear(x, gate_proj), F.linear(x, up_proj)), down_proj)
