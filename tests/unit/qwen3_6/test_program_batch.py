"""Compact decode batches: a batch of B different sequences gives what each gives alone."""
from __future__ import annotations

import pytest
import torch

from support.program_util import decode_n, materialize, prefill_all, prompt, rel_rms, tiny_program

LENGTHS = (5, 17, 33, 60)


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_batch_of_four_equals_each_alone(tiny_artifact_path, kind):
    prog = tiny_program(tiny_artifact_path, kind)
    prompts = [prompt(n, seed=10 + i) for i, n in enumerate(LENGTHS)]
    steps = 10

    alone_tokens, alone_logits = [], []
    for ids in prompts:
        seq = materialize(prog, ids, max_output=steps + 1)
        first, _ = prefill_all(prog, seq, 16)
        toks, logits = [first], []
        for _ in range(steps):
            b, lg = prog.decode_with_logits([seq])
            prog.commit(b, [1])
            toks.append(b.rows[0].tokens[0])
            logits.append(lg[0, 0])
        alone_tokens.append(toks)
        alone_logits.append(torch.stack(logits))
        prog.release(seq)
        prog.check_integrity()

    seqs = [materialize(prog, ids, max_output=steps + 1) for ids in prompts]
    firsts = [prefill_all(prog, s, 16)[0] for s in seqs]
    toks = [[f] for f in firsts]
    logits = [[] for _ in seqs]
    for _ in range(steps):
        b, lg = prog.decode_with_logits(seqs)
        assert b.size == 4 and lg.shape[0] == 4            # exact B, never padded
        prog.commit(b, [1, 1, 1, 1])
        prog.check_integrity()
        for r, row in enumerate(b.rows):
            assert row.sequence == seqs[r]
            toks[r].append(row.tokens[0])
            logits[r].append(lg[r, 0])
    assert toks == alone_tokens
    for r in range(4):
        assert rel_rms(torch.stack(logits[r]), alone_logits[r]) < 1e-6

    # membership may change between rounds: a 2-row batch of rows 3 and 1, in that order
    b = prog.decode([seqs[3], seqs[1]])
    assert [row.sequence for row in b.rows] == [seqs[3], seqs[1]]
    prog.commit(b, [1, 1])
    for s in seqs:
        prog.release(s)
    prog.check_integrity()
    cap = prog.capacity()
    assert (cap.pages_free, cap.slots_free) == (cap.pages_total, cap.slots_total)


def test_batch_size_limits(tiny_artifact_path):
    from ninfer.contract.program import InvariantError

    prog = tiny_program(tiny_artifact_path, "dense", max_batch=2)
    seqs = [materialize(prog, prompt(3, seed=i), max_output=4) for i in range(3)]
    for s in seqs:
        prefill_all(prog, s)
    with pytest.raises(InvariantError, match="max_batch is 2"):
        prog.decode(seqs)
    with pytest.raises(InvariantError):
        prog.decode([])
    with pytest.raises(InvariantError, match="twice in one batch"):
        prog.decode([seqs[0], seqs[0]])
    prog.check_integrity()
    decode_n(prog, seqs[:2], 1)
