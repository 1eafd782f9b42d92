"""Partial rotary position embedding with interleaved 3-D MRoPE (Qwen3.5/3.6 text attention).

rot = int(head_dim * partial_rotary_factor) dims are rotated (NeoX rotate-half on dims [0, rot));
the remaining dims pass through. Frequency j (j < rot/2) takes its position from axis
T, H or W of the 3-D position:
* interleaved (the model): H if j % 3 == 1 and j < 3*section[1]; W if j % 3 == 2 and j < 3*section[2];
  T otherwise (HF `recomposition_frequencies`).
* not interleaved: consecutive blocks of section[0] T, section[1] H, section[2] W frequencies.
For text all three axes equal the token index and this is ordinary partial RoPE.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["rope_inv_freq", "mrope_axis_of_freq", "mrope_cos_sin", "apply_rotary", "apply_rotary_qk"]


def rope_inv_freq(rotary_dim: int, theta: float, device: torch.device | str | None = None) -> torch.Tensor:
    """inv_freq[j] = theta^(-2j / rotary_dim), j < rotary_dim / 2. Returns [rotary_dim // 2] fp32.

    NOTE: computed on the CPU and then moved, as HF does, so every device gets the same bits.
    """
    inv = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    return inv.to(device) if device is not None else inv


def mrope_axis_of_freq(num_freqs: int, mrope_section: Sequence[int], interleaved: bool = True) -> list[int]:
    """Axis (0 = T, 1 = H, 2 = W) that each of the `num_freqs` frequencies reads its position from."""
    if sum(mrope_section) != num_freqs or len(mrope_section) != 3:
        raise ValueError(f"mrope_section {list(mrope_section)} must have 3 entries summing to {num_freqs}")
    if not interleaved:
        return [0] * mrope_section[0] + [1] * mrope_section[1] + [2] * mrope_section[2]
    axis = [0] * num_freqs
    for ax, offset in ((1, 1), (2, 2)):
        for j in range(offset, 3 * mrope_section[ax], 3):
            axis[j] = ax
    return axis


def mrope_cos_sin(
    positions: torch.Tensor,
    *,
    head_dim: int,
    partial_rotary_factor: float = 0.25,
    mrope_section: Sequence[int] = (11, 11, 10),
    rope_theta: float = 1e7,
    interleaved: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for the given positions.

    Args:
        positions: [3, *P] integer 3-D positions (T, H, W axes), or 1-D [T] (text: all axes equal).
            *P is usually [T] (one sequence or a packed batch) or [B, T] (expand text to [3, B, T]).
    Returns:
        (cos [*P, rot], sin [*P, rot]) in fp32 on positions.device, rot = int(head_dim * partial_rotary_factor);
        cos = cos(cat(θ, θ)) with θ[j] = pos[axis(j)] * inv_freq[j].
    """
    rot = int(head_dim * partial_rotary_factor)
    if positions.dim() == 1:
        positions = positions.unsqueeze(0).expand(3, -1)
    if positions.shape[0] != 3:
        raise ValueError(f"positions must be [T] or [3, ...], got {tuple(positions.shape)}")
    inv_freq = rope_inv_freq(rot, rope_theta, positions.device)
    axis = torch.tensor(mrope_axis_of_freq(rot // 2, mrope_section, interleaved), device=positions.device)
    # pos_per_freq[..., j] = positions[axis[j], ...]
    pos = positions.float().movedim(0, -1)[..., axis]                # [*P, rot/2]
    theta = pos * inv_freq
    emb = torch.cat([theta, theta], dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first rot dims of every head: x_rot·cos + rotate_half(x_rot)·sin (NeoX half split).

    Args:
        x: [*P, H, D] (e.g. [T, H, D] or [B, T, H, D]).
        cos, sin: [*P, rot] from `mrope_cos_sin` (rot <= D).
    Returns:
        [*P, H, D] in x.dtype. As in HF, cos/sin are cast to x.dtype and the product is done in x.dtype.
    """
    rot = cos.shape[-1]
    cos = cos.to(x.dtype).unsqueeze(-2)
    sin = sin.to(x.dtype).unsqueeze(-2)
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    return torch.cat([x_rot * cos + _rotate_half(x_rot) * sin, x_pass], dim=-1)


def apply_rotary_qk(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`apply_rotary` on q [*P, Hq, D] and k [*P, Hkv, D] with the same tables."""
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
