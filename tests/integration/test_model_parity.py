"""Model parity with Hugging Face transformers: tiny dense and MoE, fp32 on CPU."""
from __future__ import annotations

import pytest
import torch

from support.program_util import decode_n, hf_model, materialize, prefill_all, prompt, rel_rms, tiny_program

KINDS = ["dense", "moe"]


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_logits_match_transformers_at_every_position(tiny_artifact_path, kind):
    ids = prompt(150, seed=1)
    with torch.no_grad():
        ref = hf_model(kind)(torch.tensor([ids])).logits[0].float()
    prog = tiny_program(tiny_artifact_path, kind)
    seq = materialize(prog, ids, max_output=8)
    _, whole = prefill_all(prog, seq)
    assert whole.shape == ref.shape
    assert rel_rms(whole, ref) < 1e-5
    # every position, not just on average
    per_pos = ((whole - ref).pow(2).mean(-1).sqrt() / ref.pow(2).mean(-1).sqrt())
    assert per_pos.max().item() < 1e-5
    prog.release(seq)
    prog.check_integrity()


@pytest.mark.parametrize("kind", KINDS)
def test_staged_prefill_gives_the_same_logits(tiny_artifact_path, kind):
    ids = prompt(150, seed=2)
    prog = tiny_program(tiny_artifact_path, kind)
    results = {}
    for stage in (150, 64, 7, 1):
        seq = materialize(prog, ids, max_output=4)
        first, logits = prefill_all(prog, seq, stage)
        results[stage] = (first, logits)
        prog.release(seq)
        prog.check_integrity()
    first0, whole = results[150]
    for stage in (64, 7, 1):
        first, logits = results[stage]
        assert first == first0
        assert rel_rms(logits, whole) < 1e-6, stage
        assert torch.equal(logits.argmax(-1), whole.argmax(-1))


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_decode_matches_transformers_generate(tiny_artifact_path, kind):
    ids = prompt(40, seed=3)
    with torch.no_grad():
        ref = hf_model(kind).generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)[0, len(ids):].tolist()
    prog = tiny_program(tiny_artifact_path, kind)
    seq = materialize(prog, ids, max_output=32)
    first, _ = prefill_all(prog, seq, 16)
    toks = [first] + decode_n(prog, [seq], 31)[0]
    assert toks == ref
    prog.release(seq)
    prog.check_integrity()
