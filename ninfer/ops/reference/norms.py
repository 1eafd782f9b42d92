"""Normalisations of the Qwen3.6 decoder (reference PyTorch, any device, fp32 or bf16).

All three compute in float32 and return the input dtype, matching Hugging Face
`Qwen3_5RMSNorm`, `Qwen3_5RMSNormGated` and the FLA `l2norm` bit for bit in fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["rms_norm", "gated_rms_norm", "l2norm"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Zero-centred RMSNorm: `y = (x̂ · (1 + w)).to(x.dtype)` with `x̂ = x · rsqrt(mean(x²) + eps)`.

    Used for input/post-attention norms, q_norm/k_norm (per head), the final norm and MTP norms.
    Args:
        x: [..., D] any float dtype.
        weight: [D] stored zero-centred (the checkpoint value w, not 1 + w); any float dtype.
    Returns:
        [..., D] in x.dtype. The product with (1 + w) happens in fp32 before the cast.
    """
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (1.0 + weight.float())).to(x.dtype)


def gated_rms_norm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Gated RMSNorm of the GDN output: `y = w · norm(o) · silu(z)` (plain weight, not 1 + w).

    Order of casts as in HF `Qwen3_5RMSNormGated`: the normalised value is cast back to o.dtype,
    multiplied by w (in the promoted dtype of w and o), then by silu(z) in fp32, then cast to o.dtype.
    Args:
        o: [..., D] (D = linear_value_head_dim, one head per row).
        z: [..., D] the gate (in_proj_z output), same shape as o.
        weight: [D] (may be fp32 in a bf16 checkpoint).
    Returns:
        [..., D] in o.dtype.
    """
    of = o.float()
    n = (of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps)).to(o.dtype)
    y = weight * n
    y = y * F.silu(z.float())
    return y.to(o.dtype)


def l2norm(x: torch.Tensor, eps: float = 1e-6, dim: int = -1) -> torch.Tensor:
    """FLA-convention L2 normalisation: `x * rsqrt(sum(x²) + eps)` along `dim`, computed in fp32.

    Args:
        x: [..., D].
    Returns:
        Same shape, fp32 (callers of the gated delta rule keep q/k in fp32 from here on).
    """
    xf = x.float()
    return xf * torch.rsqrt((xf * xf).sum(dim=dim, keepdim=True) + eps)
