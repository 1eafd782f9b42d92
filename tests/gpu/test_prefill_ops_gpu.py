"""Prefill-path fast ops vs their PyTorch references: the conv's row-walking kernel and its
split (q, k, v) output, the GDN prefill wrapper without cu_seqlens for one sequence, and the
GQA-native paged prefill attention with host row bounds.

GPU tests (`pytest -m gpu`); with TRITON_INTERPRET=1 and NINFER_FAST_TEST_DEVICE=cpu the Triton
kernels run in Triton's CPU interpreter (fla-core's prefill is then skipped).
"""
from __future__ import annotations

import pytest
import torch

from ninfer.ops import reference as ref

from support.fast_env import DEV, GPU_MARKS, INTERPRET, STRICT, gen, paged_kv, poison_allocator, randn
from support.numerics import rel_rms

pytestmark = GPU_MARKS

TOL = {torch.float32: 2e-3, torch.bfloat16: 1e-2}
LENS = [1, 63, 64, 65, 500] if not INTERPRET else [1, 5, 64, 65]


def _nan_pool(S, *shape, dtype):
    return torch.full((S, *shape), float("nan"), dtype=dtype, device=DEV)


# ------------------------------------------------------------------------------------------------
# causal conv1d (prefill kernel)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_t", [4, 32])
def test_conv_varlen_slots_split_strided(dtype, block_t):
    """Packed lengths 1/63/64/65/500 with slot state, x a strided column view of a wider
    projection (as the schedule passes it), output split into (q, k, v): == per-sequence
    reference calls; state written only at the slots; other slots stay NaN."""
    from ninfer.ops.triton import conv
    g = gen(11)
    split = (64, 64, 192)
    C, S, extra = sum(split), 9, 40
    lens = LENS
    slots = torch.tensor([7, 0, 3, 5, 2][:len(lens)], device=DEV)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), device=DEV)
    proj = randn(sum(lens), C + extra, dtype=dtype, g=g)
    x = proj[:, :C].unsqueeze(0)                                    # row stride C + extra
    w = randn(C, 4, dtype=dtype, g=g, scale=0.5)
    init = randn(len(lens), C, 3, dtype=dtype, g=g)
    for sp in (None, split):
        pool = _nan_pool(S, C, 3, dtype=dtype)
        pool[slots] = init
        poison_allocator()
        y, ret = conv.chunk_causal_conv1d(x, w, pool, cu_seqlens=cu, state_indices=slots, split=sp,
                                          block_t=block_t, gather_final_state=False)
        assert ret is None
        if sp is not None:
            assert all(t.is_contiguous() and t.shape == (1, sum(lens), wd) for t, wd in zip(y, sp))
            y = torch.cat(y, dim=-1)
        for n, L in enumerate(lens):
            s = int(cu[n])
            ry, rns = ref.chunk_causal_conv1d(x[:, s:s + L], w, init[n:n + 1])
            assert rel_rms(y[:, s:s + L], ry) < TOL[dtype] / STRICT, f"row {n} (length {L})"
            assert torch.equal(pool[slots[n]], rns[0])
        other = [i for i in range(S) if i not in slots.tolist()]
        assert torch.isnan(pool[other]).all()


@pytest.mark.parametrize("T", LENS)
def test_conv_dense_batch_split(T):
    """Dense [B, T, C] batch (no cu_seqlens), zero and given state, split output == slices of y."""
    from ninfer.ops.triton import conv
    g = gen(12)
    B, split = 3, (32, 32, 96)
    C = sum(split)
    x = randn(B, T, C, dtype=torch.bfloat16, g=g)
    w = randn(C, 4, dtype=torch.bfloat16, g=g, scale=0.5)
    st = randn(B, C, 3, dtype=torch.bfloat16, g=g)
    for state in (None, st):
        poison_allocator()
        (q, k, v), ns = conv.chunk_causal_conv1d(x, w, state, split=split)
        ry, rns = ref.chunk_causal_conv1d(x, w, state)
        for part, (a, b) in zip((q, k, v), ((0, 32), (32, 64), (64, C))):
            assert part.shape == (B, T, b - a) and part.is_contiguous()
            assert rel_rms(part, ry[..., a:b]) < TOL[torch.bfloat16] / STRICT
        assert torch.equal(ns, rns)


