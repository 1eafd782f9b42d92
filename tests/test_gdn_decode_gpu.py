"""The fused GDN decode state step (`ninfer.ops.fast.gdn_decode.gdn_conv_recurrent`: gates, conv
update and gated delta rule in one launch) vs its reference composition (`ninfer.ops.fused.gdn_conv_recurrent`).

GPU test (`pytest -m gpu`), skipped without CUDA; with TRITON_INTERPRET=1 NINFER_FAST_TEST_DEVICE=cpu
it runs through Triton's CPU interpreter. Checks: output, the conv and recurrent states written at
dst, the src entries and every other entry untouched (NaN-poisoned where never read).
"""
from __future__ import annotations


import pytest
import torch

from _fast_env import DEV as _DEV, GPU_MARKS, INTERPRET as _INTERPRET, STRICT, rel_rms  # noqa: F401

pytestmark = GPU_MARKS



# (H, HV, K, V): the 27B heads (16 key, 48 value, 128) and a small grouping for the interpreter.
SHAPES = [(2, 6, 32, 32)] if _INTERPRET else [(16, 48, 128, 128), (2, 6, 32, 32)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 3, 8])
@pytest.mark.parametrize("shape", SHAPES)
def test_gdn_conv_recurrent_vs_reference(dtype, B, shape):
    from ninfer.ops import fused as ref
    from ninfer.ops.fast.gdn_decode import gdn_conv_recurrent

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
    from ninfer.ops import fused as ref
    from ninfer.ops.fast.gdn_decode import gdn_conv_recurrent

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B", [1, 8])
@pytest.mark.parametrize("fused", [True, False])
def test_gdn_conv_recurrent_with_gated_norm(dtype, B, fused, monkeypatch):
    """z and the norm weight given: the op returns gated_rms_norm(o, z, w) (fused: the last V-block
    program of each head applies it in the same launch, B=1 with 8 blocks a head at the 27B shape;
    off: the norm kernel after the step), the states as without the norm, and the arrival counters
    all zero afterwards (a graph replays with no reset)."""
    from ninfer.ops import fused as ref
    from ninfer.ops.fast import _counters, gdn_decode
    from ninfer.ops.fast.norms import gated_rms_norm

    monkeypatch.setattr(gdn_decode, "FUSE_NORM", fused)
    H, HV, K, V = SHAPES[0]
    C = 2 * H * K + HV * V
    S = 2 * B + 1
    g0 = torch.Generator(device=_DEV).manual_seed(11 + B)
    rnd = lambda *s, scale=1.0: torch.randn(*s, generator=g0, device=_DEV) * scale  # noqa: E731
    # the projection row as the model slices it: [qkv | z | b | a]; z a strided head view of it
    wide = rnd(B, C + HV * V + 2 * HV, scale=2.0).to(dtype)
    qkv = wide[:, :C]
    z = wide[:, C:C + HV * V].view(B, HV, V)
    b, a = wide[:, C + HV * V:C + HV * V + HV], wide[:, C + HV * V + HV:]
    conv_w = rnd(C, 1, 4, scale=0.5).to(dtype)
    A_log, dt_bias = rnd(HV, scale=0.5), rnd(HV, scale=0.5)
    norm_w = (1.0 + rnd(V, scale=0.2)).to(torch.float32 if dtype == torch.float32 else dtype)
    src = torch.arange(0, B, device=_DEV)
    dst = torch.arange(B, 2 * B, device=_DEV)
    conv0 = torch.full((S, C, 3), float("nan"), device=_DEV, dtype=dtype)
    rec0 = torch.full((S, HV, K, V), float("nan"), device=_DEV)
    conv0[src] = rnd(B, C, 3).to(dtype)
    rec0[src] = rnd(B, HV, K, V, scale=0.3)
    kw = dict(num_k_heads=H, head_k_dim=K, head_v_dim=V)
    conv, rec = conv0.clone(), rec0.clone()
    y = gdn_decode.gdn_conv_recurrent(qkv, conv_w, conv, a, b, A_log, dt_bias, rec, src, dst, **kw,
                                      z=z, norm_weight=norm_w, eps=1e-6)
    conv_p, rec_p = conv0.clone(), rec0.clone()
    o = gdn_decode.gdn_conv_recurrent(qkv, conv_w, conv_p, a, b, A_log, dt_bias, rec_p, src, dst, **kw)
    conv_r, rec_r = conv0.clone(), rec0.clone()
    y_r = ref.gdn_conv_recurrent(qkv, conv_w, conv_r, a, b, A_log, dt_bias, rec_r, src, dst, **kw,
                                 z=z, norm_weight=norm_w, eps=1e-6)
    assert y.shape == (B, HV, V) and y.dtype == dtype
    # the fused norm rounds as the fast norm kernel does on the plain step's output: equal bit for bit
    assert torch.equal(y, gated_rms_norm(o, z, norm_w, 1e-6))
    # NOTE: the norm scales every head to unit RMS, so a head with a small o carries o's bf16 error at
    #       full size (5 % in one head of this draw, 0.8 % over all of o): a looser bound than o's.
    assert rel_rms(y, y_r) < (2e-3 if dtype == torch.float32 else 8e-2)
    assert torch.equal(rec[dst], rec_p[dst]) and torch.equal(conv[dst], conv_p[dst])
    if fused:
        assert int(_counters._COUNTERS[torch.device(_DEV)].abs().sum()) == 0


def test_gdn_conv_recurrent_gated_norm_rejects_a_wrong_z():
    from ninfer.ops.fast.gdn_decode import gdn_conv_recurrent

    H, HV, K, V = SHAPES[-1]
    C = 2 * H * K + HV * V
    x = torch.zeros(1, C + 2 * HV, device=_DEV)
    with pytest.raises(ValueError, match="gated norm needs z"):
        gdn_conv_recurrent(x[:, :C], torch.zeros(C, 1, 4, device=_DEV), torch.zeros(2, C, 3, device=_DEV),
                           x[:, C + HV:], x[:, C:C + HV], torch.zeros(HV, device=_DEV), torch.zeros(HV, device=_DEV),
                           torch.zeros(2, HV, K, V, device=_DEV), torch.tensor([0], device=_DEV),
                           torch.tensor([1], device=_DEV), num_k_heads=H, head_k_dim=K, head_v_dim=V,
                           z=torch.zeros(1, HV, V + 1, device=_DEV), norm_weight=torch.ones(V, device=_DEV))
