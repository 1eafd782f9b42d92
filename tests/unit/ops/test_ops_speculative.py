import dataclasses
import math

import pytest
import torch

from ninfer.ops.reference.sampling import SamplingTensors, _truncate, apply_penalties, rng_state_from_seed, sample
from ninfer.ops.reference.speculative import VerifyResult, verify_drafts
from support.ops_util import DEVICES

V = 50


def _st(R, device="cpu", **kw):
    kw.setdefault("temperature", [1.0] * R)
    return SamplingTensors.build(vocab_size=V, device=device, **kw)


def _logits(B, T, seed=0):
    return torch.randn(B, T, V, generator=torch.Generator().manual_seed(seed)) * 2


def _greedy(B, T, **kw):
    return _st(B * T, temperature=[0.0] * (B * T), **kw)


def _block_with_drafts(logits, mismatch_at=None):
    """Drafts equal to the target's argmax at each position, except one wrong draft at `mismatch_at`."""
    drafts = logits[:, :-1].argmax(-1).clone()
    if mismatch_at is not None:
        drafts[:, mismatch_at] = (drafts[:, mismatch_at] + 1) % V
    return drafts


# --- greedy rows ---------------------------------------------------------------------------------

def test_greedy_all_accepted_emits_the_bonus():
    B, K = 3, 4
    logits = _logits(B, K + 1)
    drafts = _block_with_drafts(logits)
    state = rng_state_from_seed(3)
    r = verify_drafts(logits, drafts, _greedy(B, K + 1), [state, None, state])
    assert isinstance(r, VerifyResult)
    assert r.num_accepted.tolist() == [K] * B and r.num_accepted.dtype == torch.long
    assert r.tokens.shape == (B, K + 1) and r.tokens.dtype == torch.long
    assert torch.equal(r.tokens[:, :K], drafts) and torch.equal(r.tokens[:, K], logits[:, K].argmax(-1))
    assert r.rng_states[0] is state and r.rng_states[1] is None and r.rng_states[2] is state


@pytest.mark.parametrize("m", range(4))
def test_greedy_first_mismatch_at_each_position(m):
    B, K = 2, 4
    logits = _logits(B, K + 1, seed=m)
    drafts = _block_with_drafts(logits, mismatch_at=m)
    drafts[:, m + 1:] = (drafts[:, m + 1:] + 7) % V        # later drafts do not matter (also the wrong ones)
    r = verify_drafts(logits, drafts, _greedy(B, K + 1), [None] * B)
    assert r.num_accepted.tolist() == [m] * B
    assert torch.equal(r.tokens[:, :m], drafts[:, :m])
    assert torch.equal(r.tokens[:, m], logits[:, m].argmax(-1))      # the target's token, not the draft
    assert (r.tokens[:, m] != drafts[:, m]).all()


def test_greedy_rows_accept_independently():
    logits = _logits(4, 4, seed=5)
    drafts = _block_with_drafts(logits)
    for b, m in enumerate([0, 2, None, 1]):
        if m is not None:
            drafts[b, m] = (drafts[b, m] + 3) % V
    r = verify_drafts(logits, drafts, _greedy(4, 4), [None] * 4)
    assert r.num_accepted.tolist() == [0, 2, 3, 1]
    for b, a in enumerate(r.num_accepted.tolist()):
        assert r.tokens[b, a] == logits[b, a].argmax()


def test_greedy_ties_resolve_as_argmax():
    logits = _logits(1, 3, seed=6)
    for j, (lo, hi) in enumerate([(4, 40), (9, 17), (0, 49)]):
        logits[0, j, lo] = logits[0, j, hi] = logits[0, j].max() + 1
    # drafts naming the higher id of the tie are rejected: the target's token is the lowest id
    r = verify_drafts(logits, torch.tensor([[40, 17]]), _greedy(1, 3), [None])
    assert r.num_accepted.item() == 0 and r.tokens[0, 0].item() == 4
    r = verify_drafts(logits, torch.tensor([[4, 9]]), _greedy(1, 3), [None])
    assert r.num_accepted.item() == 2 and r.tokens[0].tolist() == [4, 9, 0]
    assert r.tokens[0, 2] == logits[0, 2].argmax()


