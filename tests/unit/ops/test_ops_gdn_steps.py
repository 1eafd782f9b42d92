"""The multi-token GDN decode state step (`ninfer.ops.reference.fused.gdn_conv_recurrent_steps`, the
speculative verify forward's GDN state part): T one-token steps per row, every intermediate state kept
at its own entry. CPU reference tests; tests/gpu/test_gdn_steps_gpu.py compares the Triton op with it."""
from __future__ import annotations

import pytest
import torch

from ninfer.ops.reference import conv as ref_conv, fused, gated_delta
from support.numerics import rel_rms

H, HV, K, V = 2, 4, 8, 8          # two value heads per key head
C = 2 * H * K + HV * V
DIMS = dict(num_k_heads=H, head_k_dim=K, head_v_dim=V)


def _case(B, T, dtype=torch.float32, seed=0):
    """Inputs of B rows x T tokens; a and b are column slices of one wider projection output. Pools of
    S = B * (T + 2) + 1 entries, NaN everywhere except the src entries; src at the pool's end, dst a
    shuffled set of the other entries. Returns (args, src, dst, conv0, rec0)."""
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s, scale=1.0: torch.randn(*s, generator=g) * scale  # noqa: E731
    wide = rnd(B, T, C + 2 * HV + 3, scale=2.0).to(dtype)
    qkv, b, a = wide[..., :C], wide[..., C:C + HV], wide[..., C + HV:C + 2 * HV]
    conv_w = rnd(C, 1, 4, scale=0.5).to(dtype)
    A_log, dt_bias = rnd(HV, scale=0.5), rnd(HV, scale=0.5)
    S = B * (T + 2) + 1
    perm = torch.randperm(S - B, generator=g)
    src = torch.arange(S - B, S)
    dst = perm[:B * T].reshape(B, T)
    conv0 = torch.full((S, C, 3), float("nan"), dtype=dtype)
    rec0 = torch.full((S, HV, K, V), float("nan"))
    conv0[src] = rnd(B, C, 3).to(dtype)
    rec0[src] = rnd(B, HV, K, V, scale=0.3)
    return (qkv, conv_w, a, b, A_log, dt_bias), src, dst, conv0, rec0


def _same(x, y) -> bool:
    """Equal element for element, NaN (never written) matching NaN."""
    return x.shape == y.shape and bool(((x == y) | (x.isnan() & y.isnan())).all())


def _run(fn, args, conv0, rec0, src, dst, T=None, **kw):
    """fn on fresh copies of the pools (the first T tokens only when T is given) -> (o, conv, rec)."""
    qkv, conv_w, a, b, A_log, dt_bias = args
    if T is not None:
        qkv, a, b = qkv[:, :T], a[:, :T], b[:, :T]
    conv, rec = conv0.clone(), rec0.clone()
    o = fn(qkv, conv_w, conv, a, b, A_log, dt_bias, rec, src, dst, **DIMS, **kw)
    return o, conv, rec


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("B,T", [(1, 1), (3, 2), (2, 4), (3, 8)])
def test_steps_are_t_single_steps_chained_through_dst(dtype, B, T):
    """The op equals T `gdn_conv_recurrent` calls, token t reading at src (t = 0) or dst[:, t-1] and
    writing at dst[:, t]; src and every entry outside src and dst stay as they were."""
    args, src, dst, conv0, rec0 = _case(B, T, dtype)
    o, conv, rec = _run(fused.gdn_conv_recurrent_steps, args, conv0, rec0, src, dst)
    assert o.shape == (B, T, HV, V) and o.dtype == dtype
    qkv, conv_w, a, b, A_log, dt_bias = args
    conv_l, rec_l = conv0.clone(), rec0.clone()
    for t in range(T):
        o_t = fused.gdn_conv_recurrent(qkv[:, t], conv_w, conv_l, a[:, t], b[:, t], A_log, dt_bias, rec_l,
                                       src if t == 0 else dst[:, t - 1], dst[:, t], **DIMS)
        assert torch.equal(o[:, t], o_t)
    assert _same(conv, conv_l) and _same(rec, rec_l)
    assert torch.equal(conv[src], conv0[src]) and torch.equal(rec[src], rec0[src])
    untouched = torch.ones(conv0.shape[0], dtype=torch.bool)
    untouched[src] = False
    untouched[dst.flatten()] = False
    assert conv[untouched].isnan().all() and rec[untouched].isnan().all()
    assert not conv[dst.flatten()].isnan().any() and not rec[dst.flatten()].isnan().any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_entry_t_holds_the_states_of_a_prefix_run(dtype):
    """dst[:, t] holds the states after t + 1 tokens: a run of only the first t + 1 tokens (what a round
    that accepts t drafts would have run) leaves the same states there and gives the same outputs. This
    is what lets a speculative round commit any accepted prefix by pointing at dst[:, t]."""
    B, T = 3, 5
    args, src, dst, conv0, rec0 = _case(B, T, dtype, seed=1)
    o, conv, rec = _run(fused.gdn_conv_recurrent_steps, args, conv0, rec0, src, dst)
    for t in range(T):
        o_p, conv_p, rec_p = _run(fused.gdn_conv_recurrent_steps, args, conv0, rec0, src, dst[:, :t + 1], T=t + 1)
        assert torch.equal(o[:, :t + 1], o_p)
        assert torch.equal(conv[dst[:, t]], conv_p[dst[:, t]]) and torch.equal(rec[dst[:, t]], rec_p[dst[:, t]])
        assert conv_p[dst[:, t + 1:].flatten()].isnan().all()     # nothing past the prefix is written


