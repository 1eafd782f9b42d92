"""Numeric comparisons shared by the op, model and program tests."""
from __future__ import annotations

import math

import torch

_CHUNK = 1 << 20          # elements converted to float64 at a time (logits over 248k tokens are large)


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| with float64 sums on the CPU: the relative RMS error of a against the reference b. a must
    be finite (a NaN or inf in the result under test fails here instead of comparing as a large error)."""
    a, b = torch.broadcast_tensors(a.detach().cpu(), b.detach().cpu())
    a, b = a.reshape(-1), b.reshape(-1)
    num = den = 0.0
    for i in range(0, a.numel(), _CHUNK):
        x, y = a[i:i + _CHUNK].double(), b[i:i + _CHUNK].double()
        part = (x - y).square().sum().item()
        if not math.isfinite(part):
            assert torch.isfinite(x).all(), "non-finite values in the result under test"
        num += part
        den += y.square().sum().item()
    return math.sqrt(num) / max(math.sqrt(den), 1e-30)