def test_greedy_penalties_per_position_change_the_target():
    """Position j's output history holds drafts[:j]: a repetition penalty on d_1 moves the target at j = 1."""
    logits = torch.zeros(1, 3, V)
    logits[0, :, 5] = 2.0
    logits[0, :, 6] = 1.5
    hist = [[], [5], [5, 6]]
    st = _greedy(1, 3, repetition_penalty=[2.0] * 3, output_tokens=hist)
    r = verify_drafts(logits, torch.tensor([[5, 6]]), st, [None])
    # j = 0: 5 (2.0 > 1.5); j = 1: 5 is penalized to 1.0, so 6; j = 2: both penalized, 5 (1.0 > 0.75)
    assert r.num_accepted.item() == 2 and r.tokens[0].tolist() == [5, 6, 5]
    r = verify_drafts(logits, torch.tensor([[5, 5]]), st, [None])
    assert r.num_accepted.item() == 1 and r.tokens[0, :2].tolist() == [5, 6]
    # without the per-position histories the second draft 6 would be rejected
    plain = verify_drafts(logits, torch.tensor([[5, 6]]), _greedy(1, 3), [None])
    assert plain.num_accepted.item() == 1 and plain.tokens[0, 1].item() == 5
    # a logit bias on one position only
    st = _greedy(1, 3, logit_bias=[[], [], [(7, 5.0)]])
    r = verify_drafts(logits, torch.tensor([[5, 5]]), st, [None])
    assert r.num_accepted.item() == 2 and r.tokens[0, 2].item() == 7


@pytest.mark.parametrize("L", range(1, 5))
def test_greedy_force_accept_each_length(L):
    K = 3
    logits = _logits(2, K + 1, seed=7)
    drafts = (_block_with_drafts(logits) + 1) % V          # every draft wrong: forced anyway
    r = verify_drafts(logits, drafts, _greedy(2, K + 1), [None, None], force_accept=L)
    assert r.num_accepted.tolist() == [L - 1] * 2
    assert torch.equal(r.tokens[:, :L - 1], drafts[:, :L - 1])
    assert torch.equal(r.tokens[:, L - 1], logits[:, L - 1].argmax(-1))


# --- sampled rows: exact pieces ------------------------------------------------------------------

_PARAMS = [
    dict(),
    dict(top_k=5),
    dict(top_p=0.8, temperature=0.7),
    dict(min_p=0.1, temperature=1.3, repetition_penalty=1.4, presence_penalty=0.3, frequency_penalty=0.2),
    dict(top_k=20, top_p=0.95, min_p=0.02),
]


def _rows(R, p, output_tokens=None, device="cpu"):
    kw = {k: [v] * R for k, v in p.items()}
    kw.setdefault("temperature", [1.0] * R)
    return _st(R, device=device, prompt_tokens=[[1, 2, 3]] * R, output_tokens=output_tokens, **kw)


@pytest.mark.parametrize("p", _PARAMS)
def test_no_drafts_is_one_sample_step(p):
    """K = 0: the random stream is one noise row, so the token and the next state equal `sample`'s."""
    B = 4
    logits = _logits(B, 1, seed=8)
    hist = [[4], [], [7, 7, 8], [1]]
    states = [rng_state_from_seed(s) for s in range(B)]
    for _ in range(5):
        st = _rows(B, p, hist)
        r = verify_drafts(logits, torch.empty(B, 0, dtype=torch.long), st, states)
        want = sample(logits[:, 0], st, states)
        assert r.num_accepted.tolist() == [0] * B
        assert torch.equal(r.tokens[:, 0], want.token_ids)
        assert all(torch.equal(a, b) for a, b in zip(r.rng_states, want.rng_states))
        states = r.rng_states


