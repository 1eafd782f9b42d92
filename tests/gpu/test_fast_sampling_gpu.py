"""The sampler's fast kernels (ninfer.ops.triton.sampling) against torch: the top-k values exactly, the cut
(`nucleus`, `top_p_cut`) and the race (with min-p) against the torch cut and draw, and `sample`'s fused draw
against the torch path."""
from __future__ import annotations

import pytest
import torch

from support.fast_env import DEV, GPU_MARKS, INTERPRET, gen

pytestmark = GPU_MARKS

SHAPES = [(1, 1), (1, 63), (2, 4096), (3, 4097), (2, 10000)] + ([] if INTERPRET else [(1, 248320), (8, 248320)])


@pytest.mark.parametrize("B,V", SHAPES)
@pytest.mark.parametrize("k", [1, 20, 64])
@pytest.mark.parametrize("kind", ["normal", "ties", "masked"])
def test_topk_values_equal_torch_topk(B, V, k, kind):
    from ninfer.ops.triton.sampling import topk_values

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
    from ninfer.ops.triton.sampling import MAX_K, topk_values

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



# ------------------------------------------------------------------------------------------------
# the cut (nucleus) and the race: the torch cut's (v, n) and the torch race's tokens
# ------------------------------------------------------------------------------------------------
_ROWS = [(20, 0.95), (1, 1.0), (5, 0.5), (20, 1.0), (0, 1.0), (3, 1e-3), (49, 0.99), (64, 0.9), (0, 1.0), (7, 0.3)]


