"""Numeric comparisons shared by the op, model and program tests."""
from __future__ import annotations

import torch


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 on the CPU: the relative RMS error of a against the reference b. a must
    be finite (a NaN or inf in the result under test fails here instead of comparing as a large error)."""
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    assert torch.isfinite(a).all(), "non-finite values in the result under test"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
