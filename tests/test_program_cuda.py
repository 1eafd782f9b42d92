"""The same Program on CUDA (fp32 parity with transformers on the CPU; bf16 close to fp32).

The weights come straight from the HF text model's state dict mapped to canonical names, so this
test needs neither the converter nor the tokenizer files on the GPU machine.
"""
from __future__ import annotations

import importlib

import pytest
import torch

from _program_util import hf_model, prompt, rel_rms
from ninfer.runtime.contract.types import SamplingParams, SequenceRequest
from ninfer.targets.qwen3_6.runtime.config import ProgramConfig
from ninfer.targets.registry import lookup
from ninfer.testing.tiny_hf import KINDS

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _program(kind: str, dtype: str):
    weights = {k.removeprefix("model."): v for k, v in hf_model(kind).state_dict().items()}
    pkg = importlib.import_module(lookup(KINDS[kind]).module)
    return pkg.create_program(weights, ProgramConfig(device="cuda", dtype=dtype, page_size=16, num_pages=64,
                                                     num_slots=4, max_model_len=512))


def _run(prog, ids, stage, n_decode, sampling=SamplingParams(temperature=0.0)):
    seq = prog.start_materialize(prog.plan_materialize(SequenceRequest(tuple(ids), n_decode + 8, sampling))).sequence
    parts = []
    while True:
        step, lg = prog.prefill_with_logits(seq, stage)
        parts.append(lg)
        if step.pending is not None:
            break
    prog.commit(step.pending, [1])
    toks = [step.pending.rows[0].tokens[0]]
    for _ in range(n_decode):
        b = prog.decode([seq])
        prog.commit(b, [1])
        toks.append(b.rows[0].tokens[0])
    prog.check_integrity()
    return seq, torch.cat(parts), toks


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_cuda_fp32_matches_transformers(kind):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ids = prompt(150, seed=1)
    with torch.no_grad():
        hf = hf_model(kind)
        ref = hf(torch.tensor([ids])).logits[0].float()
        gen = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, 150:].tolist()
    prog = _program(kind, "fp32")
    seq, logits, toks = _run(prog, ids, 64, 15)
    assert logits.device.type == "cuda"
    assert rel_rms(logits.cpu(), ref) < 1e-5
    assert toks == gen
    prog.release(seq)
    prog.check_integrity()


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_cuda_bf16_close_to_fp32_and_rolls_back(kind):
    ids = prompt(100, seed=4)
    ref_prog = _program(kind, "fp32")
    _, ref, _ = _run(ref_prog, ids, 100, 0)
    prog = _program(kind, "bf16")
    sp = SamplingParams(temperature=1.0, seed=5, top_p=0.9)
    seq, logits, _ = _run(prog, ids, 37, 2, sp)
    assert rel_rms(logits, ref) < 5e-2
    # prefix commit on CUDA in bf16: commit 1 of 3, continue, equals single steps
    b = prog.decode([seq], num_steps=3)
    prog.commit(b, [1])
    c1 = prog.decode_with_logits([seq])
    prog.commit(c1[0], [1])
    other, _, _ = _run(prog, ids, 37, 2, sp)
    d = prog.decode([other])
    prog.commit(d, [1])
    assert d.rows[0].tokens == b.rows[0].tokens[:1]
    c2 = prog.decode_with_logits([other])
    prog.commit(c2[0], [1])
    assert c2[0].rows[0].tokens == c1[0].rows[0].tokens
    assert torch.equal(c1[1], c2[1])
    prog.release(seq)
    prog.release(other)
    prog.check_integrity()
