import pytest
import torch

from ninfer.ops.reference.sampling import SamplingTensors, apply_penalties, rng_state_from_seed, sample
from support.ops_util import DEVICES, kept_oracle

V = 50


def _st(B, **kw):
    kw.setdefault("temperature", [1.0] * B)
    return SamplingTensors.build(vocab_size=V, device="cpu", **kw)


def _logits(B, seed=0):
    return torch.randn(B, V, generator=torch.Generator().manual_seed(seed)) * 2


def _draws(logits_row, n, seed=0, **params):
    """n draws from one row, committing the rng state each time."""
    st = _st(1, **{k: [v] for k, v in params.items()})
    state = rng_state_from_seed(seed)
    out = []
    for _ in range(n):
        r = sample(logits_row[None], st, [state])
        state = r.rng_states[0]
        out.append(r.token_ids.item())
    return torch.tensor(out)


def test_greedy_is_argmax_lowest_index_on_ties_and_keeps_rng():
    logits = _logits(3)
    logits[1, 7] = logits[1, 30] = logits[1].max() + 1
    state = rng_state_from_seed(5)
    r = sample(logits, _st(3, temperature=[0.0] * 3), [state, None, state])
    assert torch.equal(r.token_ids, logits.argmax(-1)) and r.token_ids[1].item() == 7
    assert torch.equal(r.rng_states[0], state) and r.rng_states[1] is None


def test_bf16_logits_and_raw_logprobs():
    logits = _logits(4, seed=1).bfloat16()
    r = sample(logits, _st(4, temperature=[0.0, 1.0, 0.7, 0.0], repetition_penalty=[1.5] * 4,
                           prompt_tokens=[[1, 2]] * 4), [rng_state_from_seed(i) for i in range(4)], num_logprobs=5)
    raw = torch.log_softmax(logits.float(), -1)
    torch.testing.assert_close(r.logprobs, raw.gather(1, r.token_ids[:, None])[:, 0])
    torch.testing.assert_close(r.top_logprobs, raw.topk(5, -1).values)
    assert r.top_ids.shape == (4, 5) and r.top_ids.dtype == torch.long


def test_determinism_and_state_restore():
    logits = _logits(2, seed=2)
    st = _st(2, temperature=[1.0, 1.3], top_p=[0.9, 1.0])
    s0 = [rng_state_from_seed(11), rng_state_from_seed(12)]
    a = sample(logits, st, s0)
    b = sample(logits, st, s0)   # not committed: the same states again reproduce the same tokens
    assert torch.equal(a.token_ids, b.token_ids)
    assert not torch.equal(a.rng_states[0], s0[0])
    seq1 = [sample(logits, st, s).token_ids for s in [s0]]
    states = s0
    toks = []
    for _ in range(20):
        r = sample(logits, st, states)
        toks.append(r.token_ids)
        states = r.rng_states
    again, states = [], s0
    for _ in range(20):
        r = sample(logits, st, states)
        again.append(r.token_ids)
        states = r.rng_states
    assert torch.equal(torch.stack(toks), torch.stack(again))
    assert torch.equal(seq1[0], toks[0])
    assert len(set(torch.stack(toks)[:, 0].tolist())) > 1   # it actually samples
    # another seed gives another sequence
    other = _draws(logits[0], 20, seed=99, temperature=1.0, top_p=0.9)
    assert not torch.equal(other, torch.stack(toks)[:, 0])


def test_distribution_matches_softmax():
    logits = torch.zeros(V)
    logits[:4] = torch.tensor([2.0, 1.0, 0.5, 0.0])
    logits[4:] = -20
    n = 4000
    draws = _draws(logits, n, seed=3, temperature=1.0)
    freq = torch.bincount(draws, minlength=V)[:4].float() / n
    p = torch.softmax(logits, -1)[:4]
    assert (freq - p).abs().max() < 0.03
    # temperature 0.5 sharpens: p ∝ exp(2 x)
    draws = _draws(logits, n, seed=4, temperature=0.5)
    freq = torch.bincount(draws, minlength=V)[:4].float() / n
    assert (freq - torch.softmax(logits * 2, -1)[:4]).abs().max() < 0.03