def test_conv_no_activation_and_odd_channels():
    """activation=None, C not a multiple of the channel block (masked tail), T < 3."""
    from ninfer.ops.triton import conv
    g = gen(13)
    for T in (1, 2, 7):
        x = randn(2, T, 200, g=g)
        w = randn(200, 4, g=g, scale=0.5)
        st = randn(2, 200, 3, g=g)
        y, ns = conv.chunk_causal_conv1d(x, w, st, activation=None)
        ry, rns = ref.chunk_causal_conv1d(x, w, st, activation=None)
        assert rel_rms(y, ry) < TOL[torch.float32] / STRICT
        assert torch.equal(ns, rns)


def test_conv_split_rejects_bad_widths():
    from ninfer.ops.triton import conv
    x = randn(1, 4, 64)
    w = randn(64, 4)
    with pytest.raises(ValueError):
        conv.chunk_causal_conv1d(x, w, None, split=(32, 16))


# ------------------------------------------------------------------------------------------------
# GDN prefill wrapper (fla-core)
# ------------------------------------------------------------------------------------------------
def _need_fla():
    from ninfer.ops.triton.gated_delta import fla_available
    if DEV != "cuda" or not fla_available():
        pytest.skip("fla-core (CUDA) not available")


@pytest.mark.parametrize("T", LENS)
def test_chunk_gdn_one_sequence_cu_seqlens(T):
    """One packed sequence with cu_seqlens (run without them, no host sync) and a slot pool ==
    the reference; other slots untouched."""
    _need_fla()
    from ninfer.ops.triton import gated_delta as fg
    g = gen(14)
    Hk, Hv, K, V, S = 2, 6, 128, 128, 4
    q = randn(1, T, Hk, K, dtype=torch.bfloat16, g=g)
    k = randn(1, T, Hk, K, dtype=torch.bfloat16, g=g)
    v = randn(1, T, Hv, V, dtype=torch.bfloat16, g=g)
    gg = -torch.rand(1, T, Hv, generator=g, device=DEV) * 0.5
    beta = torch.rand(1, T, Hv, generator=g, device=DEV).to(torch.bfloat16)
    init = randn(1, Hv, K, V, g=g, scale=0.1)
    pool = _nan_pool(S, Hv, K, V, dtype=torch.float32)
    slots = torch.tensor([2], device=DEV)
    pool[slots] = init
    cu = torch.tensor([0, T], device=DEV)
    poison_allocator()
    o, _ = fg.chunk_gated_delta_rule(q, k, v, gg, beta, initial_state=pool, state_indices=slots, cu_seqlens=cu,
                                     use_qk_l2norm_in_kernel=True, gather_final_state=False)
    ro, rS = ref.chunk_gated_delta_rule(q, k, v, gg, beta, initial_state=init, use_qk_l2norm_in_kernel=True)
    assert rel_rms(o, ro) < TOL[torch.bfloat16]
    assert rel_rms(pool[2], rS[0]) < TOL[torch.bfloat16]
    assert torch.isnan(pool[[0, 1, 3]]).all()


