"""The sampler's fast top-k values (ninfer.ops.fast.sampling) against torch.topk: the same values, exactly."""
from __future__ import annotations

import pytest
import torch

from _fast_env import DEV, GPU_MARKS, INTERPRET, gen

pytestmark = GPU_MARKS

SHAPES = [(1, 1), (1, 63), (2, 4096), (3, 4097), (2, 10000)] + ([] if INTERPRET else [(1, 248320), (8, 248320)])


@pytest.mark.parametrize("B,V", SHAPES)
@pytest.mark.parametrize("k", [1, 20, 64])
@pytest.mark.parametrize("kind", ["normal", "ties", "masked"])
def test_topk_values_equal_torch_topk(B, V, k, kind):
    from ninfer.ops.fast.sampling import topk_values

    if k > V:
        pytest.skip("k > V")
    x = torch.randn(B, V, generator=gen(V + k), device=DEV) * 3
    if kind == "ties":
        x = (x * 2).round() / 2                         # few distinct values: ties inside and across slices
    elif kind == "masked":
        x[:, ::3] = float("-inf")
    want = x.topk(k, dim=1).values
    got = topk_values(x, k)
    assert got.shape == (B, k) and torch.equal(got, want)


def test_topk_values_strided_rows_and_bad_arguments():
    from ninfer.ops.fast.sampling import MAX_K, topk_values

    wide = torch.randn(3, 9000, generator=gen(1), device=DEV)
    x = wide[:, 100:8100]                               # rows strided, unit stride along V
    assert torch.equal(topk_values(x, 7), x.topk(7, dim=1).values)
    with pytest.raises(ValueError, match="k must be"):
        topk_values(x, MAX_K + 1)
    with pytest.raises(ValueError, match="k must be"):
        topk_values(x, 0)
    with pytest.raises(ValueError, match="fp32"):
        topk_values(x.bfloat16(), 3)
    with pytest.raises(ValueError, match="unit stride"):
        topk_values(wide.t(), 3)

