"""Speculative rounds of the Qwen3.6 Program (speculate.py), fp32 on the CPU, tiny identities with their
checkpoints' MTP layers: greedy output with speculation equals greedy output without it, token for token,
whatever the drafts (the MTP layer's own, all of the target's continuation, or wrong at chosen positions)."""
from __future__ import annotations

import pytest
import torch

from ninfer.contract.program import SamplingParams
from support.program_util import GREEDY, greedy_reference, materialize, prompt, run_rows, tiny_program

KINDS = ["dense", "moe"]


def _spec(tiny_artifact_path, kind, K, **kw):
    return tiny_program(tiny_artifact_path, kind, speculative_method="mtp", num_speculative_tokens=K,
                        max_steps=K + 1, **kw)


class ScriptedDrafter:
    """Proposes the target's own continuation (`truth[row tokens so far]`), wrong where `wrong(pos)` says."""

    def __init__(self, K, truth, wrong=lambda i: False):
        self.k, self.truth, self.wrong = K, truth, wrong

    def propose(self, program, seqs):
        rows = []
        for s in seqs:
            cont = self.truth[tuple(s.tokens[:s.num_prompt])]
            n = len(s.tokens) - s.num_prompt
            ds = [cont[n + i] if n + i < len(cont) else 0 for i in range(self.k)]
            rows.append([(d + 1) % 1000 if self.wrong(n + i) else d for i, d in enumerate(ds)])
        return torch.tensor(rows, dtype=torch.long, device=program.device)


@pytest.mark.parametrize("kind", KINDS)
def test_mtp_greedy_equals_plain_greedy(tiny_artifact_path, kind):
    plain = tiny_program(tiny_artifact_path, kind)
    prompts = [prompt(5 + 3 * i, seed=i) for i in range(4)]
    ref = [list(greedy_reference(plain, p, 24)) for p in prompts]
    for K, vocab in ((3, 0), (1, 5000)):
        prog = _spec(tiny_artifact_path, kind, K, draft_vocab_size=vocab)
        out, rounds = run_rows(prog, prompts, 24)
        assert out == ref, K
        assert prog.drafter.vocab == (vocab or prog._sampler.sampleable)
        assert all(r.drafted == K and 1 <= r.produced_tokens <= K + 1 for r in rounds)


@pytest.mark.parametrize("kind", KINDS)
def test_scripted_drafts_are_accepted_or_rejected_where_they_should(tiny_artifact_path, kind):
    plain = tiny_program(tiny_artifact_path, kind)
    prompts = [prompt(6 + i, seed=10 + i) for i in range(3)]
    ref = {tuple(p): list(greedy_reference(plain, p, 30)) for p in prompts}
    K = 4
    prog = _spec(tiny_artifact_path, kind, K)
    prog.drafter = ScriptedDrafter(K, ref)
    out, rounds = run_rows(prog, prompts, 30)
    assert out == [ref[tuple(p)] for p in prompts]
    assert all(r.produced_tokens == K + 1 for r in rounds[:-len(prompts)])     # everything accepted
    wrong = {3, 9, 10, 17}
    prog.drafter = ScriptedDrafter(K, ref, wrong=lambda i: i in wrong)
    out, rounds = run_rows(prog, prompts, 30)
    assert out == [ref[tuple(p)] for p in prompts]
    # NOTE: a round starting at output n (the drafts are tokens n..n+K-1) stops at the first wrong one.
    n = 1
    for r in rounds[::len(prompts)]:
        bad = [i for i in range(n, n + K) if i in wrong]
        assert r.produced_tokens == (bad[0] - n + 1 if bad else K + 1) or n + r.produced_tokens >= 30
        n += r.produced_tokens


def test_force_accept_keeps_exactly_L_tokens(tiny_artifact_path):
    K = 3
    for L in (1, 2, 4):
        prog = _spec(tiny_artifact_path, "dense", K, force_accept_len=L)
        out, rounds = run_rows(prog, [prompt(7, seed=3)], 13)
        assert all(r.produced_tokens == L for r in rounds)