def test_truncations():
    logits = _logits(1, seed=5)[0] * 0.5
    order = logits.argsort(descending=True)
    assert (_draws(logits, 30, top_k=1) == order[0]).all()
    assert (_draws(logits, 30, top_p=1e-6) == order[0]).all()
    top3 = set(order[:3].tolist())
    assert set(_draws(logits, 300, top_k=3).tolist()) == top3
    p = torch.softmax(logits, -1)
    need = int((p[order].cumsum(0) < 0.5).sum()) + 1       # smallest prefix with mass >= 0.5
    assert set(_draws(logits, 400, top_p=0.5).tolist()) <= set(order[:need].tolist())
    allowed = set(torch.nonzero(p >= 0.3 * p.max()).flatten().tolist())
    assert 2 <= len(allowed) < V // 2
    got = set(_draws(logits, 400, min_p=0.3).tolist())
    assert got <= allowed and len(got) >= 2
    assert (_draws(logits, 30, min_p=1.0) == order[0]).all()


def test_penalties_exact():
    x = torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.5] + [0.0] * (V - 5)])
    st = _st(1, repetition_penalty=[2.0], presence_penalty=[0.5], frequency_penalty=[0.25],
             prompt_tokens=[[0, 1]], output_tokens=[[2, 2, 3]], logit_bias=[[(4, 10.0), (5, -3.0)]])
    y = apply_penalties(x, st)
    exp = x.clone()
    exp[0, 0], exp[0, 1] = 1.0, -4.0                      # repetition only (prompt)
    exp[0, 2] = 1.0 / 2 - 0.5 - 0.25 * 2                   # repetition + presence + frequency (count 2)
    exp[0, 3] = -1.0 * 2 - 0.5 - 0.25
    exp[0, 4], exp[0, 5] = 10.5, -3.0                      # bias only
    torch.testing.assert_close(y, exp)
    # greedy sees the penalties: token 0 loses its lead against an unpenalised 1.5
    x[0, 6] = 1.5
    r = sample(x, _st(1, temperature=[0.0], repetition_penalty=[2.0], prompt_tokens=[[0]]), [None])
    assert r.token_ids.item() == 6
    # logit bias forces a token under sampling
    r = sample(x, _st(1, logit_bias=[[(9, 100.0)]]), [rng_state_from_seed(0)])
    assert r.token_ids.item() == 9
    assert r.logprobs.item() == pytest.approx(torch.log_softmax(x, -1)[0, 9].item())


def test_per_row_params_are_independent():
    logits = _logits(3, seed=6)
    st = _st(3, temperature=[0.0, 1.0, 1.0], top_k=[0, 1, 0])
    r = sample(logits, st, [None, rng_state_from_seed(1), rng_state_from_seed(2)])
    assert r.token_ids[0] == logits[0].argmax() and r.token_ids[1] == logits[1].argmax()
    solo = sample(logits[2:], _st(1), [rng_state_from_seed(2)])
    assert r.token_ids[2] == solo.token_ids[0]


def test_bad_inputs():
    with pytest.raises(ValueError):
        _st(1, logit_bias=[[(V, 1.0)]])
    with pytest.raises(ValueError):
        sample(_logits(2), _st(1), [None])


@pytest.mark.parametrize("device", DEVICES)
def test_device_rng_states_reproduce(device):
    logits = _logits(3, seed=7).to(device)
    st = SamplingTensors.build(vocab_size=V, device=device, temperature=[0.0, 0.8, 1.0], top_k=[0, 10, 0],
                               output_tokens=[[1], [2, 2], []], frequency_penalty=[0.0, 0.5, 0.0])
    s0 = [None, rng_state_from_seed(1, device), rng_state_from_seed(2, device)]
    runs = []
    for _ in range(2):
        states, toks = s0, []
        for _ in range(10):
            r = sample(logits, st, states, num_logprobs=2)
            states, toks = r.rng_states, toks + [r.token_ids]
        runs.append(torch.stack(toks))
    assert runs[0].device.type == torch.device(device).type
    assert torch.equal(runs[0], runs[1]) and (runs[0][:, 0] == logits[0].argmax()).all()


