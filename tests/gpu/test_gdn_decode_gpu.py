"""The fused GDN decode state step (`ninfer.ops.triton.gdn_decode.gdn_conv_recurrent`: gates, conv
update and gated delta rule in one launch) vs its reference composition (`ninfer.ops.reference.fused.gdn_conv_recurrent`).

GPU test (`pytest -m gpu`), skipped without CUDA; with TRITON_INTERPRET=1 NINFER_FAST_TEST_DEVICE=cpu
it runs through Triton's CPU interpreter. Checks: output, the conv and recurrent states written at
dst, the src entries and every other entry untouched (NaN-poisoned where never read).
"""
from __future__ import annotations


import pytest
import torch

from support.fast_env import DEV as _DEV, GPU_MARKS, INTERPRET as _INTERPRET, STRICT  # noqa: F401
from support.numerics import rel_rms

pytestmark = GPU_MARKS



# (H, HV, K, V): the 27B heads (16 key, 48 value, 128) and a small grouping for the interpreter.
SHAPES = [(2, 6, 32, 32)] if _INTERPRET else [(16, 48, 128, 128), (2, 6, 32, 32)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 3, 8])
@pytest.mark.parametrize("shape", SHAPES)
def test_gdn_conv_recurrent_vs_reference(dtype, B, shape):
    """The kernel loads the states before the PDL wait. Here the op's predecessor is a torch copy (not
    PDL-aware: the op starts after it completes); the decode graph tests (test_cuda_graphs_gpu.py) run it
    after the in-projection's PDL GEMV."""
    from ninfer.ops.reference import fused as ref
    from ninfer.ops.triton.gdn_decode import gdn_conv_recurrent

    H, HV, K, V = shape
    C = 2 * H * K + HV * V
    S = 3 * B + 2
    g0 = torch.Generator(device=_DEV).manual_seed(B * 7 + HV)
    rnd = lambda *s, scale=1.0: torch.randn(*s, generator=g0, device=_DEV) * scale  # noqa: E731
    wide = rnd(B, C + 2 * HV + 5, scale=2.0).to(dtype)   # qkv, b, a are strided slices of one wider row
    qkv, b, a = wide[:, :C], wide[:, C:C + HV], wide[:, C + HV:C + 2 * HV]
    wide[0, C + HV] = 30.0                                # softplus past torch's threshold (20)
    conv_w = rnd(C, 1, 4, scale=0.5).to(dtype)
    A_log = rnd(HV, scale=0.5)
    dt_bias = rnd(HV, scale=0.5)
    conv0 = torch.full((S, C, 3), float("nan"), device=_DEV, dtype=dtype)
    rec0 = torch.full((S, HV, K, V), float("nan"), device=_DEV)
    src = torch.arange(0, 2 * B, 2, device=_DEV)          # every other entry; dst after them
    dst = torch.arange(2 * B, 3 * B, device=_DEV)
    conv0[src] = rnd(B, C, 3).to(dtype)
    rec0[src] = rnd(B, HV, K, V, scale=0.3)
    outs = {}
    for name, fn in (("fast", gdn_conv_recurrent), ("ref", ref.gdn_conv_recurrent)):
        conv, rec = conv0.clone(), rec0.clone()
        o = fn(qkv, conv_w, conv, a, b, A_log, dt_bias, rec, src, dst, num_k_heads=H, head_k_dim=K, head_v_dim=V)
        outs[name] = (o, conv, rec)
    (o, conv, rec), (o_r, conv_r, rec_r) = outs["fast"], outs["ref"]
    tol = 2e-3 if dtype == torch.float32 else 2e-2
    assert o.shape == (B, HV, V) and o.dtype == dtype
    assert rel_rms(o, o_r) < tol
    assert rel_rms(rec[dst], rec_r[dst]) < tol
    assert torch.equal(conv[dst], conv_r[dst])            # the stepped window is a pure shift + the new input
    assert torch.equal(conv[src], conv0[src]) and torch.equal(rec[src], rec0[src])   # src never written
    untouched = torch.ones(S, dtype=torch.bool)
    untouched[src.cpu()] = False
    untouched[dst.cpu()] = False
    assert conv[untouched.to(_DEV)].isnan().all() and rec[untouched.to(_DEV)].isnan().all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gdn_conv_recurrent_in_place_falls_back_to_the_fast_ops(dtype):
    """dst None (state stepped in place at src) is not the one-kernel form (its q/k conv channels
    are read by several programs): the op runs the fast set's gates, conv update and delta rule,
    with the reference composition's result."""
    from ninfer.ops.reference import fused as ref
    from ninfer.ops.triton.gdn_decode import gdn_conv_recurrent

    H, HV, K, V = SHAPES[-1]
    B, C = 3, 2 * H * K + HV * V
    g0 = torch.Generator(device=_DEV).manual_seed(5)
    rnd = lambda *s, scale=1.0: torch.randn(*s, generator=g0, device=_DEV) * scale  # noqa: E731
    wide = rnd(B, C + 2 * HV, scale=2.0).to(dtype)
    qkv, b, a = wide[:, :C], wide[:, C:C + HV], wide[:, C + HV:]
    conv_w, A_log, dt_bias = rnd(C, 1, 4, scale=0.5).to(dtype), rnd(HV, scale=0.5), rnd(HV, scale=0.5)
    src = torch.tensor([4, 0, 2], device=_DEV)
    conv0, rec0 = rnd(6, C, 3).to(dtype), rnd(6, HV, K, V, scale=0.3)
    outs = []
    for fn in (gdn_conv_recurrent, ref.gdn_conv_recurrent):
        conv, rec = conv0.clone(), rec0.clone()
        o = fn(qkv, conv_w, conv, a, b, A_log, dt_bias, rec, src, None, num_k_heads=H, head_k_dim=K, head_v_dim=V)
        outs.append((o, conv, rec))
    (o, conv, rec), (o_r, conv_r, rec_r) = outs
    tol = 2e-3 if dtype == torch.float32 else 2e-2
    assert rel_rms(o, o_r) < tol and rel_rms(rec[src], rec_r[src]) < tol
    assert torch.equal(conv[src], conv_r[src])
    untouched = torch.tensor([1, 3, 5], device=_DEV)
    assert torch.equal(conv[untouched], conv0[untouched]) and torch.equal(rec[untouched], rec0[untouched])
