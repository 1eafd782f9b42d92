"""Helpers shared by the tests/test_ops_*.py files."""

from __future__ import annotations

import pytest
import torch

ODD_LENGTHS = [1, 63, 64, 65, 500]

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]),
]


def rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative RMS error of a against the reference b (computed in float64)."""
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()
