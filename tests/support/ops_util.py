"""Helpers shared by the tests/unit/ops/test_ops_*.py files."""

from __future__ import annotations

import pytest
import torch

ODD_LENGTHS = [1, 63, 64, 65, 500]

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu,
                                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]),
]


def dense_causal(q, k, v, scale, rep):
    """float64 explicit causal GQA attention of the last L positions. q [L, Hq, D], k, v [C, Hkv, D]
    (Hq = rep * Hkv) -> [L, Hq, D] on the CPU."""
    L, C = q.shape[0], k.shape[0]
    q, k, v = q.double().cpu(), k.double().cpu(), v.double().cpu()
    k = k.repeat_interleave(rep, 1)
    v = v.repeat_interleave(rep, 1)
    s = torch.einsum("lhd,chd->hlc", q, k) * scale
    mask = torch.arange(C)[None, :] > torch.arange(C - L, C)[:, None]
    p = torch.softmax(s.masked_fill(mask, float("-inf")), -1)
    return torch.einsum("hlc,chd->lhd", p, v)


# (start, L, N) of `prefix_rows_case`: no prefix, odd and page-aligned prefixes, one real row, padding tails.
PREFIX_ROWS = [(0, 1, 8), (0, 21, 32), (0, 64, 64), (0, 65, 128), (1, 1, 8), (37, 5, 8), (16, 16, 16),
               (63, 65, 128), (200, 63, 64), (500, 1, 8), (1000, 130, 256)]


def prefix_rows_case(start, L, N, device, dtype=torch.float32, hq=6, hkv=2, d=32, ps=16, seed=0):
    """A padded stage of N rows (L real) at position `start` over a prefix, as the prefill graphs hold it:
    a NaN-poisoned pool; block-table row 0 the sequence's shuffled pages, then a spare page; row 1 the
    spare page; the prefix's and the stage's KV written through row 0, the padding's through row 1.
    Returns (q, k_cache, v_cache, table, start, length) for `prefix_attention_rows`, and the float64
    causal attention of the L real rows over the start + L keys."""
    g = torch.Generator().manual_seed(seed + 7 * start + 131 * L + N)
    W = -(-(start + N) // ps) + 1
    num_pages = W + 3
    spare = num_pages - 1
    perm = torch.randperm(num_pages - 1, generator=g)
    used = -(-(start + L) // ps)
    table = torch.full((2, W), spare, dtype=torch.int64)
    table[0, :used] = perm[:used]
    table = table.to(device)
    nan = lambda: torch.full((num_pages, ps, hkv, d), float("nan"), device=device, dtype=dtype)  # noqa: E731
    kc, vc = nan(), nan()
    C = start + L
    k = torch.randn(start + N, hkv, d, generator=g)
    v = torch.randn(start + N, hkv, d, generator=g)
    q = torch.randn(N, hq, d, generator=g)
    pos = torch.arange(start + N, device=device)
    rows = (pos >= C).long()
    from ninfer.ops.reference.attention import write_kv_paged
    write_kv_paged(kc, vc, k.to(device, dtype), v.to(device, dtype), table, pos, rows)
    want = dense_causal(q[:L].to(dtype), k[:C].to(dtype), v[:C].to(dtype), d ** -0.5, hq // hkv)
    t = lambda x: torch.tensor([x], dtype=torch.long, device=device)  # noqa: E731
    return (q.to(device, dtype), kc, vc, table, t(start), t(L)), want


def kept_oracle(x: torch.Tensor, top_k: int, top_p: float) -> tuple[set[int], bool]:
    """Steps 6-7 of the sampler as `ninfer.ops.reference.sampling`'s docstring states them, for one row, in float64: descending values with ties
    by lowest id, top-k keeps values >= the k-th, top-p the prefix whose mass before each token is below
    top_p. Also whether some token's mass before lies within 1e-5 of top_p (fp32 may round either way)."""
    xs = x.double()
    V = xs.numel()
    order = sorted(range(V), key=lambda i: (-xs[i].item(), i))
    kept = order
    if 0 < top_k < V:
        kth = xs[order[top_k - 1]].item()
        kept = [i for i in order if xs[i].item() >= kth]
    if top_p >= 1.0:
        return set(kept), False
    p = torch.softmax(xs[kept], dim=0).tolist()
    out, before, near = [], 0.0, False
    for i, pi in zip(kept, p):
        near |= abs(before - top_p) < 1e-5
        if before >= top_p and out:
            break
        out.append(i)
        before += pi
    return set(out), near
