"""Decode GEMV kernel (ninfer/ops/triton/gemv.py) vs F.linear in fp32 math.

Run on the GPU machine (`pytest -m gpu`); skipped without CUDA. With TRITON_INTERPRET=1 and
NINFER_FAST_TEST_DEVICE=cpu the kernel runs through Triton's CPU interpreter (bf16 tl.dot is wrong
there, so the tensor-core configs are checked with fp32 inputs in that mode).

Checks: every config of the bench's sweep space (plus extra splits) at small odd sizes, M = 1..8,
strided x (row stride not a multiple of 16, a sliced view), N smaller than a tile, split-K
deterministic with its arrival counters back at zero, the dispatch of `linear` (cuBLAS unless the
decision table says otherwise), outputs from NaN-poisoned memory, CUDA-graph replay.
The bench script's argument parsing and --dry-run run on the CPU too (no mark).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from support.fast_env import DEV as _DEV, GPU_MARKS, INTERPRET as _INTERPRET, STRICT  # noqa: F401
from support.numerics import rel_rms

_NEEDS_KERNEL = pytest.mark.skipif(not (torch.cuda.is_available() or _INTERPRET), reason="needs CUDA")

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}
ROWS = list(range(1, 9)) if not _INTERPRET else [1, 2, 3, 8]
# odd N / K, even K with split-K, N below one tile (smaller in the interpreter, which is slow)
SHAPES = [(1000, 333), (200, 1024), (5, 64)] if not _INTERPRET else [(300, 333), (100, 1024), (5, 64)]



class _Everything(frozenset):
    """A set of shapes that holds every shape (a tuning table's `swiglu` marking all)."""

    def __contains__(self, key):
        return True


def with_tables(monkeypatch, *, triton=None, swiglu=None):
    """Replace this process's GEMV tuning tables: the loaded ones with `triton` / `swiglu` (shape sets of
    (N, K, M bucket)) where given."""
    from ninfer.ops.triton import gemv_configs
    t = gemv_configs.load_tables()
    t = t._replace(triton=frozenset(triton) if triton is not None else t.triton,
                   swiglu=swiglu if isinstance(swiglu, frozenset) else frozenset(swiglu) if swiglu is not None
                   else t.swiglu)
    monkeypatch.setattr(gemv_configs, "tables", lambda: t)


def poison_allocator() -> None:
    if _DEV == "cuda":
        torch.full((64 << 20,), float("nan"), dtype=torch.float32, device="cuda")


def randn(*shape, dtype, seed):
    g = torch.Generator(device=_DEV)
    g.manual_seed(seed)
    return torch.randn(*shape, generator=g, device=_DEV, dtype=torch.float32).to(dtype)


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x.float(), w.float())


def dtype_for(cfg) -> torch.dtype:
    return torch.float32 if (_INTERPRET and cfg.dot) else torch.bfloat16


def prologue_dtype(cfg) -> torch.dtype:
    """fp32 in the interpreter for the fused x-load modes: its bf16 casts are not the GPU's
    round-to-nearest, which alone puts a bf16 SwiGLU product at ~1e-2 there (torch's bf16 linear of the
    same x: 1.6e-3), on the edge of the bound; the GPU checks bf16."""
    return torch.float32 if _INTERPRET else dtype_for(cfg)


def configs(n: int, k: int, m: int):
    from ninfer.ops.triton import gemv
    return gemv.sweep_space(n, k, m, num_sms=4, full=True)


@pytest.mark.gpu
@_NEEDS_KERNEL
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("m", ROWS)
def test_every_config(n, k, m):
    from ninfer.ops.triton import gemv
    cfgs = configs(n, k, m)
    assert any(c.split_k > 1 for c in cfgs) and any(c.dot for c in cfgs) and any(not c.dot for c in cfgs)
    for i, cfg in enumerate(cfgs):
        dt = dtype_for(cfg)
        x = randn(m, k, dtype=dt, seed=i)
        w = randn(n, k, dtype=dt, seed=100 + i)
        poison_allocator()
        y = gemv.gemv(x, w, cfg)
        assert y.shape == (m, n) and y.dtype == dt
        err = rel_rms(y, reference(x, w))
        assert err < TOL[dt], f"{cfg} M={m}: rel RMS {err:.3g}"


