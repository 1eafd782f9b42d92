"""lm_head padding rows (ids past the tokenizer's vocabulary) are never sampled when the Program
is told the sampleable vocabulary size, whatever their logits; without it they can win."""
from __future__ import annotations

import importlib

import pytest

from ninfer.artifact import open_artifact
from ninfer.contract.program import SamplingParams, SequenceRequest
from ninfer.targets.qwen3_6.program.config import ProgramConfig
from ninfer.targets.registry import lookup
from ninfer.testing.tiny_hf import KINDS

REAL_VOCAB = 248077  # tokenizer ids 0..248076; lm_head has 248320 rows


def _program(tiny_artifact_path, sampleable: int):
    art = open_artifact(tiny_artifact_path("dense", layout="text"))
    weights = {name: art.tensor(name) for name in art.tensor_names()}
    head = weights["lm_head.weight"].clone()
    head[:REAL_VOCAB] = 0.0          # every real token scores 0
    head[REAL_VOCAB:] *= 1000.0      # padding rows get large random logits: some are far above 0
    weights["lm_head.weight"] = head
    pkg = importlib.import_module(lookup(KINDS["dense"]).module)
    cfg = ProgramConfig(device="cpu", dtype="fp32", page_size=16, num_pages=16, num_slots=2,
                        max_model_len=64, max_batch=2, sampleable_vocab_size=sampleable)
    return pkg.create_program(weights, cfg)


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=3)])
def test_padding_ids_win_without_mask_and_never_with_it(tiny_artifact_path, sampling):
    outs = {}
    for sampleable in (0, REAL_VOCAB):
        prog = _program(tiny_artifact_path, sampleable)
        seq = prog.start_materialize(prog.plan_materialize(SequenceRequest((1, 2, 3, 4), 4, sampling))).sequence
        step = prog.prefill(seq, 64)
        prog.commit(step.pending, [1])
        tokens = list(step.pending.rows[0].tokens)
        for _ in range(3):
            batch = prog.decode([seq])
            prog.commit(batch, [1])
            tokens += batch.rows[0].tokens
        prog.release(seq)
        prog.check_integrity()
        outs[sampleable] = tokens
    assert any(t >= REAL_VOCAB for t in outs[0]), outs[0]       # the hazard is real
    assert all(t < REAL_VOCAB for t in outs[REAL_VOCAB]), outs[REAL_VOCAB]
