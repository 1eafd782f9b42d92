"""The gate|up GEMM with the SwiGLU in its epilogue (ninfer/ops/fast/gemm.py) vs the two launches it
replaces (F.linear, then silu_mul_halves) and vs fp32 math.

Run on the GPU machine (`pytest -m gpu`); skipped without CUDA. With TRITON_INTERPRET=1 and
NINFER_FAST_TEST_DEVICE=cpu the kernel runs through Triton's CPU interpreter, in fp16 (its TMA
descriptors read bf16 wrongly) and on small tiles.

Checks: odd row counts 1/63/64/65/500, I not a multiple of the tile, K not a multiple of BK, a strided
x (a column slice of a wider tensor), the output fully written over NaN-poisoned memory, CUDA-graph
replay, and the layouts `supported` refuses.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from _fast_env import DEV, GPU_MARKS, INTERPRET, gen, poison_allocator, randn, rel_rms

pytestmark = GPU_MARKS

DT = torch.float16 if INTERPRET else torch.bfloat16


def _configs():
    from ninfer.ops.fast.gemm import GATE_UP_CONFIG, GemmConfig
    if INTERPRET:
        return [GemmConfig(32, 16, 32, 2, 4, 2)]
    return [GATE_UP_CONFIG, GemmConfig(128, 64, 64, 8, 4, 4), GemmConfig(64, 128, 64, 4, 4, 3)]


def _two_launch(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The unfused form: the product rounded to x's dtype, then the SwiGLU as the fast kernel rounds it."""
    from ninfer.ops.mlp import silu_mul
    gu = F.linear(x.float(), w.float()).to(x.dtype)
    I = w.shape[0] // 2
    act = F.silu(gu[:, :I].float()).to(x.dtype).float()
    return (act * gu[:, I:].float()).to(x.dtype) if INTERPRET else silu_mul(gu[:, :I], gu[:, I:])


SIZES = [(1, 64, 48), (63, 200, 40), (64, 96, 64), (65, 136, 24), (500, 72, 200)] if not INTERPRET else \
    [(1, 64, 16), (63, 40, 24), (65, 72, 40)]


@pytest.mark.parametrize("M,K,I", SIZES)
def test_gate_up_swiglu_matches_the_two_launches(M, K, I):
    from ninfer.ops.fast.gemm import gate_up_swiglu
    g = gen(M * 1000 + K + I)
    x = randn(M, K, dtype=DT, g=g)
    w = randn(2 * I, K, dtype=DT, g=g, scale=K ** -0.5)
    ref = _two_launch(x, w)
    exact = F.silu(F.linear(x.float(), w[:I].float())) * F.linear(x.float(), w[I:].float())
    for c in _configs():
        poison_allocator()
        y = gate_up_swiglu(x, w, c)
        assert y.shape == (M, I) and y.dtype == DT
        assert rel_rms(y, ref.float()) < 5e-3, c
        assert rel_rms(y, exact) < 1e-2, c
        # the products' summation order is the only difference: nearly every output is bitwise equal
        assert (y == ref).float().mean().item() > 0.9, c


def test_gate_up_swiglu_strided_rows_and_zero_rows():
    from ninfer.ops.fast.gemm import gate_up_swiglu, supported
    g = gen(7)
    wide = randn(70, 160, dtype=DT, g=g)
    x = wide[:, 16:144]                                   # row stride 160, unit column stride
    w = randn(2 * 40, 128, dtype=DT, g=g, scale=128 ** -0.5)
    if DEV == "cuda":
        assert supported(x, w)
    c = _configs()[0]
    y = gate_up_swiglu(x, w, c)
    assert rel_rms(y, _two_launch(x.contiguous(), w).float()) < 5e-3
    assert gate_up_swiglu(x[:0], w, c).shape == (0, 40)


@pytest.mark.skipif(DEV != "cuda", reason="layout checks and graphs need CUDA")
def test_supported_refuses_what_the_kernel_cannot_take():
    from ninfer.ops.fast.gemm import supported
    x = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16)
    assert supported(x, w)
    assert not supported(x.float(), w.float())                       # fp32
    assert not supported(x.cpu(), w.cpu())                           # not CUDA
    assert not supported(x, w.half())                                # mixed dtypes
    assert not supported(x[:, 1:], w[:, 1:])                         # rows not 16-byte aligned
    assert not supported(x, w[:24])                                  # 2I not a multiple of 16
    assert not supported(x.t(), w)                                   # non-unit last stride


@pytest.mark.skipif(DEV != "cuda", reason="graphs need CUDA")
def test_gate_up_swiglu_in_a_cuda_graph():
    from ninfer.ops.fast.gemm import gate_up_swiglu
    g = gen(11)
    x = randn(300, 256, dtype=DT, g=g)
    w = randn(2 * 192, 256, dtype=DT, g=g, scale=1 / 16)
    want = gate_up_swiglu(x, w)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gate_up_swiglu(x, w)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gate_up_swiglu(x, w)
    x.copy_(randn(300, 256, dtype=DT, g=g))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, gate_up_swiglu(x, w))
    assert not torch.equal(out, want)
