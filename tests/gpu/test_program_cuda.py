"""The same Program on CUDA (fp32 parity with transformers on the CPU; bf16 close to fp32).

The weights come straight from the HF text model's state dict mapped to canonical names, so this
test needs neither the converter nor the tokenizer files on the GPU machine.
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import sys

import pytest
import torch

from support.program_util import hf_model, prompt
from support.numerics import rel_rms
from ninfer.contract.program import SamplingParams, SequenceRequest
from ninfer.targets.qwen3_6.program.config import ProgramConfig
from ninfer.targets.registry import lookup
from ninfer.testing.tiny_hf import KINDS

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


# Module-level names through which transformers' (5.17 .. 5.24) Qwen3.5 GatedDeltaNet forward calls its
# kernels. `use_kernel_func_from_hub_with_fallback` binds each, at import, to fla-core /
# causal-conv1d when importable and to the pure-torch function otherwise; the torch function stays
# reachable as the wrapper's `__wrapped__`.
_GDN_FUNCS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
              "causal_conv1d_fn", "causal_conv1d_update")
_KERNEL_PACKAGES = ("fla", "causal_conv1d", "kernels")


@contextlib.contextmanager
def torch_gated_delta_net(model):
    """Run the GatedDeltaNet layers of the HF `model` through transformers' own pure-torch functions
    for the duration of the block, whether or not fla-core / causal-conv1d are importable (their
    Triton kernels cannot take the CPU tensors of the reference). Fails loudly if this transformers
    version binds the kernels in a way this does not recognise, rather than silently run fla."""
    import transformers

    layers = [m for m in model.modules() if type(m).__name__.endswith("GatedDeltaNet")]
    if not layers:
        raise RuntimeError(f"transformers {transformers.__version__}: no GatedDeltaNet layer in {type(model).__name__}")
    saved = []
    try:
        for mod in {sys.modules[type(m).__module__] for m in layers}:
            for name in _GDN_FUNCS:
                bound = getattr(mod, name, None)
                pure = inspect.unwrap(bound) if callable(bound) else None
                if pure is None or getattr(pure, "__module__", None) != mod.__name__:
                    raise RuntimeError(f"transformers {transformers.__version__}: cannot find the pure-torch "
                                       f"{mod.__name__}.{name} (found {bound!r}); update torch_gated_delta_net")
                saved.append((mod, name, bound))
                setattr(mod, name, pure)
        for layer in layers:
            # NOTE: transformers 4.x bound the kernels per layer (`self.chunk_gated_delta_rule = ...`).
            for attr, value in vars(layer).items():
                owner = (getattr(value, "__module__", None) or "").split(".")[0]
                if callable(value) and owner in _KERNEL_PACKAGES:
                    raise RuntimeError(f"{type(layer).__name__}.{attr} is bound to {owner}: the reference "
                                       "would not run the pure-torch GatedDeltaNet")
        yield model
    finally:
        for mod, name, bound in reversed(saved):
            setattr(mod, name, bound)


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
    with torch.no_grad(), torch_gated_delta_net(hf_model(kind)) as hf:
        ref = hf(torch.tensor([ids])).logits[0].float()
        gen = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, 150:].tolist()
    # NOTE: the reference op set on CUDA is the exact check of the Program's math (1e-5); the fast set
    #       (its default on CUDA) runs fla-core's chunk kernels, whose fp32 tl.dot products use TF32
    #       tensor cores (10-bit mantissa): measured 2.2e-4 / 3.2e-4 rel RMS on the H200, bound 2e-3.
    from ninfer.ops.opset import reference_ops
    for ops, bound in ((reference_ops(), 1e-5), (None, 2e-3)):
        prog = _program(kind, "fp32")
        if ops is not None:
            prog.model.ops = ops
            prog.graphs_enabled = False
        seq, logits, toks = _run(prog, ids, 64, 15)
        assert logits.device.type == "cuda"
        assert rel_rms(logits.cpu(), ref) < bound, prog.model.ops.name
        assert toks == gen, prog.model.ops.name
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
