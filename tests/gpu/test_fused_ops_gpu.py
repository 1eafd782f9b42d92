"""Fast fused steps (`ninfer.ops.triton.fused`) and the row-blocked gated RMSNorm vs their references.

Run on the GPU machine (`pytest -m gpu`); skipped without CUDA. With TRITON_INTERPRET=1 and
NINFER_FAST_TEST_DEVICE=cpu the kernels run in Triton's CPU interpreter (small N only; it is slow).

Shapes of the 27B: hidden 5120, attention heads 24 / kv 4 / head_dim 256 with rot 64, GDN value
heads 48 of 128. Inputs are the strided views the leaves pass (q/gate/k/v inside one projection
row, a/b column slices); outputs come from NaN-poisoned memory; KV pool slots that are not
written stay NaN (checked untouched).
"""
from __future__ import annotations


import pytest
import torch

from ninfer.ops import reference as ref
from ninfer.ops.reference import fused as ref_fused

from support.fast_env import DEV as _DEV, GPU_MARKS, INTERPRET as _INTERPRET, STRICT  # noqa: F401
from support.numerics import rel_rms

pytestmark = GPU_MARKS

DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: 2e-5, torch.bfloat16: 1e-2}
# NOTE: Triton's interpreter rounds fp32 -> bf16 towards zero (the GPU rounds to nearest even).
NS = [1, 3, 8, 63, 65, 500] if not _INTERPRET else [1, 3, 65]
HIDDEN, NH, NKV, HD, ROT, NV, DV = 5120, 24, 4, 256, 64, 48, 128



