import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import causal_conv1d_fn, causal_conv1d_update as hf_update

from ninfer.ops.reference.conv import causal_conv1d_update, chunk_causal_conv1d
from support.ops_util import DEVICES, ODD_LENGTHS
from support.numerics import rel_rms

C, K = 48, 4


def _data(T, B=1, seed=0, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, T, C, generator=g).to(device, dtype)
    w = (torch.randn(C, K, generator=g) * 0.5).to(device, dtype)
    return x, w


def _explicit(x, w, prev):
    """float64 loop: y[t,c] = silu(sum_j w[c,j] * x[t-(K-1)+j, c]) with prev inputs before t=0."""
    full = torch.cat([prev.double().T, x.double()], 0)  # [K-1+T, C]
    y = torch.stack([(full[t:t + K].T * w.double()).sum(-1) for t in range(x.shape[0])])
    return torch.nn.functional.silu(y), full[-(K - 1):].T


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T", ODD_LENGTHS)
def test_chunk_matches_hf_and_explicit(device, T):
    x, w = _data(T, B=2, device=device)
    y, st = chunk_causal_conv1d(x, w)
    ref = causal_conv1d_fn(x.transpose(1, 2), w, None, activation="silu").transpose(1, 2)
    assert rel_rms(y, ref) < 1e-6
    for b in range(2):
        e_y, e_st = _explicit(x[b].cpu(), w.cpu(), torch.zeros(C, K - 1))
        assert rel_rms(y[b], e_y) < 1e-6
        torch.testing.assert_close(st[b].double().cpu(), e_st)


def test_split_prompt_and_decode_equal_one_shot():
    x, w = _data(70, seed=1)
    y_full, st_full = chunk_causal_conv1d(x, w)
    for split in [1, 2, 3, 40, 69]:
        y1, s1 = chunk_causal_conv1d(x[:, :split], w)
        y2, s2 = chunk_causal_conv1d(x[:, split:], w, s1)
        torch.testing.assert_close(torch.cat([y1, y2], 1), y_full, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(s2, st_full)
    # decode step by step with HF's update as a cross-check of the state format
    y0, s = chunk_causal_conv1d(x[:, :10], w)
    hf_state = torch.cat([torch.zeros(1, C, 1), s], -1)  # HF keeps K columns
    for t in range(10, 20):
        y_t, s = causal_conv1d_update(x[:, t], w, s)
        ref = hf_update(x[:, t:t + 1].transpose(1, 2), hf_state, w, None, "silu")[:, :, 0]
        torch.testing.assert_close(y_t, ref, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(y_t, y_full[:, t], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(s, hf_state[:, :, 1:])


def test_varlen_and_slots_match_per_sequence_loop():
    lens = [5, 1, 64, 2, 65]
    x, w = _data(sum(lens), seed=2)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist())
    prev = torch.randn(len(lens), C, K - 1)
    pool = torch.full((8, C, K - 1), float("nan"))
    slots = torch.tensor([6, 0, 3, 7, 2])
    pool[slots] = prev
    y_p = torch.full_like(x, float("nan"))
    y, st = chunk_causal_conv1d(x, w, pool, cu_seqlens=cu, state_indices=slots)
    y_p.copy_(y)
    for i, (s, e) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        y_i, st_i = chunk_causal_conv1d(x[:, s:e], w, prev[i:i + 1])
        torch.testing.assert_close(y_p[:, s:e], y_i, rtol=0, atol=0)
        torch.testing.assert_close(pool[slots[i]], st_i[0])
        torch.testing.assert_close(st[i], st_i[0])
    untouched = [i for i in range(8) if i not in slots.tolist()]
    assert torch.isnan(pool[untouched]).all()
    assert not torch.isnan(y).any()
    # dense state is never modified
    prev_copy = prev.clone()
    chunk_causal_conv1d(x, w, prev, cu_seqlens=cu)
    torch.testing.assert_close(prev, prev_copy)


def test_update_slots_in_place_and_no_activation():
    x, w = _data(1, B=3, seed=3)
    pool = torch.randn(5, C, K - 1)
    before = pool.clone()
    idx = torch.tensor([4, 1, 2])
    y, new = causal_conv1d_update(x[:, 0], w, pool, state_indices=idx, activation=None)
    y_d, new_d = causal_conv1d_update(x[:, 0], w, before[idx], activation=None)
    torch.testing.assert_close(y, y_d)
    torch.testing.assert_close(pool[idx], new_d)
    torch.testing.assert_close(pool[[0, 3]], before[[0, 3]])
    window = torch.cat([before[idx], x[:, 0, :, None]], -1)
    torch.testing.assert_close(y, (window * w).sum(-1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_close_to_fp32(device):
    x, w = _data(65, B=2, device=device, dtype=torch.bfloat16)
    state = torch.randn(2, C, K - 1).to(device, torch.bfloat16)
    y, st = chunk_causal_conv1d(x, w, state)
    y32, st32 = chunk_causal_conv1d(x.float(), w.float(), state.float())
    assert y.dtype == torch.bfloat16 and st.dtype == torch.bfloat16
    assert rel_rms(y, y32) < 1e-2
    torch.testing.assert_close(st.float(), st32)


def test_chunk_split_returns_contiguous_channel_slices():
    """split=(w0, w1, w2) returns y's channel slices as contiguous tensors (the GDN schedule's q, k, v);
    the state is the same as without it; widths that do not sum to C are refused."""
    torch.manual_seed(0)
    x = torch.randn(1, 9, 10)
    w = torch.randn(10, 4)
    y, st = chunk_causal_conv1d(x, w)
    parts, st2 = chunk_causal_conv1d(x, w, split=(3, 3, 4))
    assert [p.shape[-1] for p in parts] == [3, 3, 4] and all(p.is_contiguous() for p in parts)
    torch.testing.assert_close(torch.cat(parts, -1), y, rtol=0, atol=0)
    torch.testing.assert_close(st2, st, rtol=0, atol=0)
    with pytest.raises(ValueError, match="split"):
        chunk_causal_conv1d(x, w, split=(3, 3))