# ------------------------------------------------------------------------------------------------
# paged prefill attention
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("L", LENS)
@pytest.mark.parametrize("Hq,Hkv", [(6, 1), (8, 2), (4, 4)])
def test_chunk_paged_attention_one_row(dtype, L, Hq, Hkv):
    """One whole prompt (the TTFT case: output returned without a copy) and one chunk over a
    prefix, with host (CPU) and device row bounds alike; GQA without repeated K/V."""
    from ninfer.ops.triton import attention as fa
    g = gen(15)
    D, page = 64, 16
    for ctx_len in (L, L + 37):
        kc, vc, bt = paged_kv([ctx_len], Hkv, D, page, dtype, g)
        q = randn(L, Hq, D, dtype=dtype, g=g)
        ro = ref.chunk_paged_attention(q, kc, vc, bt, torch.tensor([ctx_len], device=DEV))
        for ctx, cu in ((torch.tensor([ctx_len]), torch.tensor([0, L])),
                        (torch.tensor([ctx_len], device=DEV), None)):
            o = fa.chunk_paged_attention(q, kc, vc, bt, ctx, cu)
            assert o.shape == q.shape and o.dtype == dtype
            assert rel_rms(o, ro) < TOL[dtype], f"context {ctx_len}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunk_paged_attention_rows_host_bounds(dtype):
    """Several rows (whole prompts, a chunk over a prefix, an empty row) with CPU row bounds."""
    from ninfer.ops.triton import attention as fa
    g = gen(16)
    Hq, Hkv, D, page = 8, 2, 128, 16
    ctx_lens = [1, 63, 65, 500, 9]
    new = [1, 63, 17, 500, 0]
    kc, vc, bt = paged_kv(ctx_lens, Hkv, D, page, dtype, g)
    cu = torch.tensor([0] + torch.tensor(new).cumsum(0).tolist())
    q = randn(sum(new), Hq, D, dtype=dtype, g=g)
    ctx = torch.tensor(ctx_lens)
    poison_allocator()
    o = fa.chunk_paged_attention(q, kc, vc, bt, ctx, cu)
    ro = ref.chunk_paged_attention(q, kc, vc, bt, ctx.to(DEV), cu.to(DEV))
    assert rel_rms(o, ro) < TOL[dtype]


_CUDNN = pytest.mark.skipif(DEV == "cpu" or INTERPRET, reason="cuDNN attention needs CUDA")


@_CUDNN
@pytest.mark.parametrize("D", [128, 256])
@pytest.mark.parametrize("L,P", [(300, 1024), (300, 1100), (513, 96), (64, 2048 + 5), (1000, 3000)])
def test_split_prefix_sdpa(monkeypatch, D, L, P):
    """A chunk over its prefix through two cuDNN calls merged by log-sum-exp == the reference, with the
    prefix split at a grain of 512 keys: P a multiple of it (no remainder), a remainder (the prefix's
    last keys as zero query rows of the causal call), P under one grain (the padded causal call alone);
    chunk_paged_attention takes that route when SPLIT_MIN_FLOPS lets it, and == its flash result."""
    from ninfer.ops.reference import prefix_routing as pr
    from ninfer.ops.triton import attention as fa
    monkeypatch.setattr(pr, "SPLIT_GRAIN", 512)
    g = gen(L + P + D)
    Hq, Hkv, page, dtype = 8, 2, 16, torch.bfloat16
    kc, vc, bt = paged_kv([P + L], Hkv, D, page, dtype, g)
    q = randn(L, Hq, D, dtype=dtype, g=g)
    ctx = torch.tensor([P + L])
    ro = ref.chunk_paged_attention(q.float(), kc.float(), vc.float(), bt, ctx.to(DEV))
    k = ref.gather_kv_paged(kc, bt[0], P + L)
    v = ref.gather_kv_paged(vc, bt[0], P + L)
    poison_allocator()
    o = fa.split_prefix_sdpa(q, k, v, D ** -0.5)
    assert o.shape == q.shape and o.dtype == dtype and o.is_contiguous()
    assert rel_rms(o, ro) < TOL[dtype]
    monkeypatch.setattr(pr, "PAD_MAX_WORK", 0.0)
    flash = fa.chunk_paged_attention(q, kc, vc, bt, ctx)             # under SPLIT_MIN_FLOPS: flash
    monkeypatch.setattr(pr, "SPLIT_MIN_FLOPS", 0.0)
    routed = fa.chunk_paged_attention(q, kc, vc, bt, ctx)
    assert torch.equal(routed, o)
    assert rel_rms(routed, flash) < TOL[dtype]