@pytest.mark.gpu
@_NEEDS_KERNEL
@pytest.mark.parametrize("m", [1, 3, 8])
def test_strided_x(m):
    from ninfer.ops.triton import gemv
    n, k = 300, 333
    for cfg in (gemv.GemvConfig(16, 128, 1, 4, 1), gemv.GemvConfig(32, 64, 3, 4, 2, True)):
        dt = dtype_for(cfg)
        big = randn(2 * m, k + 7, dtype=dt, seed=m)
        x = big[::2, 5:5 + k]                                   # row stride 2 (k + 7), column offset 5
        assert x.stride() == (2 * (k + 7), 1)
        w = randn(n, k, dtype=dt, seed=7)
        y = gemv.gemv(x, w, cfg)
        assert rel_rms(y, reference(x, w)) < TOL[dt]


@pytest.mark.gpu
@_NEEDS_KERNEL
def test_split_k_deterministic_counters_reset():
    from ninfer.ops.triton import gemv
    n, k, m = 200, 1024, 4
    cfg = gemv.GemvConfig(16, 64, 4, 4, 1)
    x = randn(m, k, dtype=torch.bfloat16, seed=1)
    w = randn(n, k, dtype=torch.bfloat16, seed=2)
    y1 = gemv.gemv(x, w, cfg)
    y2 = gemv.gemv(x, w, cfg)
    assert torch.equal(y1, y2)
    assert int(gemv._COUNTERS[x.device].abs().sum()) == 0
    # a different split of the same product agrees to rounding
    y3 = gemv.gemv(x, w, cfg._replace(split_k=3))
    assert rel_rms(y3, y1) < 1e-2


@pytest.mark.gpu
@_NEEDS_KERNEL
def test_bad_inputs_rejected():
    from ninfer.ops.triton import gemv
    w = randn(16, 64, dtype=torch.bfloat16, seed=0)
    with pytest.raises(ValueError):
        gemv.gemv(randn(9, 64, dtype=torch.bfloat16, seed=0), w)       # too many rows
    with pytest.raises(ValueError):
        gemv.gemv(randn(64, 2, dtype=torch.bfloat16, seed=0).t(), w)    # non-unit last stride


@pytest.mark.gpu
@_NEEDS_KERNEL
def test_default_configs_cover_decode_shapes():
    from ninfer.ops.triton import gemv
    for n, k in [(16480, 5120), (5120, 17408), (248320, 5120), (2048, 512), (1288, 2048)]:
        for m in (1, 2, 4, 8):
            c = gemv.default_config(n, k, m)
            assert c.split_k >= 1 and c.block_k <= max(16, k)
            assert c in gemv.sweep_space(n, k, m) or c._replace(split_k=1) in gemv.sweep_space(n, k, m)
    assert gemv.default_config(5120, 17408, 1).split_k > 1                # few N tiles, long K
    assert gemv.default_config(248320, 5120, 1).split_k == 1
    assert [gemv.m_bucket(m) for m in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]


