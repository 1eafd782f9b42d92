"""The MTP oracle (ninfer.testing.mtp_reference): the hand-written MTP layer equals Hugging Face's MtpModel
on the tiny dense and MoE checkpoints (fp32), the draft chain equals HF's chain step by step, and the
conventions it encodes (post-final-norm hidden, embedding first in the fc input) are the ones that
match: the wrong variants give clearly different logits."""
from __future__ import annotations

from typing import Any, NamedTuple

import pytest
import torch

from ninfer.targets.registry import lookup
from ninfer.testing.mtp_reference import (HfMtpModels, hf_mtp_draft_chain, hf_mtp_logits, load_hf_mtp,
                                          load_state_dict, mtp_draft_chain, mtp_logits_from_state_dict)
from ninfer.testing.mtp_reference import _check_loaded_mtp
from ninfer.testing.tiny_hf import KINDS
from support.numerics import rel_rms

pytest.importorskip("transformers")

N = 13          # prompt tokens: 12 teacher-forced MTP slots
K = 4           # draft chain length
TOL = 1e-5      # issue 48: rel RMS < 1e-5 in fp32


class Case(NamedTuple):
    kind: str
    ckpt: Any
    dims: Any
    sd: dict[str, torch.Tensor]
    models: HfMtpModels
    ids: torch.Tensor
    hidden: torch.Tensor     # [N, H] HF main hidden (post-norm)
    logits: torch.Tensor     # [N-1, V] HF MTP logits


@pytest.fixture(scope="module", params=["dense", "moe"])
def case(request, tiny_checkpoint_dir) -> Case:
    kind = request.param
    ckpt = tiny_checkpoint_dir(kind)
    dims = lookup(KINDS[kind]).dims
    models = load_hf_mtp(ckpt)
    ids = torch.randint(0, dims.vocab_size, (N,), generator=torch.Generator().manual_seed(11))
    hidden, logits = hf_mtp_logits(models, ids)
    sd = {k: v.float() for k, v in load_state_dict(ckpt).items()}    # the checkpoint's BF16 values, in fp32
    return Case(kind, ckpt, dims, sd, models, ids, hidden, logits)


def test_hand_written_mtp_equals_hf_mtp_model(case):
    assert case.hidden.shape == (N, case.dims.hidden_size)
    assert case.logits.shape == (N - 1, case.dims.vocab_size)
    out = mtp_logits_from_state_dict(case.sd, case.dims, case.hidden, case.ids)
    assert rel_rms(out.logits, case.logits) < TOL
    assert torch.equal(out.logits.argmax(-1), case.logits.argmax(-1))
    assert out.hidden.shape == (N - 1, case.dims.hidden_size)


def test_rope_positions_are_relative_vllm_offset_gives_the_same_logits(case):
    # HF gives slot i position i+1 (the default); vLLM gives it i.
    out = mtp_logits_from_state_dict(case.sd, case.dims, case.hidden, case.ids, first_position=0)
    assert rel_rms(out.logits, case.logits) < TOL


def test_canonical_names_and_fused_experts_give_the_same_logits(case):
    canon = {k.removeprefix("model.language_model."): v for k, v in case.sd.items()
             if not (k.startswith("mtp.") and ".mlp.experts." in k)}
    if case.dims.num_experts:
        E = case.dims.num_experts
        p = "mtp.layers.0.mlp.experts."
        canon[p + "gate_up_proj"] = torch.stack(
            [torch.cat([case.sd[f"{p}{e}.gate_proj.weight"], case.sd[f"{p}{e}.up_proj.weight"]]) for e in range(E)])
        canon[p + "down_proj"] = torch.stack([case.sd[f"{p}{e}.down_proj.weight"] for e in range(E)])
    assert "embed_tokens.weight" in canon
    a = mtp_logits_from_state_dict(case.sd, case.dims, case.hidden, case.ids).logits
    b = mtp_logits_from_state_dict(canon, case.dims, case.hidden, case.ids).logits
    assert torch.equal(a, b)