def _rows(kind, V, seed):
    g = torch.Generator().manual_seed(seed)
    B = len(_ROWS)
    x = torch.randn(B, V, generator=g) * 2
    if kind == "ties":
        x = (x * 2).round() / 2                       # ~17 distinct values: ties at every cut, across slices
    elif kind == "flat":
        x = torch.zeros(B, V)
    elif kind == "masked":
        x[:, torch.randperm(V, generator=g)[:V // 3]] = float("-inf")
    ks = torch.tensor([min(k, V) for k, _ in _ROWS], dtype=torch.long)
    ps = torch.tensor([p for _, p in _ROWS], dtype=torch.float32)
    return x, ks, ps


@pytest.mark.parametrize("V,block", [(300, 64), (5000, 256), (9000, 4096)] + ([] if INTERPRET else [(248320, 4096)]))
@pytest.mark.parametrize("kind", ["normal", "ties", "flat", "masked"])
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("C", [64, 49])
def test_nucleus_and_race_equal_the_torch_cut_and_race(V, block, kind, seed, C, monkeypatch):
    """`nucleus` gives the torch cut's (v, n) (`ops.sampling._nucleus` on the same candidates) except where a
    token's mass before it is within fp32 rounding of top_p (the float64 oracle flags those rows), and `race`
    the torch race's token over the kept set (cut row, softmax, argmax of p / noise), with the row split in
    many slices (ties at v crossing slices: the id-order count and the rescan of the crossing slice)."""
    from support.sampling_oracle import kept_oracle as _kept_oracle

    from ninfer.ops.reference import sampling as S
    from ninfer.ops.triton import sampling as fast

    monkeypatch.setattr(fast, "BLOCK", block)
    x, ks, ps = _rows(kind, V, 40 + seed)
    xd, kd, pd = x.to(DEV), ks.to(DEV), ps.to(DEV)
    vals = xd.topk(C, dim=1).values                    # C = 49: candidates short of the kernel's lanes
    v, n = fast.nucleus(xd, vals, kd, pd)
    want_v, want_n = S._nucleus(xd, vals, kd, pd)
    differ = [r for r in range(len(_ROWS)) if (v[r].item(), n[r].item()) != (want_v[r].item(), want_n[r].item())]
    assert all(_kept_oracle(x[r], int(ks[r]), float(ps[r]))[1] for r in differ), differ
    assert len(differ) <= (5 if kind == "flat" else 2)       # a flat row's masses fall on top_p exactly
    noise = torch.empty_like(xd).exponential_(generator=gen(7 + seed))
    probs = torch.softmax(S.cut_rows(xd, vals, kd, pd), dim=-1)
    want = torch.where(probs > 0, probs / noise.clamp_min(1e-30), -1.0).argmax(dim=-1)
    got = fast.race(xd, noise, want_v, want_n, vals[:, 0])
    assert got.dtype == torch.int64 and torch.equal(got, want)


_P_ROWS = [(0, 0.95), (0, 0.5), (0, 1e-3), (20, 0.9), (-1, 0.99), (0, 1.0), (0, 0.9999), (0, 0.0), (0, 0.7)]


@pytest.mark.parametrize("V,block", [(300, 64), (5000, 1024)] + ([] if INTERPRET else [(9000, 4096), (248320, 4096)]))
@pytest.mark.parametrize("kind", ["normal", "ties", "flat", "masked", "wide"])
@pytest.mark.parametrize("seed", range(2))
def test_top_p_cut_equals_the_torch_cut_of_the_sorted_row(V, block, kind, seed, monkeypatch):
    """`top_p_cut` gives, for the rows with top-p and no top-k cut (top_k 0 or >= V), a (v, n) that keeps the
    tokens the torch cut over the sorted row keeps (`ops.sampling._nucleus` with C = V), except where a
    token's mass before it is within fp32 rounding of top_p (the float64 oracle flags those rows, and the
    sets differ by a few tokens); the other rows keep what v and n held. Ties at the cut cross slices; 'wide' spans many binary exponents (negative, tiny, huge)."""
    from support.sampling_oracle import kept_oracle as _kept_oracle

    from ninfer.ops.reference import sampling as S
    from ninfer.ops.triton import sampling as fast

    monkeypatch.setattr(fast, "MASS_BLOCK", block)
    g = torch.Generator().manual_seed(90 + seed)
    B = len(_P_ROWS)
    x = torch.randn(B, V, generator=g) * 2
    if kind == "ties":
        x = (x * 2).round() / 2
    elif kind == "flat":
        x = torch.zeros(B, V)
    elif kind == "masked":
        x[:, torch.randperm(V, generator=g)[:V // 3]] = float("-inf")
    elif kind == "wide":
        x = torch.sign(x) * torch.exp(torch.randn(B, V, generator=g) * 4).clamp(max=60.0)
        x[:, ::7] = 0.0
        x[:, 1::7] = -0.0
    ks = torch.tensor([V if k < 0 else k for k, _ in _P_ROWS], dtype=torch.long)
    ps = torch.tensor([p for _, p in _P_ROWS], dtype=torch.float32)
    xd, kd, pd = x.to(DEV), ks.to(DEV), ps.to(DEV)
    srt = xd.sort(dim=1, descending=True).values
    v = torch.full((B,), 123.0, device=DEV)
    n = torch.full((B,), 77, dtype=torch.long, device=DEV)
    fast.top_p_cut(xd, srt[:, 0], kd, pd, v, n)
    want_v, want_n = S._nucleus(xd, srt, kd, pd)
    active = [r for r in range(B) if not 0 < int(ks[r]) < V and float(ps[r]) < 1.0]
    for r in range(B):
        if r not in active:
            assert (v[r].item(), n[r].item()) == (123.0, 77), r
    # NOTE: compared as kept sets: where the mass never reaches top_p the torch cut keeps the row as
    #       (-inf, V), this one as (its smallest value, all of its ties)
    got, want = _kept_sets(xd, v, n), _kept_sets(xd, want_v, want_n)
    differ = [r for r in active if got[r] != want[r]]
    assert all(_kept_oracle(x[r], int(ks[r]), float(ps[r]))[1] for r in differ), differ
    # NOTE: a rounding difference moves the cut by a few tokens, not by a bucket of the descent
    assert all(len(got[r] ^ want[r]) <= max(2, len(want[r]) // 100) for r in differ), \
        [(r, len(got[r]), len(want[r])) for r in differ]
    # NOTE: on 248k-wide rows the masses near a cut are ~1e-6 - 1e-7 each, within the rounding of a
    #       248k-term fp32 sum, so any row may differ there (the oracle flags them as near)
    if V < 10000:
        assert len(differ) <= (4 if kind == "flat" else 1), differ


def _kept_sets(x, v, n):
    """The kept token ids of each row for a cut (v, n): those > v and the n lowest-id ones == v."""
    tie = x == v[:, None]
    keep = (x > v[:, None]) | (tie & (tie.cumsum(dim=1) <= n[:, None]))
    return [set(torch.nonzero(r).flatten().tolist()) for r in keep.cpu()]


@pytest.mark.parametrize("kind", ["normal", "ties"])
def test_race_with_min_p_equals_the_torch_min_p_draw(kind):
    """`race` with min_p keeps only tokens with exp(x - max) >= min_p: the torch draw after step 8 (softmax
    of `_truncate`'s row, p < min_p · max p removed), token for token."""
    from ninfer.ops.reference import sampling as S
    from ninfer.ops.triton import sampling as fast

    V = 5000
    x, _, _ = _rows(kind, V, 7)
    B = x.shape[0]
    xd = x.to(DEV)
    mins = [0.0, 0.05, 0.3, 1.0, 0.01, 0.5, 0.0, 0.2, 0.9, 0.1][:B]
    st = S.SamplingTensors.build(vocab_size=V, device=DEV, temperature=[1.0] * B, top_k=[20] * B,
                                 top_p=[0.95] * B, min_p=mins)
    vals = xd.topk(20, dim=1).values
    v, n = fast.nucleus(xd, vals, st.top_k, st.top_p)
    probs = torch.softmax(S._truncate(xd, st), dim=-1)
    for seed in range(3):
        noise = torch.empty_like(xd).exponential_(generator=gen(seed))
        want = torch.where(probs > 0, probs / noise.clamp_min(1e-30), -1.0).argmax(dim=-1)
        got = fast.race(xd, noise, v, n, vals[:, 0], st.min_p)
        assert torch.equal(got, want), seed


def test_race_keeps_only_the_first_ties_in_id_order(monkeypatch):
    """An all-equal row cut to its 7 lowest ids (n = 7 ties at v) over slices of 4: whatever the noise, the
    winner is one of ids 0..6, the one with the smallest noise, as in the torch race."""
    from ninfer.ops.triton import sampling as fast

    monkeypatch.setattr(fast, "BLOCK", 4)
    V = 50
    x = torch.zeros(3, V, device=DEV)
    v = torch.zeros(3, device=DEV)
    n = torch.tensor([7, 1, 50], dtype=torch.long, device=DEV)
    for seed in range(20):
        noise = torch.empty(3, V, device=DEV).exponential_(generator=gen(seed))
        got = fast.race(x, noise, v, n, x[:, 0]).tolist()
        assert got[0] == int(noise[0, :7].argmin()) and got[1] == 0 and got[2] == int(noise[2].argmin())


def test_nucleus_and_race_bad_arguments():
    from ninfer.ops.reference import sampling as S
    from ninfer.ops.triton import sampling as fast

    assert S.CANDIDATES <= fast.MAX_CANDIDATES          # every candidates row `sample` builds fits `nucleus`

    x = torch.randn(2, 100, device=DEV)
    with pytest.raises(ValueError, match="vals must be"):
        fast.nucleus(x, torch.zeros(2, fast.MAX_CANDIDATES + 1, device=DEV), torch.ones(2, dtype=torch.long,
                     device=DEV), torch.ones(2, device=DEV))
    with pytest.raises(ValueError, match="noise must be"):
        fast.race(x, torch.ones(2, 99, device=DEV), x[:, 0], torch.ones(2, dtype=torch.long, device=DEV), x[:, 0])


@pytest.mark.skipif(DEV != "cuda", reason="sample() takes the fused draw on CUDA only")
@pytest.mark.parametrize("params", [
    dict(temperature=[0.7, 1.0, 1.3], top_k=[20, 5, 40], top_p=[0.95, 1.0, 0.8]),
    dict(temperature=[0.8], top_k=[20], top_p=[0.95]),
    dict(temperature=[0.9, 0.0, 1.1], top_k=[0, 20, 0], top_p=[1.0, 0.9, 1.0]),       # no cut / greedy rows
    dict(temperature=[1.0, 1.0], top_k=[0, 0], top_p=[1.0, 1.0]),                       # nothing truncates
    dict(temperature=[0.8], top_p=[0.95]),                                              # top-p alone
    dict(temperature=[0.7, 1.0, 1.2, 0.9], top_k=[0, 20, 0, 0], top_p=[0.9, 0.95, 1.0, 0.6],
         min_p=[0.05, 0.0, 0.1, 0.0]),                                                  # top-p alone, min-p
])
def test_sample_fused_draw_equals_the_torch_draw(params, monkeypatch):
    """`sample` on CUDA draws through `nucleus` / `top_p_cut` + `race` (FUSED_DRAW): the same tokens and rng
    states, round after round, as with the switch off (the torch cut, min-p and race), on 248k-wide rows."""
    from ninfer.ops.reference import sampling as S

    B = len(params["temperature"])
    logits = torch.randn(B, 248320, generator=gen(3), device=DEV) * 4
    st = S.SamplingTensors.build(vocab_size=248320, device=DEV, **params)
    calls = []
    from ninfer.ops.triton import sampling as fast
    race = fast.race
    monkeypatch.setattr(fast, "race", lambda *a: calls.append(1) or race(*a))
    runs = []
    for fused in (True, False):
        monkeypatch.setattr(S, "FUSED_DRAW", fused)
        states, toks = [S.rng_state_from_seed(s, DEV) for s in range(B)], []
        for _ in range(25):
            r = S.sample(logits, st, states, drawn=S.drawing_rows(params["temperature"]), logprobs=False)
            states, toks = r.rng_states, toks + [r.token_ids.tolist()]
        runs.append((toks, states))
    assert len(calls) == 25
    assert runs[0][0] == runs[1][0]
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