@_CUDNN
@pytest.mark.parametrize("L,P", [(700, 300), (500, 12), (4096, 4096), (1000, 37)])
def test_front_padded_sdpa(monkeypatch, L, P):
    """A chunk over a prefix shorter than about itself runs as causal self-attention of the whole context
    with zero query rows for the prefix (chunk_paged_attention routes it there under PAD_MAX_WORK) ==
    the reference, and close to flash's lower-right form; two rows in one packed chunk, one routed each way."""
    from ninfer.ops.reference import prefix_routing as pr
    from ninfer.ops.triton import attention as fa
    g = gen(L + 3 * P)
    Hq, Hkv, D, page, dtype = 8, 2, 256, 16, torch.bfloat16
    L2, P2 = 64, 3000                                                # the second row: flash / split
    kc, vc, bt = paged_kv([P + L, P2 + L2], Hkv, D, page, dtype, g)
    q = randn(L + L2, Hq, D, dtype=dtype, g=g)
    ctx, cu = torch.tensor([P + L, P2 + L2]), torch.tensor([0, L, L + L2])
    ro = ref.chunk_paged_attention(q.float(), kc.float(), vc.float(), bt, ctx.to(DEV), cu.to(DEV))
    assert pr.prefix_form(Hq, D, L, P + L) == "pad" and pr.prefix_form(Hq, D, L2, P2 + L2) != "pad"
    k = ref.gather_kv_paged(kc, bt[0], P + L)
    v = ref.gather_kv_paged(vc, bt[0], P + L)
    poison_allocator()
    o = fa.front_padded_sdpa(q[:L], k, v, D ** -0.5)
    assert o.shape == (L, Hq, D) and rel_rms(o, ro[:L]) < TOL[dtype]
    routed = fa.chunk_paged_attention(q, kc, vc, bt, ctx, cu)
    assert torch.equal(routed[:L], o) and rel_rms(routed, ro) < TOL[dtype]
    monkeypatch.setattr(pr, "PAD_MAX_WORK", 0.0)
    flash = fa.chunk_paged_attention(q, kc, vc, bt, ctx, cu)
    assert rel_rms(flash, routed) < TOL[dtype]


@_CUDNN
def test_split_prefix_sdpa_falls_back_to_flash(monkeypatch):
    """A cuDNN failure warns once, the call returns flash's result, and later calls take flash directly."""
    from ninfer.ops.reference import prefix_routing as pr
    from ninfer.ops.triton import attention as fa
    monkeypatch.setattr(pr, "SPLIT_MIN_FLOPS", 0.0)
    monkeypatch.setattr(pr, "cudnn_split_ok", True)
    g = gen(21)
    Hq, Hkv, D, page, L, P = 8, 2, 128, 16, 200, 4096
    kc, vc, bt = paged_kv([P + L], Hkv, D, page, torch.bfloat16, g)
    q = randn(L, Hq, D, dtype=torch.bfloat16, g=g)
    ctx = torch.tensor([P + L])
    calls = []

    def broken(*a, **kw):
        calls.append(1)
        raise RuntimeError("cuDNN Frontend error: no plan for this graph")

    monkeypatch.setattr(fa, "_cudnn_attention", broken)
    with pytest.warns(RuntimeWarning, match="cuDNN attention over a prefix failed"):
        o = fa.chunk_paged_attention(q, kc, vc, bt, ctx)
    assert pr.cudnn_split_ok is False and calls == [1]
    ro = ref.chunk_paged_attention(q.float(), kc.float(), vc.float(), bt, ctx.to(DEV))
    assert rel_rms(o, ro) < TOL[torch.bfloat16]
    assert torch.equal(fa.chunk_paged_attention(q, kc, vc, bt, ctx), o) and calls == [1]


