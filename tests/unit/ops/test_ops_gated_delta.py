import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule as _hf_chunk
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule as _hf_recurrent

from ninfer.ops.reference.gated_delta import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, gdn_gates
from support.ops_util import DEVICES, ODD_LENGTHS
from support.numerics import rel_rms

HK, HV, DK, DV = 2, 4, 32, 16


# NOTE: HF before 5.2x expects key heads already repeated to the value heads; repeating here works for both.
def torch_chunk_gated_delta_rule(q, k, *args, **kw):
    return _hf_chunk(q.repeat_interleave(HV // HK, 2), k.repeat_interleave(HV // HK, 2), *args, **kw)


def torch_recurrent_gated_delta_rule(q, k, *args, **kw):
    return _hf_recurrent(q.repeat_interleave(HV // HK, 2), k.repeat_interleave(HV // HK, 2), *args, **kw)


def _inputs(T, B=1, seed=0, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, HK, DK, generator=g)
    k = torch.randn(B, T, HK, DK, generator=g)
    v = torch.randn(B, T, HV, DV, generator=g)
    a = torch.randn(B, T, HV, generator=g)
    b = torch.randn(B, T, HV, generator=g)
    A_log = torch.randn(HV, generator=g) * 0.5 - 1
    dt_bias = torch.randn(HV, generator=g) * 0.5
    gg, beta = gdn_gates(a, b, A_log, dt_bias)
    S0 = torch.randn(B, HV, DK, DV, generator=g) * 0.5
    cast = lambda x: x.to(device, dtype)  # noqa: E731
    return cast(q), cast(k), cast(v), gg.to(device), cast(beta), S0.to(device)


def _explicit(q, k, v, g, beta, S0):
    """float64 per-head loop of the spec recurrence (q/k L2-normalised, q scaled by DK^-1/2)."""
    q, k, v, g, beta, S = (x.double().cpu() for x in (q, k, v, g, beta, S0))
    q = q / q.norm(dim=-1, keepdim=True) * DK ** -0.5
    k = k / k.norm(dim=-1, keepdim=True)
    rep = HV // HK
    B, T = q.shape[:2]
    o = torch.zeros(B, T, HV, DV, dtype=torch.float64)
    S = S.clone()
    for bb in range(B):
        for h in range(HV):
            for t in range(T):
                kt, qt = k[bb, t, h // rep], q[bb, t, h // rep]
                S[bb, h] *= g[bb, t, h].exp()
                S[bb, h] += torch.outer(kt, (v[bb, t, h] - kt @ S[bb, h]) * beta[bb, t, h])
                o[bb, t, h] = qt @ S[bb, h]
    return o, S


def test_gdn_gates():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    A_log, dt = torch.randn(4), torch.randn(4)
    g, beta = gdn_gates(a.bfloat16(), b, A_log, dt)
    assert g.dtype == torch.float32 and (g <= 0).all()
    ref = -A_log.exp() * torch.nn.functional.softplus(a.bfloat16().float() + dt)
    torch.testing.assert_close(g, ref)
    torch.testing.assert_close(beta, torch.sigmoid(b))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T", ODD_LENGTHS)
def test_chunk_matches_hf_and_recurrent(device, T):
    q, k, v, g, beta, S0 = _inputs(T, B=2, seed=T, device=device)
    kw = dict(initial_state=S0, use_qk_l2norm_in_kernel=True)
    o, S = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    o_hf, S_hf = torch_chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, **kw)
    assert o.shape == (2, T, HV, DV) and S.dtype == torch.float32
    assert rel_rms(o, o_hf) < 1e-6 and rel_rms(S, S_hf) < 1e-6
    o_r, S_r = fused_recurrent_gated_delta_rule(q, k, v, g, beta, **kw)
    o_rhf, S_rhf = torch_recurrent_gated_delta_rule(q, k, v, g, beta, output_final_state=True, **kw)
    assert rel_rms(o_r, o_rhf) < 1e-6 and rel_rms(S_r, S_rhf) < 1e-6
    assert rel_rms(o, o_r) < 1e-5 and rel_rms(S, S_r) < 1e-5
    if T <= 65:
        o_x, S_x = _explicit(q[:1], k[:1], v[:1], g[:1], beta[:1], S0[:1])
        assert rel_rms(o[:1], o_x) < 1e-5 and rel_rms(S[:1], S_x) < 1e-5


def test_zero_initial_state_and_no_state_output():
    q, k, v, g, beta, _ = _inputs(65, seed=7)
    o, S = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
    o_hf, S_hf = torch_chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True,
                                              output_final_state=True)
    assert rel_rms(o, o_hf) < 1e-6 and rel_rms(S, S_hf) < 1e-6
    o2, none = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, output_final_state=False)
    assert none is None and torch.equal(o, o2)


def test_explicit_scale_without_l2norm():
    q, k, v, g, beta, S0 = _inputs(20, seed=8)
    o, S = fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S0, scale=0.3)
    o_hf, S_hf = torch_recurrent_gated_delta_rule(q * (0.3 * DK ** 0.5), k, v, g, beta, initial_state=S0,
                                                  output_final_state=True)
    assert rel_rms(o, o_hf) < 1e-6 and rel_rms(S, S_hf) < 1e-6


def test_split_prefill_then_decode_equals_one_shot():
    q, k, v, g, beta, S0 = _inputs(130, seed=9)
    kw = dict(use_qk_l2norm_in_kernel=True)
    o_full, S_full = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=S0, **kw)
    o1, S1 = chunk_gated_delta_rule(q[:, :70], k[:, :70], v[:, :70], g[:, :70], beta[:, :70],
                                    initial_state=S0, **kw)
    o2, S2 = chunk_gated_delta_rule(q[:, 70:128], k[:, 70:128], v[:, 70:128], g[:, 70:128], beta[:, 70:128],
                                    initial_state=S1, **kw)
    outs, S = [o1, o2], S2
    for t in (128, 129):
        o_t, S = fused_recurrent_gated_delta_rule(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1],
                                                  beta[:, t:t + 1], initial_state=S, **kw)
        outs.append(o_t)
    assert rel_rms(torch.cat(outs, 1), o_full) < 1e-5 and rel_rms(S, S_full) < 1e-5


