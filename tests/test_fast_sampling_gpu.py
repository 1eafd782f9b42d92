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


def _near_cut(x: torch.Tensor, vals: torch.Tensor, top_k: int, top_p: float) -> bool:
    """Whether some candidate's mass before it lies within 1e-5 of top_p (fp32 sums may round either way)."""
    V = x.shape[0]
    kth = vals[top_k - 1] if 0 < top_k < V else torch.tensor(float("-inf"), device=x.device)
    keep = x.double()[x >= kth]
    lse = torch.logsumexp(keep, 0)
    sp = torch.exp(vals.double()[vals >= kth] - lse)
    before = sp.cumsum(0) - sp
    return top_p < 1.0 and bool(((before - top_p).abs() < 1e-5).any())


@pytest.mark.parametrize("V", [50, 4097] + ([] if INTERPRET else [248320]))
@pytest.mark.parametrize("kind", ["normal", "ties", "flat", "masked"])
@pytest.mark.parametrize("sorted_row", [False, True])
def test_cut_rows_equal_the_reference(V, kind, sorted_row):
    """The one-launch cut keeps exactly the reference's tokens (`ninfer.ops.sampling.cut_rows`: the docstring's
    rule, ties at the cut by lowest id), from top-k candidates or from the sorted row, with ties at the k-th
    and at the top-p cut, a flat row and -inf entries; NaN-poisoned output memory is fully written."""
    from ninfer.ops import sampling as ref
    from ninfer.ops.fast.sampling import cut_rows

    rows = [(20, 0.95), (1, 1.0), (5, 0.5), (20, 1.0), (0, 1.0), (3, 1e-3), (49, 0.99), (7, 0.3)]
    if sorted_row:
        rows += [(0, 0.9), (0, 0.5), (0, 1e-3), (V, 0.95)]
    B = len(rows)
    g = gen(V + len(kind) + sorted_row)
    x = torch.randn(B, V, generator=g, device=DEV) * 2
    if kind == "ties":
        x = (x * 2).round() / 2
    elif kind == "flat":
        x = torch.zeros(B, V, device=DEV)
    elif kind == "masked":
        x[:, ::3] = float("-inf")
    top_k = torch.tensor([k for k, _ in rows], device=DEV)
    top_p = torch.tensor([p for _, p in rows], device=DEV)
    vals = x.sort(dim=1, descending=True).values if sorted_row else x.topk(max(k for k, _ in rows), dim=1).values
    want = ref.cut_rows(x, vals, top_k, top_p)
    got = cut_rows(x, vals.contiguous(), top_k, top_p)
    checked = 0
    for r, (k, p) in enumerate(rows):
        if _near_cut(x[r], vals[r], k, p):
            continue
        assert torch.equal(torch.isfinite(got[r]), torch.isfinite(want[r])), (r, k, p)
        assert torch.equal(got[r][torch.isfinite(got[r])], want[r][torch.isfinite(want[r])])
        checked += 1
    assert checked >= (B // 2 if kind == "flat" else B - 2)     # flat rows: many cuts land exactly on top_p