def close(a: torch.Tensor, b: torch.Tensor, roundings: int = 1) -> None:
    """rel RMS within the dtype's tolerance; in the interpreter each of the kernel's `roundings`
    successive bf16 truncations adds about one tolerance."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    assert rel_rms(a, b) < TOL[b.dtype] / STRICT * (roundings if _INTERPRET else 1)


def poison_allocator() -> None:
    """Fill free cached memory with NaN so that outputs not fully written show up."""
    if _DEV == "cuda":
        t = torch.full((64 << 20,), float("nan"), dtype=torch.float32, device="cuda")
        del t


def randn(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator(device=_DEV)
    g.manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=_DEV, dtype=torch.float32) * scale).to(dtype)


def fast():
    from ninfer.ops.triton import fused
    return fused


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", NS)
def test_add_rms_norm(dtype, N):
    x = randn(N, HIDDEN, dtype=dtype, seed=1, scale=3.0)
    row = randn(N, HIDDEN + 64, dtype=dtype, seed=2)
    delta = row[:, 32:32 + HIDDEN]                                   # strided rows
    w = randn(HIDDEN, dtype=dtype, seed=3, scale=0.1)
    poison_allocator()
    h, xn = fast().add_rms_norm(x, delta, w, 1e-6)
    rh, rxn = ref_fused.add_rms_norm(x, delta, w, 1e-6)
    assert torch.equal(xn, rxn) if not _INTERPRET or dtype == torch.float32 else rel_rms(xn, rxn) < 1e-2
    close(h, rh)
    h0, x0 = fast().add_rms_norm(x, None, w, 1e-6)
    assert x0 is x
    close(h0, ref.rms_norm(x, w, 1e-6))


def test_add_rms_norm_mixed_weight_dtype():
    x = randn(5, 320, dtype=torch.bfloat16, seed=4)
    d = randn(5, 320, dtype=torch.bfloat16, seed=5)
    w = randn(320, seed=6, scale=0.1)                               # fp32 weight on bf16 activations
    h, xn = fast().add_rms_norm(x, d, w)
    rh, rxn = ref_fused.add_rms_norm(x, d, w)
    close(h, rh)
    close(xn, rxn)


# ------------------------------------------------------------------------------------------------
def _attn_row(N, dtype, seed, nh=NH, nkv=NKV):
    """The attention projection row [q|gate per head, k, v] and its views (as the leaf makes them)."""
    nq, nk = nh * 2 * HD, nkv * HD
    qkv = randn(N, nq + 2 * nk, dtype=dtype, seed=seed, scale=2.0)
    qg = qkv[:, :nq].view(N, nh, 2 * HD)
    q, gate = qg[..., :HD], qg[..., HD:]
    k = qkv[:, nq:nq + nk].view(N, nkv, HD)
    v = qkv[:, nq + nk:].view(N, nkv, HD)
    return q, gate, k, v


def _cos_sin(N, rot, seed=0):
    pos = torch.randint(0, 100000, (N,), generator=torch.Generator().manual_seed(seed)).to(_DEV)
    return ref.mrope_cos_sin(pos, head_dim=HD, partial_rotary_factor=rot / HD)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", NS)
def test_qk_norm_rope(dtype, N):
    q, _, k, _ = _attn_row(N, dtype, seed=10 + N)
    assert not q.is_contiguous() and (N == 1 or not k.is_contiguous())
    wq = randn(HD, dtype=dtype, seed=11, scale=0.1)
    wk = randn(HD, dtype=dtype, seed=12, scale=0.1)
    cos, sin = _cos_sin(N, ROT)
    poison_allocator()
    fq, fk = fast().qk_norm_rope(q, k, wq, wk, cos, sin, 1e-6)
    rq, rk = ref_fused.qk_norm_rope(q, k, wq, wk, cos, sin, 1e-6)
    assert fq.is_contiguous() and fk.is_contiguous()
    close(fq, rq, roundings=3)
    close(fk, rk, roundings=3)
    close(fq[..., ROT:], rq[..., ROT:])                              # pass-through dims
    close(fk[..., :ROT], rk[..., :ROT], roundings=3)                 # rotated dims


@pytest.mark.parametrize("rot,hd,nh,nkv", [(0, 64, 3, 1), (64, 64, 4, 2), (16, 96, 5, 3)])
def test_qk_norm_rope_other_shapes(rot, hd, nh, nkv):
    """Full rotary, no rotary, a head dim that is not a power of two; contiguous inputs."""
    N = 7
    q = randn(N, nh, hd, seed=20)
    k = randn(N, nkv, hd, seed=21)
    wq, wk = randn(hd, seed=22, scale=0.1), randn(hd, seed=23, scale=0.1)
    pos = torch.arange(N, device=_DEV) * 37
    if rot:
        cos, sin = ref.mrope_cos_sin(pos, head_dim=hd, partial_rotary_factor=rot / hd,
                                     mrope_section=(rot // 2, 0, 0))
    else:
        cos = sin = torch.empty(N, 0, device=_DEV)
    fq, fk = fast().qk_norm_rope(q, k, wq, wk, cos, sin)
    rq, rk = ref_fused.qk_norm_rope(q, k, wq, wk, cos, sin)
    close(fq, rq)
    close(fk, rk)


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", NS)
def test_silu_mul_halves(dtype, N):
    I = 1000 if _INTERPRET else 17408
    gu = randn(N, 2 * I + 16, dtype=dtype, seed=30, scale=3.0)[:, 8:8 + 2 * I]   # strided rows
    poison_allocator()
    y = fast().silu_mul_halves(gu)
    close(y, ref_fused.silu_mul_halves(gu))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", NS)
def test_sigmoid_gate_mul(dtype, N):
    _, gate, _, _ = _attn_row(N, dtype, seed=40 + N)
    o = randn(N, NH, HD, dtype=dtype, seed=41)
    poison_allocator()
    y = fast().sigmoid_gate_mul(o, gate)
    assert y.is_contiguous()
    close(y, ref.attention_output_gate(o, gate))
    o2 = o.reshape(N, NH * HD)
    g2 = gate.reshape(N, NH * HD)
    close(fast().sigmoid_gate_mul(o2, g2), ref.attention_output_gate(o2, g2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N", NS)
def test_gdn_gates(dtype, N):
    y = randn(N, 200 + 2 * NV, dtype=dtype, seed=50, scale=4.0)
    y[0, 200:200 + 8] = torch.tensor([-60.0, -30.0, -12.0, 0.0, 19.0, 21.0, 40.0, 1e-3], dtype=dtype)
    b, a = y[:, 200:200 + NV], y[:, 200 + NV:]
    A_log = randn(NV, seed=51)
    dt_bias = randn(NV, seed=52)
    poison_allocator()
    g, beta = fast().gdn_gates(a, b, A_log, dt_bias)
    rg, rbeta = ref.gdn_gates(a, b, A_log, dt_bias)
    assert g.dtype == torch.float32
    assert rel_rms(g, rg) < 1e-5
    close(beta, rbeta)


def test_gdn_gates_softplus_tails():
    """softplus over its whole range (tiny values through log1p, the linear branch past 20)."""
    a = torch.tensor([[-80.0, -40.0, -17.0, -5.0, -1e-4, 0.0, 3.0, 19.9, 20.1, 50.0]], device=_DEV)
    b = torch.zeros_like(a)
    A_log = torch.zeros(a.shape[1], device=_DEV)
    g, _ = fast().gdn_gates(a, b, A_log, torch.zeros_like(A_log))
    rg, _ = ref.gdn_gates(a, b, A_log, torch.zeros_like(A_log))
    torch.testing.assert_close(g, rg, rtol=1e-5, atol=0)


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,cache_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                               (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("N", NS)
@pytest.mark.parametrize("with_rows", [True, False])
def test_write_kv_paged(dtype, cache_dtype, idx_dtype, N, with_rows):
    page, B = 16, 3
    _, _, k, v = _attn_row(N, dtype, seed=60 + N)
    need = (N + 5 + page - 1) // page + 1
    P = B * need + 2
    perm = torch.randperm(P, generator=torch.Generator().manual_seed(N))
    bt = perm[:B * need].view(B, need).to(device=_DEV, dtype=idx_dtype)
    if with_rows:
        rows = torch.tensor([(i * 7) % B for i in range(N)], dtype=idx_dtype, device=_DEV)
        positions = torch.tensor([5 + i for i in range(N)], dtype=idx_dtype, device=_DEV)
    else:
        rows, positions = None, torch.arange(3, 3 + N, dtype=idx_dtype, device=_DEV)
    kc = torch.full((P, page, NKV, HD), float("nan"), dtype=cache_dtype, device=_DEV)
    vc = torch.full_like(kc, float("nan"))
    rkc, rvc = kc.clone(), vc.clone()
    fast().write_kv_paged(kc, vc, k, v, bt, positions, rows)
    ref.write_kv_paged(rkc, rvc, k, v, bt, positions, rows)
    written = torch.zeros(P * page, dtype=torch.bool, device=_DEV)
    written[ref.kv_slot_mapping(bt, positions, rows, page)] = True
    for c, rc in ((kc, rkc), (vc, rvc)):
        flat, rflat = c.view(P * page, -1), rc.view(P * page, -1)
        assert torch.isnan(flat[~written]).all(), "slots outside the written ones were touched"
        if dtype == cache_dtype or not _INTERPRET:
            assert torch.equal(flat[written], rflat[written])
        else:
            close(flat[written], rflat[written])


def _kv_pages(N, page, nkv, cache_dtype, with_rows, idx_dtype, seed):
    """NaN-poisoned pools, a block table of permuted pages [3 rows, 4 pages] and each token's
    (position, row): the tokens of a row cross a page boundary (positions page-1, page)."""
    B, W = 3, 4
    P = B * W + 2
    bt = torch.randperm(P, generator=torch.Generator().manual_seed(seed))[:B * W].view(B, W).to(_DEV, torch.int32)
    if with_rows:
        rows = torch.tensor([1, 1, 2][:N], dtype=idx_dtype, device=_DEV)
        positions = torch.tensor([page - 1, page, 3 * page - 2][:N], dtype=idx_dtype, device=_DEV)
    else:
        rows, positions = None, torch.arange(page - 2, page - 2 + N, dtype=idx_dtype, device=_DEV)
    kc = torch.full((P, page, nkv, HD), float("nan"), dtype=cache_dtype, device=_DEV)
    return kc, torch.full_like(kc, float("nan")), bt, positions, rows


@pytest.mark.parametrize("dtype,cache_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                               (torch.float32, torch.bfloat16)])
@pytest.mark.parametrize("N", [1, 3])
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("nh,nkv", [(NH, NKV), (16, 2)])
@pytest.mark.parametrize("with_rows,idx_dtype", [(True, torch.int64), (False, torch.int64), (True, torch.int32)])
def test_qk_norm_rope_write_kv(dtype, cache_dtype, N, page, nh, nkv, with_rows, idx_dtype):
    """One launch == qk_norm_rope then write_kv_paged (the reference composition): q', the written k'
    and v slots; every other slot stays NaN; the two fast kernels (qk_norm_rope, then write_kv_paged)
    give the same bits in bf16."""
    q, _, k, v = _attn_row(N, dtype, seed=80 + N, nh=nh, nkv=nkv)
    wq = randn(HD, dtype=dtype, seed=81, scale=0.1)
    wk = randn(HD, dtype=dtype, seed=82, scale=0.1)
    cos, sin = _cos_sin(N, ROT, seed=N)
    kc, vc, bt, positions, rows = _kv_pages(N, page, nkv, cache_dtype, with_rows, idx_dtype, seed=N + page)
    rkc, rvc, okc, ovc = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    poison_allocator()
    fq = fast().qk_norm_rope_write_kv(q, k, v, wq, wk, cos, sin, 1e-6, kc, vc, bt, positions, rows)
    rq = ref.qk_norm_rope_write_kv(q, k, v, wq, wk, cos, sin, 1e-6, rkc, rvc, bt, positions, rows)
    assert fq.is_contiguous()
    close(fq, rq, roundings=3)
    P = kc.shape[0]
    written = torch.zeros(P * page, dtype=torch.bool, device=_DEV)
    written[ref.kv_slot_mapping(bt, positions, rows, page)] = True
    for c, rc in ((kc, rkc), (vc, rvc)):
        flat, rflat = c.view(P * page, -1), rc.view(P * page, -1)
        assert torch.isnan(flat[~written]).all(), "slots outside the written ones were touched"
        assert not torch.isnan(flat[written]).any()
    close(kc.view(P * page, -1)[written], rkc.view(P * page, -1)[written], roundings=4)
    if dtype == cache_dtype or not _INTERPRET:
        assert torch.equal(vc.view(P * page, -1)[written], rvc.view(P * page, -1)[written])
    oq, ok = fast().qk_norm_rope(q, k, wq, wk, cos, sin, 1e-6)
    fast().write_kv_paged(okc, ovc, ok, v, bt, positions, rows)
    assert torch.equal(okc.isnan(), kc.isnan()) and torch.equal(ovc.nan_to_num(7.0), vc.nan_to_num(7.0))
    if dtype == torch.bfloat16:
        assert torch.equal(oq, fq) and torch.equal(okc.nan_to_num(7.0), kc.nan_to_num(7.0))
    else:
        # NOTE: fp32 math is not rounded per step, and the two compiled kernels may contract the
        #       multiply-adds differently (measured on the H200: a few ulps of q', then k' in a bf16 cache).
        close(oq, fq)
        close(okc.view(P * page, -1)[written], kc.view(P * page, -1)[written])


def test_qk_norm_rope_write_kv_more_kv_heads_than_programs():
    """Few q heads, many kv heads at a small head dim: each program copies several v heads (VB > 1)."""
    N, nh, nkv, hd, page = 3, 2, 6, 64, 16
    q = randn(N, nh, hd, seed=90)
    k = randn(N, nkv, hd, seed=91)
    v = randn(N, nkv, hd, seed=92)
    wq, wk = randn(hd, seed=93, scale=0.1), randn(hd, seed=94, scale=0.1)
    cos, sin = ref.mrope_cos_sin(torch.arange(N, device=_DEV) * 11, head_dim=hd, partial_rotary_factor=0.5,
                                 mrope_section=(16, 0, 0))
    bt = torch.tensor([[3, 0, 2]], dtype=torch.int32, device=_DEV)
    positions = torch.arange(page - 1, page - 1 + N, device=_DEV)
    kc = torch.full((4, page, nkv, hd), float("nan"), device=_DEV)
    vc = torch.full_like(kc, float("nan"))
    rkc, rvc = kc.clone(), vc.clone()
    fq = fast().qk_norm_rope_write_kv(q, k, v, wq, wk, cos, sin, 1e-6, kc, vc, bt, positions, None)
    rq = ref.qk_norm_rope_write_kv(q, k, v, wq, wk, cos, sin, 1e-6, rkc, rvc, bt, positions, None)
    close(fq, rq)
    assert torch.equal(vc.nan_to_num(7.0), rvc.nan_to_num(7.0))
    assert torch.equal(kc.isnan(), rkc.isnan())
    close(kc.nan_to_num(0.0), rkc.nan_to_num(0.0))


# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,wdtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                          (torch.bfloat16, torch.bfloat16)])
@pytest.mark.parametrize("N", NS + ([8192] if not _INTERPRET else [40]))
def test_gated_rms_norm_blocked(dtype, wdtype, N):
    """Decode and prefill row counts (one row per program, then row blocks); z a strided head view."""
    from ninfer.ops.triton import norms
    y = randn(N, NV * DV * 2 + 32, dtype=dtype, seed=70)
    z = y[:, 32:32 + NV * DV].view(N, NV, DV)
    o = randn(N, NV, DV, dtype=dtype, seed=71)
    w = 1.0 + randn(DV, dtype=wdtype, seed=72, scale=0.1)
    poison_allocator()
    out = norms.gated_rms_norm(o, z, w, 1e-6)
    close(out, ref.gated_rms_norm(o, z, w, 1e-6))
    if not _INTERPRET:
        assert torch.equal(out, norms.gated_rms_norm(o, z.contiguous(), w, 1e-6))


@pytest.mark.parametrize("R", [1025, 1505, 4097 * 3])
def test_gated_rms_norm_row_block_tail(R):
    """Row counts that leave a partial last block (contiguous [R, D] rows; D not a power of two)."""
    from ninfer.ops.triton import norms
    o = randn(R, 96, seed=73)
    z = randn(R, 96, seed=74)
    w = 1.0 + randn(96, seed=75, scale=0.1)
    poison_allocator()
    close(norms.gated_rms_norm(o, z, w, 1e-6), ref.gated_rms_norm(o, z, w, 1e-6))