@pytest.mark.gpu
@_NEEDS_KERNEL
def test_linear_dispatch(monkeypatch):
    from ninfer.ops.triton import gemv
    x = randn(3, 256, dtype=torch.bfloat16, seed=0)
    w = randn(96, 256, dtype=torch.bfloat16, seed=1)
    with_tables(monkeypatch, triton=())
    assert torch.equal(gemv.linear(x, w), F.linear(x, w))               # empty table: cuBLAS
    if _DEV != "cuda":
        return                                                          # the kernel path needs CUDA tensors
    calls = []
    real = gemv.gemv
    monkeypatch.setattr(gemv, "gemv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    with_tables(monkeypatch, triton={(96, 256, 4)})
    y = gemv.linear(x, w)
    assert calls and rel_rms(y, reference(x, w)) < 1e-2
    x3 = randn(1, 3, 256, dtype=torch.bfloat16, seed=2)                 # leading dims flattened
    assert gemv.linear(x3, w).shape == (1, 3, 96)
    calls.clear()
    assert torch.equal(gemv.linear(randn(9, 256, dtype=torch.bfloat16, seed=3), w),
                       F.linear(randn(9, 256, dtype=torch.bfloat16, seed=3), w)) and not calls


@pytest.mark.gpu
@_NEEDS_KERNEL
@pytest.mark.skipif(_DEV != "cuda", reason="CUDA graphs need CUDA")
def test_cuda_graph_replay():
    from ninfer.ops.triton import gemv
    n, k, m = 512, 2048, 2
    cfg = gemv.GemvConfig(16, 128, 4, 4, 2)
    x = randn(m, k, dtype=torch.bfloat16, seed=0)
    w = randn(n, k, dtype=torch.bfloat16, seed=1)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        gemv.gemv(x, w, cfg)                                            # warm-up: compile, counters
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = gemv.gemv(x, w, cfg)
    for seed in (5, 6):
        x.copy_(randn(m, k, dtype=torch.bfloat16, seed=seed))
        g.replay()
        torch.cuda.synchronize()
        assert rel_rms(y, reference(x, w)) < 1e-2


def test_bench_dry_run():
    """bench/gemv.py parses its arguments and lists the decode shapes without a GPU (and without Triton)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, str(root / "bench" / "gemv.py"), "--dry-run", "--m", "1,8"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    for shape in ("16480 x 5120", "5120 x 17408", "248320 x 5120", "1288 x 2048", "2048 x 512"):
        assert shape in r.stdout
    assert "27b: dense weight GEMMs of one decode step read 51.24 GB" in r.stdout
    r = subprocess.run([sys.executable, str(root / "bench" / "gemv.py"), "--m", "9"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 2 and "1..8" in r.stderr


@pytest.mark.gpu
@_NEEDS_KERNEL
@pytest.mark.parametrize("m", [1, 2, 5, 8])
def test_swiglu_prologue(m):
    """gemv(swiglu=True) on [gate | up] rows == silu_mul_halves then the product (the reference's
    roundings: silu to the dtype, then the product), for FMA, tensor-core and split-K configs; a
    strided gate|up view (the fused gate_up GEMM's output row) is read in place."""
    from ninfer.ops.triton import gemv
    from ninfer.ops.reference.fused import silu_mul_halves
    n, k = (300, 333) if _INTERPRET else (1000, 1088)
    for i, cfg in enumerate((gemv.GemvConfig(16, 128, 1, 4, 1), gemv.GemvConfig(32, 64, 3, 4, 2, True),
                             gemv.GemvConfig(8, 256, 2, 4, 1), gemv.GemvConfig(8, 128, 2, 4, 1, prefetch=True),
                             gemv.GemvConfig(8, 64, 3, 4, 1, prefetch=True))):
        dt = prologue_dtype(cfg)
        big = randn(m, 2 * k + 9, dtype=dt, seed=i + 10 * m)
        gu = big[:, 3:3 + 2 * k]                                        # unit last stride, row stride 2k+9
        w = randn(n, k, dtype=dt, seed=200 + i)
        poison_allocator()
        y = gemv.gemv(gu, w, cfg, swiglu=True)
        assert y.shape == (m, n) and y.dtype == dt
        err = rel_rms(y, reference(silu_mul_halves(gu.contiguous()), w))
        assert err < TOL[dt], f"{cfg} M={m}: rel RMS {err:.3g}"
        # with the residual epilogue too (the dense MLP's down projection at one decode row): the same
        # product as above, then the add rounded like the schedule's (r + y in the dtype)
        r = randn(m, n, dtype=dt, seed=500 + i)
        h, parts = gemv.gemv(gu, w, cfg, swiglu=True, residual=r)
        assert h.shape == (m, n) and parts.shape == (m, -(-n // cfg.block_n))
        torch.testing.assert_close(h, r + y, msg=f"{cfg} M={m} swiglu + residual")
        hp = torch.zeros(m, parts.shape[1] * cfg.block_n, device=h.device)
        hp[:, :n] = h.float()
        torch.testing.assert_close(parts, (hp * hp).view(m, -1, cfg.block_n).sum(2), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="odd width"):
        gemv.gemv(randn(1, 7, dtype=torch.float32, seed=0), randn(4, 3, dtype=torch.float32, seed=1), swiglu=True)


@pytest.mark.gpu
@pytest.mark.skipif(_DEV != "cuda" or not torch.cuda.is_available(),
                    reason="both paths of linear_swiglu need CUDA tensors")
def test_linear_swiglu_dispatch(monkeypatch):
    """`linear_swiglu` folds the SwiGLU into the GEMV only for shapes the table's `swiglu` marks; else
    it is the SwiGLU kernel followed by `linear` (the same result within rounding)."""
    from ninfer.ops.triton import gemv
    from ninfer.ops.reference.fused import silu_mul_halves
    gu = randn(2, 512, dtype=torch.bfloat16, seed=0)
    w = randn(96, 256, dtype=torch.bfloat16, seed=1)
    calls = []
    real = gemv.gemv
    monkeypatch.setattr(gemv, "gemv", lambda *a, **kw: calls.append(kw.get("swiglu")) or real(*a, **kw))
    with_tables(monkeypatch, triton=(), swiglu=())
    ref = reference(silu_mul_halves(gu), w)
    assert rel_rms(gemv.linear_swiglu(gu, w), ref) < 1e-2 and not calls
    with_tables(monkeypatch, triton=(), swiglu={(96, 256, 2)})
    assert rel_rms(gemv.linear_swiglu(gu, w), ref) < 1e-2 and calls == [True]


@pytest.mark.gpu
@_NEEDS_KERNEL
@pytest.mark.parametrize("m", [1, 3, 8])
def test_residual_epilogue(m):
    """gemv(residual=r) == r + (x @ w.T rounded to the dtype), rounded (the schedule's residual add),
    and its parts are the per-column-tile sums of h^2 (fp32), for FMA, tensor-core and split-K configs;
    outputs from NaN-poisoned memory; N not a multiple of the tile."""
    from ninfer.ops.triton import gemv
    n, k = (300, 333) if _INTERPRET else (1000, 1088)
    for i, cfg in enumerate((gemv.GemvConfig(16, 128, 1, 4, 1), gemv.GemvConfig(32, 64, 3, 4, 2, True),
                             gemv.GemvConfig(8, 256, 2, 4, 1), gemv.GemvConfig(8, 128, 2, 4, 1, prefetch=True),
                             gemv.GemvConfig(8, 64, 3, 4, 1, prefetch=True))):
        dt = dtype_for(cfg)
        x = randn(m, k, dtype=dt, seed=i + 10 * m)
        w = randn(n, k, dtype=dt, seed=300 + i)
        r = randn(m, n, dtype=dt, seed=400 + i)
        poison_allocator()
        h, parts = gemv.gemv(x, w, cfg, residual=r)
        want = r + reference(x, w).to(dt)
        assert h.shape == (m, n) and h.dtype == dt and parts.shape == (m, -(-n // cfg.block_n))
        assert rel_rms(h, want) < TOL[dt], f"{cfg} M={m}"
        hp = torch.zeros(m, parts.shape[1] * cfg.block_n, device=h.device)
        hp[:, :n] = h.float()
        torch.testing.assert_close(parts, (hp * hp).view(m, -1, cfg.block_n).sum(2), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="residual"):
        gemv.gemv(x, w, residual=r[:, :-1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or _INTERPRET, reason="cuBLAS: needs CUDA")
@pytest.mark.parametrize("m", [9, 300])
def test_prefill_residual_in_the_gemm(m):
    """Past MAX_ROWS rows `linear(y, w, residual=r)` adds the residual in the cuBLAS GEMM, in place on r:
    Residual(h, None) with h r's own storage, == r + y @ w.T (one rounding); a NormedRows of it feeds the
    next `linear` (the norm applied first). With a residual it cannot update in place (not contiguous),
    the plain product comes back and r is untouched."""
    from ninfer.ops.triton import gemv
    from ninfer.ops.reference.fused import NormedRows, Residual
    from ninfer.ops.reference.norms import rms_norm
    dt, n, k = torch.bfloat16, 1000, 1088
    y = randn(m, k, dtype=dt, seed=m)
    w = randn(n, k, dtype=dt, seed=500)
    r0 = randn(m, n, dtype=dt, seed=600)
    want = r0.float() + reference(y, w)
    r = r0.clone()
    out = gemv.linear(y, w, residual=r)
    assert isinstance(out, Residual) and out.parts is None and out.h.data_ptr() == r.data_ptr()
    assert out.h.shape == (m, n) and rel_rms(out.h, want) < TOL[dt]
    w2 = randn(64, n, dtype=dt, seed=700)
    nw = randn(n, dtype=dt, seed=800) * 0.1
    nxt = gemv.linear(NormedRows(out.h, nw, 1e-6), w2)
    assert rel_rms(nxt, reference(rms_norm(out.h, nw, 1e-6), w2)) < TOL[dt]
    rt = r0.t().contiguous().t()                                     # same values, column-major
    plain = gemv.linear(y, w, residual=rt)
    assert not isinstance(plain, Residual) and torch.equal(rt, r0) and rel_rms(plain, reference(y, w)) < TOL[dt]


@pytest.mark.gpu
@_NEEDS_KERNEL
def test_norm_prologue_chains_a_residual_launch():
    """The decode chain the schedule runs at one row: h, parts = gemv(y, w1, residual=r), then
    gemv(h, w2, norm=RowNorm(parts, nw, eps)) == add_rms_norm(r, y @ w1.T) then @ w2.T (the same
    roundings; the norm's sum of squares in another order), for producer/consumer configs of both
    kinds; bad norm arguments are refused."""
    from ninfer.ops.triton import gemv
    from ninfer.ops.reference.fused import add_rms_norm
    h_dim, k1, n2 = (192, 96, 130) if _INTERPRET else (640, 1088, 1000)
    for i, (c1, c2) in enumerate([(gemv.GemvConfig(8, 64, 1, 4, 1), gemv.GemvConfig(16, 64, 1, 4, 1)),
                                  (gemv.GemvConfig(16, 32, 2, 4, 1), gemv.GemvConfig(32, 64, 2, 4, 2, True)),
                                  (gemv.GemvConfig(32, 64, 1, 4, 2, True), gemv.GemvConfig(8, 128, 3, 4, 1)),
                                  (gemv.GemvConfig(8, 32, 2, 4, 1, prefetch=True),
                                   gemv.GemvConfig(16, 32, 1, 4, 1, prefetch=True)),
                                  (gemv.GemvConfig(8, 32, 1, 4, 1, prefetch=True),
                                   gemv.GemvConfig(16, 64, 2, 4, 1, prefetch=True))]):
        dt = torch.float32 if (_INTERPRET and (c1.dot or c2.dot)) else torch.bfloat16
        y = randn(1, k1, dtype=dt, seed=50 + i)
        w1 = randn(h_dim, k1, dtype=dt, seed=60 + i) * 0.1
        r = randn(1, h_dim, dtype=dt, seed=70 + i)
        nw = randn(h_dim, dtype=dt, seed=80 + i) * 0.1
        w2 = randn(n2, h_dim, dtype=dt, seed=90 + i)
        poison_allocator()
        h, parts = gemv.gemv(y, w1, c1, residual=r)
        out = gemv.gemv(h, w2, c2, norm=gemv.RowNorm(parts, nw, 1e-6))
        xn, h_ref = add_rms_norm(r, F.linear(y, w1), nw, 1e-6)
        assert rel_rms(h, h_ref) < TOL[dt]
        err = rel_rms(out, reference(xn, w2))
        assert err < TOL[dt], f"{c1} -> {c2}: rel RMS {err:.3g}"
    with pytest.raises(ValueError, match="norm"):
        gemv.gemv(torch.cat([h, h]), w2, norm=gemv.RowNorm(parts, nw, 1e-6))
    with pytest.raises(ValueError, match="norm"):
        gemv.gemv(h, w2, norm=gemv.RowNorm(parts, nw[:-1], 1e-6))


@pytest.mark.gpu
@_NEEDS_KERNEL
@pytest.mark.parametrize("identity", ["qwen3_6-tiny-dense", "qwen3_6-tiny-moe"])
def test_program_decode_folds_residual_norm(identity, monkeypatch):
    """A one-row decode with every projection on the GEMV folds the residual adds + norms into the
    GEMVs (no add_rms_norm launch between two projections of a dense layer) and gives the logits of
    the unfolded schedule (same roundings; only the norms' sums of squares run in another order)."""
    import importlib

    from ninfer.ops.opset import fast_ops
    from ninfer.ops.triton import fused as fast_fused, gemv
    from ninfer.contract.program import SamplingParams, SequenceRequest
    from ninfer.targets.dummy_weights import DummyWeights
    from ninfer.targets.qwen3_6.program.config import ProgramConfig

    dt = torch.float32 if _INTERPRET else torch.bfloat16
    monkeypatch.setattr(gemv, "use_triton", lambda n, k, m: True)
    if _INTERPRET:   # the interpreter runs on CPU tensors; fp32 there (bf16 tl.dot is wrong in it)
        monkeypatch.setattr(gemv, "_eligible", lambda x, w: x.dtype == w.dtype and x.stride(-1) == 1
                            and w.dim() == 2 and x.shape[-1] == w.shape[1])
    w = DummyWeights(identity, device=_DEV, dtype=dt, seed=5, std=0.1)
    pkg = importlib.import_module(w.package.module)
    norms, silus = [], []
    real_norm = fast_fused.add_rms_norm
    real_silu = gemv._fast_silu_mul_halves
    monkeypatch.setattr(gemv, "_fast_silu_mul_halves", lambda gu: silus.append(1) or real_silu(gu))
    out = {}
    for name in ("fold", "swiglu", "nofold"):
        if name == "swiglu":
            with_tables(monkeypatch, swiglu=_Everything())
        if name == "nofold":
            with_tables(monkeypatch, swiglu=())
            monkeypatch.setattr(gemv, "_fold", lambda residual, x2, w: None)
        prog = pkg.create_program(w, ProgramConfig(device=_DEV, dtype="fp32" if dt == torch.float32 else "bf16",
                                                   page_size=16, num_pages=64, enforce_eager=True))
        prog.model.ops = fast_ops()._replace(add_rms_norm=lambda *a: norms.append(1) or real_norm(*a))
        prompt = tuple(int(t) for t in torch.randint(0, w.dims.vocab_size, (21,),
                                                     generator=torch.Generator().manual_seed(2)))
        h = prog.start_materialize(prog.plan_materialize(SequenceRequest(
            prompt_token_ids=prompt, sampling=SamplingParams(temperature=0.0), max_output_tokens=8))).sequence
        step, _ = prog.prefill_with_logits(h, 100)
        prog.commit(step.pending, [1])
        logits = []
        norms.clear()
        silus.clear()
        for _ in range(3):
            batch, dl = prog.decode_with_logits([h], 1)
            prog.commit(batch, [1])
            logits.append(dl[:, 0].float())
        out[name] = (torch.cat(logits), len(norms), len(silus))
        prog.release(h)
    layers = w.dims.num_hidden_layers
    dense = not w.dims.is_moe
    # unfolded: 2 norms per layer + the final one per step; folded: the first layer's input norm and
    # the final norm, plus (MoE) every post-mixer norm (the MoE leaf takes a tensor) and each norm after it
    assert out["nofold"][1] == 3 * (2 * layers + 1)
    assert out["fold"][1] == out["swiglu"][1] == 3 * (2 if dense else 2 + 2 * layers - 1)
    assert rel_rms(out["fold"][0], out["nofold"][0]) < (1e-5 if dt == torch.float32 else 2e-2)
    # the SwiGLU folded into the down projection's x load (bf16/fp16 only: the interpreter's fp32 run
    # keeps the separate kernel): no SwiGLU launch in a dense decode step, same logits
    if dense and dt == torch.bfloat16:
        assert out["fold"][2] == 3 * layers and out["swiglu"][2] == 0
    assert rel_rms(out["swiglu"][0], out["nofold"][0]) < (1e-5 if dt == torch.float32 else 2e-2)


@pytest.mark.gpu
@_NEEDS_KERNEL
@pytest.mark.parametrize("identity", ["qwen3_6-tiny-dense", "qwen3_6-tiny-moe"])
def test_program_gemv_folds_match_reference_ops(identity, monkeypatch):
    """The reference op set with only `linear` taken from the GEMV (every shape on the kernel, the
    residual/norm folds at one row): an fp32 Program's logits equal the reference set's (prefill in two
    stages, decode rounds), and the decode steps ran the residual epilogue."""
    from ninfer.ops.opset import reference_ops
    from ninfer.ops.triton import gemv
    from ninfer.targets.dummy_weights import DummyWeights
    from ninfer.testing.forced_run import forced_logits

    monkeypatch.setattr(gemv, "use_triton", lambda n, k, m: True)
    monkeypatch.setattr(gemv, "_eligible", lambda x, w: x.dtype == w.dtype and x.stride(-1) == 1
                        and w.dim() == 2 and x.shape[-1] == w.shape[1])      # fp32 on the kernel too
    w = DummyWeights(identity, device=_DEV, dtype=torch.float32, seed=3, std=0.2)
    ref = reference_ops()
    base = forced_logits(w, ref, _DEV, enforce_eager=True, decode_steps=2)
    resid = []
    real = gemv.gemv
    monkeypatch.setattr(gemv, "gemv", lambda *a, **kw: resid.append(kw.get("residual") is not None) or real(*a, **kw))
    got = forced_logits(w, ref._replace(linear=gemv.linear), _DEV, enforce_eager=True, decode_steps=2)
    assert sum(resid) >= 2 * w.dims.num_hidden_layers
    assert rel_rms(got, base) < 1e-4