@pytest.mark.parametrize("L", range(1, 4))
@pytest.mark.parametrize("p", _PARAMS)
def test_sampled_force_accept_draws_from_the_whole_p(L, p):
    """Forced length L: the emitted token is `sample`'s draw at position L - 1 from the state after rand(K)."""
    B, K = 3, 2
    logits = _logits(B, K + 1, seed=9)
    drafts = torch.randint(0, V, (B, K), generator=torch.Generator().manual_seed(1))
    hist = [list(drafts[b, :j].tolist()) for b in range(B) for j in range(K + 1)]
    st = _rows(B * (K + 1), p, hist)
    states = [rng_state_from_seed(10 + b) for b in range(B)]
    r = verify_drafts(logits, drafts, st, states, force_accept=L)
    assert r.num_accepted.tolist() == [L - 1] * B and torch.equal(r.tokens[:, :L - 1], drafts[:, :L - 1])
    for b in range(B):
        gen = torch.Generator()
        gen.set_state(states[b])
        torch.rand(K, generator=gen)
        row = b * (K + 1) + L - 1
        want = sample(logits[b, L - 1][None], _rows(1, p, [hist[row]]), [gen.get_state()])
        assert r.tokens[b, L - 1] == want.token_ids[0]
        assert torch.equal(r.rng_states[b], want.rng_states[0])


def test_draft_outside_the_kept_set_is_always_rejected_and_never_emitted():
    logits = _logits(1, 2, seed=10)
    d = logits[0, 0].argsort(descending=True)[3].item()     # 4th most likely: outside top-3
    st = _rows(2, dict(top_k=3))
    for s in range(200):
        r = verify_drafts(logits, torch.tensor([[d]]), st, [rng_state_from_seed(s)])
        assert r.num_accepted.item() == 0 and r.tokens[0, 0].item() != d


def test_rejection_draws_from_p_without_the_draft():
    """Top-2 keeps two tokens: on rejection of one of them, the other is the only possible token."""
    logits = _logits(1, 3, seed=11)
    first, second = logits[0, 0].argsort(descending=True)[:2].tolist()
    st = _rows(3, dict(top_k=2))
    seen = {0: 0, 1: 0}
    for s in range(300):
        r = verify_drafts(logits, torch.tensor([[first, 0]]), st, [rng_state_from_seed(s)])
        a = r.num_accepted.item()
        seen[min(a, 1)] += 1
        if a == 0:
            assert r.tokens[0, 0].item() == second
    assert seen[0] > 20 and seen[1] > 20


def test_certain_draft_is_always_accepted():
    logits = _logits(2, 3, seed=12)
    drafts = logits[:, :2].argmax(-1)
    st = _rows(6, dict(top_k=1))                  # p = one-hot(argmax): u < 1 always
    for s in range(50):
        r = verify_drafts(logits, drafts, st, [rng_state_from_seed(s), rng_state_from_seed(s + 1)])
        assert r.num_accepted.tolist() == [2, 2] and torch.equal(r.tokens[:, 2], logits[:, 2].argmax(-1))


@pytest.mark.parametrize("device", DEVICES)
def test_seeded_rounds_reproduce_and_only_drawn_rows_advance(device):
    """A mixed batch: greedy rows keep their state and match an all-greedy batch; seeded rows repeat with
    the same states; None rows keep None; `drawn` given or computed agree."""
    B, K = 4, 3
    logits = _logits(B, K + 1, seed=13).to(device)
    drafts = torch.randint(0, V, (B, K), generator=torch.Generator().manual_seed(2)).to(device)
    drafts[:, 0] = logits[:, 0].argmax(-1)
    temps = [0.0, 0.9, 1.0, 0.0]
    st = _st(B * (K + 1), device, temperature=[t for t in temps for _ in range(K + 1)], top_p=[0.9] * (B * (K + 1)))
    s0 = [rng_state_from_seed(1, device), rng_state_from_seed(2, device), None, rng_state_from_seed(4, device)]
    a = verify_drafts(logits, drafts, st, s0)
    b = verify_drafts(logits, drafts, st, s0, drawn=[1, 2])
    assert a.tokens.device.type == torch.device(device).type
    assert torch.equal(a.num_accepted[[0, 1, 3]], b.num_accepted[[0, 1, 3]])    # row 2 draws from the global generator
    for r in (a, b):
        n = r.num_accepted
        assert torch.equal(r.tokens[1, :n[1] + 1], a.tokens[1, :n[1] + 1])
        assert r.rng_states[0] is s0[0] and r.rng_states[3] is s0[3] and r.rng_states[2] is None
        assert not torch.equal(r.rng_states[1], s0[1]) and torch.equal(r.rng_states[1], a.rng_states[1])
    g = verify_drafts(logits[[0, 3]], drafts[[0, 3]], _st(2 * (K + 1), device, temperature=[0.0] * (2 * (K + 1))),
                      [None, None])
    assert torch.equal(a.num_accepted[[0, 3]], g.num_accepted)
    for i, row in enumerate([0, 3]):
        assert torch.equal(a.tokens[row, :g.num_accepted[i] + 1], g.tokens[i, :g.num_accepted[i] + 1])
    # the stream: rand(K), then one noise row; committing the state gives a new draw
    runs = []
    for _ in range(2):
        states, out = s0, []
        for _ in range(15):
            r = verify_drafts(logits, drafts, st, states)
            out.append((r.num_accepted[1].item(), r.tokens[1, r.num_accepted[1]].item()))
            states = r.rng_states
        runs.append(out)
    assert runs[0] == runs[1] and len(set(runs[0])) > 1


