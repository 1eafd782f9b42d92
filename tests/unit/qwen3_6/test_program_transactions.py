"""PendingBatch transactions: prefix commit, abort, exactly-once consumption, log-probs."""
from __future__ import annotations

import math

import pytest
import torch

from support.program_util import materialize, prefill_all, prompt, tiny_program
from ninfer.contract.program import BatchKind, InvariantError, SamplingParams

SAMPLED = SamplingParams(temperature=1.0, top_k=50, seed=7, repetition_penalty=1.3, frequency_penalty=0.5)


def _continue(prog, seq, n):
    """n single-step decode rounds, committing each; return (tokens, logits [n, V])."""
    toks, logits = [], []
    for _ in range(n):
        b, lg = prog.decode_with_logits([seq])
        prog.commit(b, [1])
        toks.append(b.rows[0].tokens[0])
        logits.append(lg[0, 0])
    prog.check_integrity()
    return toks, torch.stack(logits)


@pytest.mark.parametrize("kind", ["dense", "moe"])
@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0), SAMPLED], ids=["greedy", "sampled"])
def test_prefix_commit_equals_a_run_that_never_produced_the_rest(tiny_artifact_path, kind, sampling):
    ids = prompt(23, seed=5)
    prog = tiny_program(tiny_artifact_path, kind)

    # reference: two single steps, then four more
    ref = materialize(prog, ids, max_output=16, sampling=sampling)
    prefill_all(prog, ref, 8)
    ref_head, _ = _continue(prog, ref, 2)
    ref_tail, ref_logits = _continue(prog, ref, 4)
    prog.release(ref)

    # one unit of 5 steps, commit the first 2, then the same four single steps
    seq = materialize(prog, ids, max_output=16, sampling=sampling)
    prefill_all(prog, seq, 8)
    b = prog.decode([seq], num_steps=5)
    assert b.kind is BatchKind.DECODE and b.rows[0].produced_tokens == 5
    assert list(b.rows[0].tokens[:2]) == ref_head
    prog.commit(b, [2])
    prog.check_integrity()
    tail, logits = _continue(prog, seq, 4)
    assert tail == ref_tail
    assert torch.equal(logits, ref_logits)      # KV, conv, recurrent state, penalties and RNG rolled back
    prog.release(seq)
    prog.check_integrity()


def test_abort_restores_everything(tiny_artifact_path):
    ids = prompt(30, seed=6)
    prog = tiny_program(tiny_artifact_path, "dense")
    ref = materialize(prog, ids, max_output=12, sampling=SAMPLED)
    first_ref, _ = prefill_all(prog, ref, 7)
    ref_toks, ref_logits = _continue(prog, ref, 3)
    prog.release(ref)

    seq = materialize(prog, ids, max_output=12, sampling=SAMPLED)
    # abort the final prefill stage, then redo it
    step = prog.prefill(seq, 7)
    while step.pending is None:
        step = prog.prefill(seq, 7)
    assert step.num_computed_tokens == 30 and step.pending.kind is BatchKind.PREFILL
    prog.abort_pending(step.pending)
    prog.check_integrity()
    step = prog.prefill(seq, 7)
    assert step.pending is not None and step.pending.rows[0].tokens == (first_ref,)
    prog.commit(step.pending, [1])
    # abort a multi-step decode unit and a control unit, then continue
    prog.abort_pending(prog.decode([seq], num_steps=4))
    prog.abort_pending(prog.control(seq, [11, 12, 13]))
    prog.check_integrity()
    toks, logits = _continue(prog, seq, 3)
    assert toks == ref_toks and torch.equal(logits, ref_logits)
    prog.release(seq)
    prog.check_integrity()


def test_control_forces_tokens_without_advancing_the_rng(tiny_artifact_path):
    ids = prompt(12, seed=8)
    forced = [1000, 2000, 3000]
    prog = tiny_program(tiny_artifact_path, "dense")
    sp = SamplingParams(temperature=1.0, seed=3, logprobs=1)

    ref = materialize(prog, ids, max_output=16, sampling=sp)
    prefill_all(prog, ref)
    c = prog.control(ref, forced[:2])
    assert c.kind is BatchKind.CONTROL and c.rows[0].tokens == tuple(forced[:2])
    prog.commit(c, [2])
    ref_toks, ref_logits = _continue(prog, ref, 3)
    prog.release(ref)

    seq = materialize(prog, ids, max_output=16, sampling=sp)
    prefill_all(prog, seq)
    c = prog.control(seq, forced)
    lp = c.rows[0].logprobs
    assert [r.token_id for r in lp] == forced and all(r.logprob < 0 and len(r.top) == 1 for r in lp)
    prog.commit(c, [2])                            # a strict prefix of the forced suffix
    toks, logits = _continue(prog, seq, 3)
    assert toks == ref_toks and torch.equal(logits, ref_logits)
    prog.release(seq)
    prog.check_integrity()