@pytest.mark.parametrize("fn", [chunk_gated_delta_rule, fused_recurrent_gated_delta_rule])
def test_varlen_slots_match_per_sequence_loop(fn):
    lens = [3, 1, 64, 65, 0, 7]
    T = sum(lens)
    q, k, v, g, beta, _ = _inputs(T, seed=10)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist())
    N = len(lens)
    S0 = torch.randn(N, HV, DK, DV)
    pool = torch.full((9, HV, DK, DV), float("nan"))
    slots = torch.tensor([8, 1, 4, 0, 6, 3])
    pool[slots] = S0
    o, S = fn(q, k, v, g, beta, initial_state=pool, state_indices=slots, cu_seqlens=cu,
              use_qk_l2norm_in_kernel=True)
    assert not torch.isnan(o).any()
    for i in range(N):
        s, e = cu[i].item(), cu[i + 1].item()
        o_i, S_i = fn(q[:, s:e], k[:, s:e], v[:, s:e], g[:, s:e], beta[:, s:e], initial_state=S0[i:i + 1],
                      use_qk_l2norm_in_kernel=True)
        torch.testing.assert_close(o[:, s:e], o_i, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(pool[slots[i]], S_i[0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(S[i], S_i[0], rtol=1e-6, atol=1e-6)
    assert torch.isnan(pool[[2, 5, 7]]).all()
    assert torch.equal(pool[slots[4]], S0[4])  # empty sequence keeps its state


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_inputs(device):
    q, k, v, g, beta, S0 = _inputs(65, B=2, seed=11, device=device, dtype=torch.bfloat16)
    kw = dict(initial_state=S0, use_qk_l2norm_in_kernel=True)
    o, S = chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    o_hf, S_hf = torch_chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, **kw)
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    assert rel_rms(o, o_hf) < 1e-2 and rel_rms(S, S_hf) < 1e-5


@pytest.mark.parametrize("T", [1, 63, 65])
def test_zero_padding_tokens_change_no_output_and_no_state(T):
    """What the fast op's graphed prefill stages rely on (`ninfer.ops.triton.gated_delta`, padded to a
    bucket): tokens appended with q = k = v = 0, g = 0, beta = 0 leave the real tokens' outputs and the
    final state as they were (no decay, no update; causal, so no real token reads them)."""
    q, k, v, g, beta, S0 = _inputs(T, seed=T)
    pad = 128 - T
    zpad = lambda x: torch.cat([x, torch.zeros(x.shape[0], pad, *x.shape[2:], dtype=x.dtype)], 1)  # noqa: E731
    o, S = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=S0, use_qk_l2norm_in_kernel=True)
    op, Sp = chunk_gated_delta_rule(zpad(q), zpad(k), zpad(v), zpad(g), zpad(beta), initial_state=S0,
                                    use_qk_l2norm_in_kernel=True)
    assert op.shape[1] == 128
    assert rel_rms(op[:, :T], o) < 1e-6 and rel_rms(Sp, S) < 1e-6