def test_bf16_logits():
    logits = _logits(2, 3, seed=14).bfloat16()
    drafts = logits[:, :2].float().argmax(-1)
    r = verify_drafts(logits, drafts, _greedy(2, 3), [None, None])
    assert r.num_accepted.tolist() == [2, 2] and torch.equal(r.tokens[:, 2], logits[:, 2].float().argmax(-1))
    r = verify_drafts(logits, drafts, _st(6), [rng_state_from_seed(0), None])
    assert r.tokens.dtype == torch.long


def test_bad_inputs():
    logits = _logits(2, 3)
    drafts = torch.zeros(2, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="drafts"):
        verify_drafts(logits, drafts[:, :1], _st(6), [None, None])
    with pytest.raises(ValueError, match="sampling rows"):
        verify_drafts(logits, drafts, _st(2), [None, None])
    with pytest.raises(ValueError, match="rng states"):
        verify_drafts(logits, drafts, _st(6), [None])
    with pytest.raises(ValueError, match="force_accept"):
        verify_drafts(logits, drafts, _st(6), [None, None], force_accept=4)
    with pytest.raises(ValueError, match="logits"):
        verify_drafts(logits[0], drafts, _st(6), [None, None])


# --- sampled rows: the statistical test --------------------------------------------------------
#
# A toy target over 6 tokens: a Markov chain whose logits for the next token are CHAIN[prev], under the
# variant's temperature / top-k / top-p / min-p / penalties (the output history is the run's own tokens,
# the prompt PROMPT). A drafter proposes each draft from DRAFTER[prev] (random, but never looking at the
# verifier's numbers), sometimes a token the target likes, sometimes one outside its kept set. Rounds are
# emulated as the Program runs them (the logits at position j are the chain's row for the token at j,
# the history at j holds the drafts before j) until each run has emitted 3 tokens; the first 3 are
# compared with the exact law of 3 plain sampling steps by total variation distance.
#
# Threshold: with N runs over the M cells where the exact law p is positive, the empirical law p' of an
# exact sampler has E|p'_i - p_i| ~ sqrt(2 p_i / (pi N)), so E[TV] = 1/2 sum_i E|p'_i - p_i| <=
# sqrt(M / (2 pi N)) (Cauchy-Schwarz over the M cells); its spread is about 1/2 sqrt((1 - 2/pi) / N) ~ 0.002
# at N = 20000. The test allows 3 x sqrt(M / (2 pi N)) (0.025-0.09 here), and on top of that no run may emit
# a sequence of exact probability 0 (a draft outside the kept set got through).