@_CUDNN
def test_warm_prefix_forms(monkeypatch):
    """The serve warmup's plan step runs every planned stage shape through the forms (pad and split both
    occur here), stops starting shapes once its budget is spent, and leaves later results unchanged."""
    from ninfer.ops.reference import prefix_routing as pr
    from ninfer.ops.triton import attention as fa
    monkeypatch.setattr(pr, "SPLIT_GRAIN", 256)
    monkeypatch.setattr(pr, "SPLIT_MIN_FLOPS", 2e8)
    Hq, Hkv, D, dtype = 8, 2, 128, torch.bfloat16
    shapes = pr.prefix_plan_shapes(Hq, D, 512, 2500)
    assert {pr.prefix_form(Hq, D, L, C) for L, C in shapes} >= {"pad", "split"}
    assert fa.warm_prefix_forms(shapes, Hq, Hkv, D, dtype, torch.device(DEV)) == len(shapes)
    assert fa.warm_prefix_forms(shapes, Hq, Hkv, D, dtype, torch.device(DEV), budget_s=0.0) == 0
    assert fa.warm_prefix_forms([], Hq, Hkv, D, dtype, torch.device(DEV)) == 0
    g = gen(5)
    L, P = 512, 1536
    kc, vc, bt = paged_kv([P + L], Hkv, D, 16, dtype, g)
    q = randn(L, Hq, D, dtype=dtype, g=g)
    ctx = torch.tensor([P + L])
    assert pr.prefix_form(Hq, D, L, P + L) == "split"
    ro = ref.chunk_paged_attention(q.float(), kc.float(), vc.float(), bt, ctx.to(DEV))
    assert rel_rms(fa.chunk_paged_attention(q, kc, vc, bt, ctx), ro) < TOL[dtype]


@_CUDNN
def test_program_warmup_attention_plans(tiny_artifact_path):
    """The Program's plan step on the fast ops: every shape of prompts up to max_model_len - 1 runs within
    the default budget (a small model and context); none within one stage."""
    from support.program_util import tiny_program
    prog = tiny_program(tiny_artifact_path, "dense", device="cuda", dtype="bf16", max_model_len=1200,
                        enforce_eager=True)
    assert prog.model.ops.name == "fast"
    ran, total = prog.warmup_attention_plans(256, 1200)
    assert ran == total > 0
    assert prog.warmup_attention_plans(2048, 1200) == (0, 0)


# ------------------------------------------------------------------------------------------------
# the schedule's prefill path with these ops (split conv output, host row bounds)
# ------------------------------------------------------------------------------------------------
def test_program_prefill_split_conv_and_host_bounds():
    """A tiny dense Program prefilled in two chunks (then one decode step) with the fast conv
    (q, k, v split output) and the fast prefill attention in the reference op set == the
    reference op set alone."""
    import functools

    from ninfer.ops.triton import attention as fa
    from ninfer.ops.triton import conv as fc
    from ninfer.ops.opset import reference_ops
    from ninfer.targets.dummy_weights import DummyWeights
    from ninfer.testing.forced_run import forced_logits

    w = DummyWeights("qwen3_6-tiny-dense", device=DEV, dtype=torch.float32, seed=3, std=0.2)
    mixed = reference_ops()._replace(
        chunk_causal_conv1d=functools.partial(fc.chunk_causal_conv1d, gather_final_state=False),
        chunk_paged_attention=fa.chunk_paged_attention)
    logits = {name: forced_logits(w, ops, DEV, decode_steps=1)
              for name, ops in (("mixed", mixed), ("reference", reference_ops()))}
    assert rel_rms(logits["mixed"], logits["reference"]) < 1e-4