@pytest.mark.parametrize("kw", [dict(), dict(min_p=[0.0, 0.05, 0.0]), dict(top_k=[0, V, V + 5], top_p=[1.0, 1.0, 1.0])])
def test_rows_without_truncation_skip_the_sort_and_draw_the_same(kw):
    """No row with top-k < V or top-p < 1: `build` marks the step as not truncating and `sample` skips the
    full-vocabulary sort (and min-p when no row has it); tokens and generator states equal the full path's."""
    import dataclasses

    st = _st(3, temperature=[0.7, 1.0, 1.3], **kw)
    assert not st.truncates and st.min_p_any == ("min_p" in kw)
    full = dataclasses.replace(st, truncates=True, min_p_any=True)
    logits = _logits(3, seed=11)
    for tensors in (st, full):
        states, toks = [rng_state_from_seed(s) for s in (1, 2, 3)], []
        for _ in range(12):
            r = sample(logits, tensors, states)
            states, toks = r.rng_states, toks + [r.token_ids.tolist()]
        if tensors is st:
            ref = (toks, [s.clone() for s in states])
    assert toks == ref[0] and all(torch.equal(a, b) for a, b in zip(states, ref[1]))
    assert _st(1, temperature=[1.0], top_k=[5]).truncates and _st(1, temperature=[1.0], top_p=[0.9]).truncates


def _kept(x: torch.Tensor, st: SamplingTensors) -> list[set[int]]:
    from ninfer.ops.reference.sampling import _truncate
    y = _truncate(x, st)
    return [set(torch.nonzero(torch.isfinite(r)).flatten().tolist()) for r in y]


_CUT_ROWS = [(20, 0.95), (1, 1.0), (5, 0.5), (20, 1.0), (0, 1.0), (V - 1, 0.9), (3, 1e-3), (49, 0.99)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["normal", "ties", "flat", "masked"])
@pytest.mark.parametrize("seed", range(6))
def test_top_k_candidates_cut_the_same_tokens_as_the_sorted_row(kind, seed, device):
    """Rows whose top-k bounds the cut read only the row's `topk` (st.candidates > 0); the kept tokens are the
    oracle's (the docstring's rule, ties by lowest id) and the full sort's, also where many values tie at the
    k-th or at the top-p cut (values rounded like bf16 logits), in a flat row and with -inf entries."""
    import dataclasses

    g = torch.Generator().manual_seed(100 + seed)
    B = len(_CUT_ROWS)
    x = torch.randn(B, V, generator=g) * 2
    if kind == "ties":
        x = (x * 2).round() / 2                       # ~17 distinct values: ties at every cut
    elif kind == "flat":
        x = torch.zeros(B, V)
    elif kind == "masked":
        x[:, torch.randperm(V, generator=g)[:V // 3]] = float("-inf")
    ks, ps = [k for k, _ in _CUT_ROWS], [p for _, p in _CUT_ROWS]
    st = SamplingTensors.build(vocab_size=V, device=device, temperature=[1.0] * B, top_k=ks, top_p=ps)
    assert st.candidates == max(k for k in ks if k)
    fast, full = _kept(x.to(device), st), _kept(x.to(device), dataclasses.replace(st, candidates=0))
    checked = 0
    for r in range(B):
        want, near = kept_oracle(x[r], ks[r], ps[r])
        want &= set(torch.nonzero(torch.isfinite(x[r])).flatten().tolist())     # -inf stays out
        if near:
            continue
        assert fast[r] == want, (r, ks[r], ps[r])
        assert full[r] == want, (r, ks[r], ps[r])
        checked += 1
    assert checked >= B - 2


def test_top_p_only_rows_sort_the_whole_row():
    """A row with top-p and no top-k (or a top-k above CANDIDATES) needs the sorted row: st.candidates is 0;
    rows without any cut do not count."""
    from ninfer.ops.reference.sampling import CANDIDATES

    assert _st(2, top_k=[20, 0], top_p=[0.95, 1.0]).candidates == 20
    assert _st(2, top_k=[20, 0], top_p=[0.95, 0.9]).candidates == 0
    assert _st(2, top_k=[V, 7], top_p=[1.0, 1.0]).candidates == 7       # top_k >= V is no cut
    assert _st(1, top_k=[V], top_p=[0.9]).candidates == 0
    assert _st(1).candidates == 0 and not _st(1).truncates
    big = 4 * CANDIDATES
    assert SamplingTensors.build(vocab_size=big, device="cpu", temperature=[1.0, 1.0],
                                 top_k=[CANDIDATES, 3]).candidates == CANDIDATES
    assert SamplingTensors.build(vocab_size=big, device="cpu", temperature=[1.0, 1.0],
                                 top_k=[CANDIDATES + 1, 3]).candidates == 0


def test_fused_draw_facts_of_the_rows():
    """`build`'s facts for the fused draw: top_k_max, the largest top-k cut (0 without one; top_k >= V is no
    cut), and top_p_only, whether a row cuts by top-p without a top-k cut (the fast `top_p_cut` rows). The
    dataclass defaults (not built) are the safe ones: top_k_max unknown (-1), top_p_only True."""
    st = _st(3, top_k=[20, 0, V], top_p=[0.95, 0.9, 1.0])
    assert (st.top_k_max, st.top_p_only, st.candidates) == (20, True, 0)
    assert (_st(2, top_k=[20, 0], top_p=[0.95, 1.0]).top_k_max, _st(2, top_k=[20, 0], top_p=[0.95, 1.0]).top_p_only) \
        == (20, False)
    assert (_st(1, top_k=[V], top_p=[0.5]).top_k_max, _st(1, top_k=[V], top_p=[0.5]).top_p_only) == (0, True)
    assert (_st(1).top_k_max, _st(1).top_p_only) == (0, False)
    assert (_st(2, top_k=[7, 30]).top_k_max, _st(2, top_k=[7, 30]).top_p_only) == (30, False)
    fields = {f.name: f.default for f in __import__("dataclasses").fields(SamplingTensors)}
    assert fields["top_k_max"] == -1 and fields["top_p_only"] is True


def test_top_k_candidates_draw_the_same_tokens_and_states():
    """The candidate cut and the full sort give the same draws, token for token, and the same rng states."""
    import dataclasses

    logits = _logits(3, seed=12)
    st = _st(3, temperature=[0.7, 1.0, 1.3], top_k=[20, 5, 40], top_p=[0.95, 1.0, 0.8], min_p=[0.0, 0.0, 0.05])
    assert st.candidates == 40
    runs = []
    for tensors in (st, dataclasses.replace(st, candidates=0)):
        states, toks = [rng_state_from_seed(s) for s in (4, 5, 6)], []
        for _ in range(30):
            r = sample(logits, tensors, states)
            states, toks = r.rng_states, toks + [r.token_ids.tolist()]
        runs.append((toks, states))
    assert runs[0][0] == runs[1][0] and all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))
    assert len({t[0] for t in runs[0][0]}) > 1