def test_cancelled_row_commits_nothing_and_leaks_nothing(tiny_artifact_path):
    prog = _spec(tiny_artifact_path, "moe", 2)
    p = prompt(9, seed=4)
    s = materialize(prog, p, 20, lookahead=prog.lookahead)
    st = prog.prefill(s, len(p))
    prog.commit(st.pending, [1])
    before = prog._seq(s).frontier
    batch = prog.decode([s])
    prog.commit(batch, [0])
    assert prog._seq(s).frontier == before
    batch = prog.decode([s])
    prog.abort_pending(batch)
    prog.release(s)
    prog.check_integrity()
    assert prog._pending.num_free_scratch == prog._state.num_scratch


def test_without_mtp_weights_speculation_is_refused(tiny_artifact_path):
    from ninfer.targets.qwen3_6.program import program as prog_mod
    with pytest.raises(ValueError, match="mtp"):
        prog_mod._require_mtp(type("D", (), {"mtp_num_hidden_layers": 1})(), {"embed_tokens.weight": None})


def _plainrun_rows(prog, p, n, sampling):
    s = materialize(prog, p, n, sampling)
    st = prog.prefill(s, len(p))
    prog.commit(st.pending, [1])
    out, lps = list(st.pending.rows[0].tokens), list(st.pending.rows[0].logprobs or ())
    while len(out) < n:
        b = prog.decode([s])
        prog.commit(b, [1])
        out += b.rows[0].tokens
        lps += b.rows[0].logprobs or ()
    prog.release(s)
    return out, lps


@pytest.mark.parametrize("kind", KINDS)
def test_penalties_bias_and_logprobs_behave_as_without_speculation(tiny_artifact_path, kind):
    # NOTE: greedy with a repetition penalty, a presence penalty and a logit bias: the target's token at each
    #       position of a round is judged with the history of the drafts before it.
    ps = [prompt(8, seed=21), prompt(11, seed=22)]
    plain = tiny_program(tiny_artifact_path, kind)
    sp = SamplingParams(temperature=0.0, repetition_penalty=1.3, presence_penalty=0.5,
                        logit_bias=((ps[0][2], 4.0),), logprobs=3)
    K = 3
    prog = _spec(tiny_artifact_path, kind, K)
    for p in ps:
        ref, ref_lp = _plainrun_rows(plain, p, 16, sp)
        prog.drafter = ScriptedDrafter(K, {tuple(p): ref}, wrong=lambda i: i % 5 == 3)
        out, rounds = run_rows(prog, [p], 16, sp)
        assert out[0] == ref
        lps = [lp for r in rounds for lp in r.logprobs]
        for a, b in zip(lps, ref_lp[1:]):
            assert a.token_id == b.token_id and abs(a.logprob - b.logprob) < 1e-4
            assert [t for t, _ in a.top] == [t for t, _ in b.top]


def test_a_seeded_request_gives_the_same_text_twice(tiny_artifact_path):
    prog = _spec(tiny_artifact_path, "moe", 2)
    sp = SamplingParams(temperature=0.8, top_k=4, seed=1234)
    p = prompt(10, seed=5)
    a, _ = run_rows(prog, [p], 20, sp)
    b, _ = run_rows(prog, [p], 20, sp)
    c, _ = run_rows(prog, [p], 20, SamplingParams(temperature=0.8, top_k=4, seed=99))
    assert a == b and a != c


@pytest.mark.parametrize("kind", KINDS)
def test_mtp_drafts_equal_the_reference_mtp_layer(tiny_artifact_path, tiny_checkpoint_dir, kind):
    """After a prompt's prefill (the MTP KV of its positions written by the observe) and its first token, the
    Program's K chained MTP steps give the logits of the independent MTP oracle's chain, rel RMS < 1e-5."""
    from ninfer.targets.registry import lookup
    from ninfer.testing.mtp_reference import hf_mtp_logits, load_hf_mtp, load_state_dict, mtp_draft_chain
    from ninfer.testing.tiny_hf import KINDS as HF_KINDS
    from support.numerics import rel_rms

    K = 3
    prog = _spec(tiny_artifact_path, kind, K)
    p = prompt(12, seed=31)
    s = materialize(prog, p, 8, lookahead=K)
    for a, b in ((0, 5), (5, 9), (9, 12)):               # three stages: the observe across stage boundaries
        st = prog.prefill(s, b - a)
    prog.commit(st.pending, [1])
    ls = prog._seq(s)
    h = prog.anchors([ls.slot])
    x = torch.tensor([ls.tokens[-1]])
    tables, rows = prog.block_tables([ls]), torch.zeros(1, dtype=torch.long)
    ours = []
    for i in range(K):
        h = prog.model.mtp_step(h, x, torch.tensor([ls.frontier - 1 + i]), tables, rows)
        lg = prog.model.logits(h)
        x = lg.argmax(-1)
        ours.append(lg[0])
    prog.release(s)
    ckpt = tiny_checkpoint_dir(kind, "text")
    ids = torch.tensor(ls.tokens)
    hidden = hf_mtp_logits(load_hf_mtp(ckpt), ids).hidden
    ref = mtp_draft_chain(load_state_dict(ckpt), lookup(HF_KINDS[kind]).dims, hidden[:-1], ids, K)
    assert rel_rms(torch.stack(ours), ref.logits) < 1e-5