def test_steps_equal_the_chunk_form_over_the_t_tokens():
    """An independent formulation: the T tokens as one chunk (`chunk_causal_conv1d` then the T-token
    `fused_recurrent_gated_delta_rule`, states stepped from src) gives the same outputs, and its final
    states are those at dst[:, T-1]; the conv state after token t is the last three conv inputs."""
    B, T = 2, 6
    args, src, dst, conv0, rec0 = _case(B, T, seed=2)
    o, conv, rec = _run(fused.gdn_conv_recurrent_steps, args, conv0, rec0, src, dst)
    qkv, conv_w, a, b, A_log, dt_bias = args
    g, beta = gated_delta.gdn_gates(a, b, A_log, dt_bias)
    window = torch.cat([conv0[src], qkv.transpose(1, 2)], dim=2)            # [B, C, 3 + T]
    for t in range(T):
        assert torch.equal(conv[dst[:, t]], window[:, :, t + 1:t + 4])
    u, conv_last = ref_conv.chunk_causal_conv1d(qkv, conv_w.reshape(C, 4), conv0[src].clone())
    q, k, v = torch.split(u, (H * K, H * K, HV * V), dim=-1)
    o_c, rec_last = gated_delta.fused_recurrent_gated_delta_rule(
        q.reshape(B, T, H, K), k.reshape(B, T, H, K), v.reshape(B, T, HV, V), g, beta,
        initial_state=rec0[src].clone(), use_qk_l2norm_in_kernel=True)
    assert rel_rms(o, o_c) < 1e-6
    assert rel_rms(rec[dst[:, -1]], rec_last) < 1e-6 and torch.equal(conv[dst[:, -1]], conv_last)


def test_ops_argument_and_registration():
    """Both op sets carry the op; `ops` supplies the one-token step the loop calls."""
    from ninfer.ops.opset import reference_ops
    ops = reference_ops()
    assert ops.gdn_conv_recurrent_steps is fused.gdn_conv_recurrent_steps
    args, src, dst, conv0, rec0 = _case(2, 3, seed=3)
    calls = []

    class Counting:
        @staticmethod
        def gdn_conv_recurrent(*a, **kw):
            calls.append(1)
            return ops.gdn_conv_recurrent(*a, **kw)

    o, conv, rec = _run(fused.gdn_conv_recurrent_steps, args, conv0, rec0, src, dst, ops=Counting)
    o_r, conv_r, rec_r = _run(ops.gdn_conv_recurrent_steps, args, conv0, rec0, src, dst)
    assert len(calls) == 3 and torch.equal(o, o_r) and _same(rec, rec_r) and _same(conv, conv_r)


def test_fast_set_registers_the_op():
    pytest.importorskip("triton")
    from ninfer.ops.opset import fast_ops
    from ninfer.ops.triton import gdn_decode
    assert fast_ops().gdn_conv_recurrent_steps is gdn_decode.gdn_conv_recurrent_steps


@pytest.mark.parametrize("change,message", [
    (lambda q, a, s, d: (q[:, 0], a, s, d), "qkv must be"),
    (lambda q, a, s, d: (q[:, :0], a, s, d), "T >= 1"),
    (lambda q, a, s, d: (q, a[:, :1], s, d), "a and b must be"),
    (lambda q, a, s, d: (q, a, s[:1], d), "src must be"),
    (lambda q, a, s, d: (q, a, s, d[:, :1]), "dst [B, T]"),
])
def test_bad_shapes_are_refused(change, message):
    args, src, dst, conv0, rec0 = _case(2, 3, seed=4)
    qkv, conv_w, a, b, A_log, dt_bias = args
    qkv, a, src, dst = change(qkv, a, src, dst)
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        fused.gdn_conv_recurrent_steps(qkv, conv_w, conv0, a, b, A_log, dt_bias, rec0, src, dst, **DIMS)