SV = 6
N_RUNS = 20000
PROMPT = [3, 0]
CHAIN = torch.tensor([
    [2.0, 1.5, 0.0, 1.0, -1.0, 0.5],
    [0.0, 0.5, 2.5, 2.5, 1.0, -0.5],     # a tie at the top
    [1.0, 1.0, 1.0, 0.0, 2.0, -2.0],     # three equal values below the top (ties at the top-k / top-p cut)
    [-1.0, 0.0, 0.3, 2.0, 0.7, 1.5],
    [3.0, 0.0, 0.0, 0.5, 1.0, 0.2],
    [0.5, 2.0, -0.5, 1.0, 0.0, 1.8],
])
DRAFTER = torch.tensor([
    [0.5, 0.0, 0.0, 0.1, 0.4, 0.0],      # 4: outside the target's top-3 after 0
    [0.0, 0.0, 0.6, 0.0, 0.0, 0.4],      # 5: the target's least likely token
    [0.3, 0.0, 0.2, 0.0, 0.5, 0.0],
    [0.0, 0.0, 0.0, 0.5, 0.0, 0.5],
    [0.2, 0.0, 0.3, 0.0, 0.5, 0.0],
    [0.0, 0.6, 0.0, 0.0, 0.4, 0.0],
])
VARIANTS = {
    "top_k": (2, dict(temperature=1.0, top_k=3)),
    "top_p": (3, dict(temperature=0.8, top_p=0.7)),
    "min_p_penalties": (1, dict(temperature=1.2, min_p=0.15, repetition_penalty=1.5, presence_penalty=0.5,
                                frequency_penalty=0.3)),
    "all": (2, dict(temperature=1.0, top_k=4, top_p=0.9, min_p=0.05, frequency_penalty=0.4)),
}


_PER_ROW = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")


def _chain_st(params, hist):
    """SamplingTensors for R rows of the toy chain whose output histories are hist [R, H] (padded with SV):
    `build` of one row, its tensors repeated (`build` itself takes lists, slow for 10^5 rows)."""
    R = hist.shape[0]
    one = SamplingTensors.build(vocab_size=SV, device="cpu", **{k: [v] for k, v in params.items()})
    return dataclasses.replace(one, prompt_ids=torch.tensor(PROMPT).expand(R, -1), output_ids=hist,
                               **{f: getattr(one, f).repeat(R) for f in _PER_ROW})


def _probs(logits, st, temperature):
    """`sample`'s distribution of each row (steps 1-8 of `sampling`, then the softmax)."""
    return torch.softmax(_truncate(apply_penalties(logits, st) / temperature, st), dim=-1)


def _exact(params):
    """The exact law of 3 plain sampling steps from PROMPT, over the SV**3 sequences (flat, t1 t2 t3)."""
    pad = lambda rows: torch.tensor([r + [SV] * (2 - len(r)) for r in rows])    # noqa: E731
    t = params["temperature"]
    p1 = _probs(CHAIN[PROMPT[-1]][None], _chain_st(params, pad([[]])), t)[0]
    p2 = _probs(CHAIN, _chain_st(params, pad([[a] for a in range(SV)])), t)
    pairs = [[a, b] for a in range(SV) for b in range(SV)]
    p3 = _probs(CHAIN[[b for _, b in pairs]], _chain_st(params, pad(pairs)), t).view(SV, SV, SV)
    return (p1[:, None, None] * p2[:, :, None] * p3).flatten().double()


def _emulate(params, K, verify, seed, seeded):
    """The first 3 tokens of N_RUNS runs of speculative rounds, [N, 3]. seeded: run i has its own generator
    seeded with seed + i; else the runs draw from the global generator seeded with seed."""
    g = torch.Generator().manual_seed(seed)
    n, T = N_RUNS, K + 1
    out = torch.full((n, 3 + K), SV)
    count = torch.zeros(n, dtype=torch.long)
    last = torch.full((n,), PROMPT[-1])
    states = [rng_state_from_seed(seed + i) for i in range(n)] if seeded else [None] * n
    torch.manual_seed(seed)
    while (count < 3).any():
        rows = torch.nonzero(count < 3).flatten()
        R = rows.numel()
        prev, drafts = last[rows], []
        for _ in range(K):
            prev = torch.multinomial(DRAFTER[prev], 1, generator=g)[:, 0]
            drafts.append(prev)
        drafts = torch.stack(drafts, 1)
        block = torch.cat([last[rows, None], drafts], 1)
        later = torch.arange(K)[None, None, :] >= torch.arange(T)[None, :, None]          # draft k after position j
        hist = torch.cat([out[rows, None].expand(R, T, -1), drafts[:, None].expand(R, T, K).masked_fill(later, SV)], 2)
        r = verify(CHAIN[block], drafts, _chain_st(params, hist.reshape(R * T, -1)), [states[i] for i in rows.tolist()])
        c = count[rows]
        for i in range(T):
            m = i <= r.num_accepted
            out[rows[m], c[m] + i] = r.tokens[m, i]
        last[rows] = r.tokens.gather(1, r.num_accepted[:, None])[:, 0]
        count[rows] = c + r.num_accepted + 1
        for i, s in zip(rows.tolist(), r.rng_states):
            states[i] = s
    return out[:, :3]