def test_exactly_once_consumption(tiny_artifact_path):
    prog = tiny_program(tiny_artifact_path, "dense")
    seq = materialize(prog, prompt(9, seed=9), max_output=8)
    other = materialize(prog, prompt(4, seed=10), max_output=8)
    prefill_all(prog, seq)
    prefill_all(prog, other)
    b = prog.decode([seq], num_steps=2)
    with pytest.raises(InvariantError, match="unconsumed"):
        prog.release(seq)
    with pytest.raises(InvariantError, match="unconsumed"):
        prog.decode([other, seq])
    with pytest.raises(InvariantError, match="unconsumed"):
        prog.control(seq, [5])
    with pytest.raises(InvariantError, match="accepted 3 of 2"):
        prog.commit(b, [3])
    with pytest.raises(InvariantError, match="2 decisions for 1 rows"):
        prog.commit(b, [1, 1])
    prog.check_integrity()
    prog.commit(b, [2])                            # the failed commits consumed nothing
    with pytest.raises(InvariantError, match="consumed twice"):
        prog.commit(b, [2])
    with pytest.raises(InvariantError, match="consumed twice"):
        prog.abort_pending(b)
    prog.check_integrity()
    # a cancelled row accepts zero tokens
    b = prog.decode([seq, other])
    prog.commit(b, [0, 1])
    prog.check_integrity()
    # a released sequence's handle is dead
    prog.release(seq)
    with pytest.raises(InvariantError, match="unknown or released"):
        prog.decode([seq])
    with pytest.raises(InvariantError, match="unknown or released"):
        prog.release(seq)
    prog.release(other)
    prog.check_integrity()


def test_decode_is_refused_beyond_the_reservation(tiny_artifact_path):
    prog = tiny_program(tiny_artifact_path, "dense")
    seq = materialize(prog, prompt(5, seed=11), max_output=3)     # reserves 8 positions
    prefill_all(prog, seq)                                          # frontier 5
    with pytest.raises(InvariantError, match="exceed its reservation"):
        prog.decode([seq], num_steps=4)
    prog.commit(prog.decode([seq], num_steps=3), [3])               # frontier 8 == reservation
    with pytest.raises(InvariantError, match="exceed its reservation"):
        prog.decode([seq])
    prog.release(seq)
    prog.check_integrity()


def test_logprobs_are_the_raw_distribution(tiny_artifact_path):
    ids = prompt(20, seed=12)
    prog = tiny_program(tiny_artifact_path, "dense")
    sp = SamplingParams(temperature=0.7, top_k=5, seed=1, logprobs=3, repetition_penalty=1.5)
    seq = materialize(prog, ids, max_output=8, sampling=sp, prompt_logprobs=2)

    # staged prefill: prompt log-probs come one per prompt token over all stages
    prompt_lps, parts = [], []
    while True:
        step, lg = prog.prefill_with_logits(seq, 7)
        prompt_lps += step.prompt_logprobs
        parts.append(lg)
        if step.pending is not None:
            break
    logits = torch.cat(parts)
    raw = torch.log_softmax(logits, -1)
    assert len(prompt_lps) == len(ids) and prompt_lps[0] is None
    for j in range(1, len(ids)):
        rec = prompt_lps[j]
        assert rec.token_id == ids[j]
        assert math.isclose(rec.logprob, raw[j - 1, ids[j]].item(), rel_tol=1e-5, abs_tol=1e-5)
        assert [t for t, _ in rec.top] == raw[j - 1].topk(2).indices.tolist()
    first = step.pending.rows[0]
    assert first.logprobs[0].logprob == pytest.approx(raw[-1, first.tokens[0]].item(), abs=1e-5)
    prog.commit(step.pending, [1])

    b, lg = prog.decode_with_logits([seq], num_steps=3)
    raw = torch.log_softmax(lg[0], -1)
    for i, (tok, rec) in enumerate(zip(b.rows[0].tokens, b.rows[0].logprobs)):
        assert rec.token_id == tok
        assert rec.logprob == pytest.approx(raw[i, tok].item(), abs=1e-5)
        assert [t for t, _ in rec.top] == raw[i].topk(3).indices.tolist()
    prog.commit(b, [3])
    prog.release(seq)
    prog.check_integrity()