def test_hidden_is_the_post_final_norm_row_the_lm_head_reads(case):
    captured = {}
    hook = case.models.main.model.norm.register_forward_hook(lambda m, inp, out: captured.update(pre=inp[0][0]))
    try:
        with torch.no_grad():
            main_logits = case.models.main(input_ids=case.ids[None]).logits[0]
    finally:
        hook.remove()
    head = case.sd["lm_head.weight"]
    assert rel_rms(case.hidden @ head.T, main_logits) < 1e-6
    norm_w = next(v for k, v in case.sd.items() if k.endswith("model.language_model.norm.weight"))
    pre = captured["pre"]
    normed = pre * torch.rsqrt(pre.pow(2).mean(-1, keepdim=True) + case.dims.rms_norm_eps) * (1 + norm_w)
    assert rel_rms(case.hidden, normed) < 1e-6
    assert rel_rms(pre, case.hidden) > 0.05
    # The MTP fed the pre-norm hidden gives clearly different logits.
    wrong = mtp_logits_from_state_dict(case.sd, case.dims, pre, case.ids).logits
    assert rel_rms(wrong, case.logits) > 0.05


def test_hidden_first_fc_order_gives_clearly_different_logits(case):
    wrong = mtp_logits_from_state_dict(case.sd, case.dims, case.hidden, case.ids, hidden_first=True).logits
    assert rel_rms(wrong, case.logits) > 0.05


def test_draft_chain_starts_at_the_teacher_forced_argmax_and_equals_hf_chain(case):
    chain = mtp_draft_chain(case.sd, case.dims, case.hidden[:-1], case.ids, K)
    assert chain.tokens.shape == (K,) and chain.logits.shape == (K, case.dims.vocab_size)
    assert int(chain.tokens[0]) == int(case.logits[-1].argmax())
    assert rel_rms(chain.logits[0], case.logits[-1]) < TOL
    assert torch.equal(chain.tokens, chain.logits.argmax(-1))
    hf = hf_mtp_draft_chain(case.models, case.ids, K)
    assert torch.equal(chain.tokens, hf.tokens)
    assert rel_rms(chain.logits, hf.logits) < TOL
    # Later drafts depend on the chained hidden: feeding the main hidden again would differ.
    assert rel_rms(chain.logits[1], chain.logits[0]) > 0.05


def test_hf_mtp_with_fused_mtp_experts_loads_the_same_layer(case):
    # The tiny MoE checkpoint stores its MTP experts per expert (as the 35B-A3B does); the fused view
    # is the other accepted layout. A dense MTP has no experts: the view holds the same tensors.
    fused = load_hf_mtp(case.ckpt, fuse_mtp_experts=True)
    assert torch.equal(hf_mtp_logits(fused, case.ids).logits, case.logits)


def test_loaded_mtp_weights_are_checked_against_the_checkpoint(case):
    p = case.models.mtp.layers[0].eh_proj.weight
    saved = p.detach().clone()
    with torch.no_grad():
        p[0, 0] += 1.0
    try:
        with pytest.raises(RuntimeError, match="eh_proj"):
            _check_loaded_mtp(case.models.mtp, case.sd)
    finally:
        with torch.no_grad():
            p.copy_(saved)
    _check_loaded_mtp(case.models.mtp, case.sd)


def test_bad_inputs_are_refused_with_a_clear_error(case):
    sd, dims, h, ids = case.sd, case.dims, case.hidden, case.ids
    with pytest.raises(ValueError, match="input_ids must have"):
        mtp_logits_from_state_dict(sd, dims, h, ids[:-1])
    with pytest.raises(ValueError, match="hidden must be"):
        mtp_logits_from_state_dict(sd, dims, h[:, :-1], ids)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        mtp_logits_from_state_dict(sd, dims, h[:1], ids[:1])
    with pytest.raises(ValueError, match="num_draft_tokens"):
        mtp_draft_chain(sd, dims, h[:-1], ids, 0)
    with pytest.raises(KeyError, match="mtp.layers.0"):
        mtp_logits_from_state_dict({k: v for k, v in sd.items() if not k.startswith("mtp.")}, dims, h, ids)
    other = lookup(KINDS["moe" if case.kind == "dense" else "dense"]).dims
    with pytest.raises(ValueError, match="num_experts"):
        mtp_logits_from_state_dict(sd, other, h, ids)