def _plain(params, seed):
    """The first 3 tokens of N_RUNS runs of plain `sample` steps from the global generator seeded with seed, [N, 3]."""
    n = N_RUNS
    out = torch.full((n, 3), SV)
    states = [None] * n
    torch.manual_seed(seed)
    last = torch.full((n,), PROMPT[-1])
    for step in range(3):
        r = sample(CHAIN[last], _chain_st(params, out[:, :max(step, 1)] if step else torch.full((n, 1), SV)), states)
        out[:, step] = last = r.token_ids
        states = r.rng_states
    return out


def _wrong_verify(logits, drafts, st, rng_states):
    """A deliberately wrong rule: on a rejection the token is drawn from p_a itself, the draft left in."""
    r = verify_drafts(logits, drafts, st, rng_states)
    B, T, _ = logits.shape
    p = _probs(logits.reshape(B * T, SV), st, st.temperature[:, None]).view(B, T, SV)
    pa = p[torch.arange(B), r.num_accepted]
    redraw = torch.multinomial(pa, 1, generator=torch.Generator().manual_seed(int(drafts.sum())))[:, 0]
    rejected = r.num_accepted < T - 1
    tokens = r.tokens.clone()
    tokens[rejected, r.num_accepted[rejected]] = redraw[rejected]
    return r._replace(tokens=tokens)


def _tv_and_threshold(first3, exact):
    cells = first3[:, 0] * SV * SV + first3[:, 1] * SV + first3[:, 2]
    emp = torch.bincount(cells, minlength=SV ** 3).double() / first3.shape[0]
    M = int((exact > 0).sum())
    threshold = 3 * math.sqrt(M / (2 * math.pi * first3.shape[0]))
    return 0.5 * (emp - exact).abs().sum().item(), threshold, emp[exact == 0].sum().item()


@pytest.fixture
def one_thread():
    """The statistical tests run many ops on small tensors: one intra-op thread keeps them fast on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# NOTE: one variant uses a generator per run (the seeded requests' path, a Python loop over rows); the
#       others draw from the global generator (the unseeded path, batched), which keeps the file fast.
@pytest.mark.parametrize("name, seeded", [(name, name == "all") for name in VARIANTS])
def test_speculative_sampling_has_the_law_of_plain_sampling(name, seeded, one_thread):
    K, params = VARIANTS[name]
    exact = _exact(params)
    assert abs(exact.sum().item() - 1) < 1e-6
    # the drafter proposes tokens outside the kept set, and tokens the target likes
    p = _probs(CHAIN, _chain_st(params, torch.full((SV, 1), SV)), params["temperature"])
    assert ((DRAFTER > 0) & (p == 0)).any() and ((DRAFTER > 0) & (p > 0.2)).any()
    tv, threshold, outside = _tv_and_threshold(_emulate(params, K, verify_drafts, seed=1000, seeded=seeded), exact)
    assert outside == 0
    assert tv < threshold, (tv, threshold)
    # control: plain `sample` against the same exact law
    tv_plain, _, outside = _tv_and_threshold(_plain(params, seed=5000), exact)
    assert outside == 0 and tv_plain < threshold, (tv_plain, threshold)


def test_the_statistical_check_catches_a_wrong_rule(one_thread):
    K, params = VARIANTS["top_k"]
    tv, threshold, _ = _tv_and_threshold(_emulate(params, K, _wrong_verify, seed=1000, seeded=False), _exact(params))
    assert tv > 2 * threshold, (tv, threshold)