@pytest.mark.parametrize("frontier", [16, 23])
def test_a_checkpoint_hit_with_mtp_equals_a_miss_and_its_pages_stay_untouched(tiny_artifact_path, frontier):
    """Two continuations of one checkpoint (at a page boundary, and inside a page) with different next tokens:
    greedy output equals the plain Program's from scratch, the checkpoint's pages and slot (every layer, the
    MTP layer's included) are bit-for-bit what they were at capture, and everything is released."""
    from ninfer.contract.program import SequenceRequest
    K = 2
    prog = _spec(tiny_artifact_path, "dense", K, num_slots=6)
    plain = tiny_program(tiny_artifact_path, "dense")
    base = prompt(frontier, seed=40)
    a = prog.start_materialize(prog.plan_materialize(
        SequenceRequest(tuple(base) + (5,), 4, GREEDY, lookahead=K))).sequence
    prog.prefill(a, frontier)
    res = prog.start_capture(prog.plan_capture(a))
    ck = res.checkpoint
    prog.release(a)
    held = prog._ckpt(ck.checkpoint_id).holding
    pages = list(held.pages)
    before = (prog._kv.k[:, pages].clone(), prog._kv.v[:, pages].clone(),
              {n: prog._state.image(n, held.slot).clone() for n in prog._state.planes})
    for seed in (41, 42):
        ids = base + prompt(5, seed=seed)
        ref = list(greedy_reference(plain, ids, 20))
        plan = prog.plan_materialize(SequenceRequest(tuple(ids), 20, GREEDY, lookahead=K), ck.checkpoint_id)
        s = prog.start_materialize(plan).sequence
        assert plan.num_reused_tokens == frontier
        st = prog.prefill(s, len(ids))
        prog.commit(st.pending, [1])
        out = list(st.pending.rows[0].tokens)
        while len(out) < 20:
            b = prog.decode([s])
            c = min(b.rows[0].produced_tokens, 20 - len(out))
            out += b.rows[0].tokens[:c]
            prog.commit(b, [c])
        prog.release(s)
        assert out == ref
    assert torch.equal(prog._kv.k[:, pages], before[0]) and torch.equal(prog._kv.v[:, pages], before[1])
    for n, img in before[2].items():
        assert torch.equal(prog._state.image(n, held.slot), img)
    prog.delete_checkpoint(ck.checkpoint_id)
    prog.check_integrity()
    cap = prog.capacity()
    assert cap.pages_free == cap.pages_total


def test_the_round_graph_contract_equals_the_eager_round(tiny_artifact_path):
    """`spec_graphs.round_body` through its input layout (`EagerSpecGraphs`: run eagerly on the CPU) produces the
    eager round's tokens, with a prompt with media (the rope delta as graph data) and plain prompts."""
    from support.eager_graphs import EagerSpecGraphs
    from support.program_media import FakeEncoder, generate, media_request
    K = 2
    prog = _spec(tiny_artifact_path, "dense", K)
    prog.vision = FakeEncoder(prog.dims.hidden_size)
    eager = generate(prog, media_request(12, K=K), [18], 12)
    plain_eager, _ = run_rows(prog, [prompt(9, seed=77)], 12)
    prog.spec_graphs = EagerSpecGraphs(prog)
    assert generate(prog, media_request(12, K=K), [18], 12) == eager
    assert run_rows(prog, [prompt(9, seed=77)], 12)[0] == plain_eager
    assert prog.spec_graphs.replays > 8