def test_unpenalized_rows_skip_the_penalties_and_logprobs_can_be_skipped():
    """Without a bias or penalty in any row `build` marks the step unpenalized and steps 1-3 are skipped; the
    draws and states equal the full path's. logprobs=False returns no log-probs and the same tokens."""
    import dataclasses

    assert not _st(2).penalized and not _st(1, repetition_penalty=[1.0], presence_penalty=[0.0]).penalized
    assert _st(2, repetition_penalty=[1.0, 1.1]).penalized and _st(1, frequency_penalty=[0.5]).penalized
    assert _st(1, presence_penalty=[-0.5]).penalized and _st(1, logit_bias=[[(3, 0.0)]]).penalized
    logits = _logits(3, seed=13)
    st = _st(3, temperature=[0.0, 0.9, 1.2], top_k=[0, 10, 0], top_p=[1.0, 0.9, 1.0])
    runs = []
    for tensors, lp in ((st, True), (dataclasses.replace(st, penalized=True), True), (st, False)):
        states, toks = [None, rng_state_from_seed(7), rng_state_from_seed(8)], []
        for _ in range(15):
            r = sample(logits, tensors, states, logprobs=lp)
            assert (r.logprobs is None) == (not lp)
            states, toks = r.rng_states, toks + [r.token_ids.tolist()]
        runs.append((toks, states[1:]))
    for other in runs[1:]:
        assert other[0] == runs[0][0] and all(torch.equal(a, b) for a, b in zip(other[1], runs[0][1]))
    with pytest.raises(ValueError, match="num_logprobs"):
        sample(logits, st, [None] * 3, num_logprobs=2, logprobs=False)
