import pytest
import torch

from ninfer.ops.reference.attention import (
    attention_output_gate,
    chunk_paged_attention,
    decode_paged_attention,
    gather_kv_paged,
    kv_slot_mapping,
    write_kv_paged,
)
from support.ops_util import DEVICES, ODD_LENGTHS, PREFIX_ROWS, dense_causal, prefix_rows_case
from support.numerics import rel_rms

HQ, HKV, D, PS = 6, 2, 32, 16


def _pool(num_pages, device="cpu", dtype=torch.float32):
    nan = lambda: torch.full((num_pages, PS, HKV, D), float("nan"), device=device, dtype=dtype)  # noqa: E731
    return nan(), nan()


def _table(rows_pages, g, num_pages, max_pages):
    """Random non-contiguous distinct page ids for each row."""
    perm = torch.randperm(num_pages, generator=g)
    table = torch.full((len(rows_pages), max_pages), -1, dtype=torch.int32)
    used = 0
    for r, n in enumerate(rows_pages):
        table[r, :n] = perm[used:used + n].int()
        used += n
    return table


def _dense_ref(q, k, v, scale=D ** -0.5):
    return dense_causal(q, k, v, scale, HQ // HKV)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("T", ODD_LENGTHS)
@pytest.mark.parametrize("prefix", [0, 37])
def test_prompt_chunk_vs_dense(device, T, prefix):
    g = torch.Generator().manual_seed(T * 100 + prefix)
    C = prefix + T
    k = torch.randn(C, HKV, D, generator=g)
    v = torch.randn(C, HKV, D, generator=g)
    q = torch.randn(T, HQ, D, generator=g)
    n_pages = (C + PS - 1) // PS
    num_pages = n_pages + 5
    table = _table([n_pages], g, num_pages, n_pages + 2).to(device)
    kc, vc = _pool(num_pages, device)
    if prefix:  # the prefix was written by an earlier step
        write_kv_paged(kc, vc, k[:prefix].to(device), v[:prefix].to(device), table, torch.arange(prefix))
    write_kv_paged(kc, vc, k[prefix:].to(device), v[prefix:].to(device), table, torch.arange(prefix, C))
    o = chunk_paged_attention(q.to(device), kc, vc, table, torch.tensor([C]))
    assert o.shape == (T, HQ, D) and not torch.isnan(o).any()
    assert rel_rms(o, _dense_ref(q, k, v)) < 1e-6


def test_varlen_batch_equals_per_row_loop_and_decode():
    g = torch.Generator().manual_seed(5)
    prefixes, news = [0, 63, 17, 500], [65, 1, 64, 3]
    ctx = [p + n for p, n in zip(prefixes, news)]
    pages = [(c + PS - 1) // PS for c in ctx]
    num_pages = sum(pages) + 3
    table = _table(pages, g, num_pages, max(pages))
    kc, vc = _pool(num_pages)
    ks = [torch.randn(c, HKV, D, generator=g) for c in ctx]
    vs = [torch.randn(c, HKV, D, generator=g) for c in ctx]
    # one packed write of everything (rows interleaved order does not matter)
    rows = torch.cat([torch.full((c,), r) for r, c in enumerate(ctx)])
    pos = torch.cat([torch.arange(c) for c in ctx])
    write_kv_paged(kc, vc, torch.cat(ks), torch.cat(vs), table, pos, rows)
    qs = [torch.randn(n, HQ, D, generator=g) for n in news]
    cu = torch.tensor([0] + torch.tensor(news).cumsum(0).tolist())
    o = chunk_paged_attention(torch.cat(qs), kc, vc, table, torch.tensor(ctx), cu)
    for r in range(4):
        o_r = chunk_paged_attention(qs[r], kc, vc, table[r:r + 1], torch.tensor([ctx[r]]))
        torch.testing.assert_close(o[cu[r]:cu[r + 1]], o_r, rtol=0, atol=0)
        assert rel_rms(o_r, _dense_ref(qs[r], ks[r], vs[r])) < 1e-6
    # decode: the last token of every row
    q_dec = torch.stack([qs[r][-1] for r in range(4)])
    o_dec = decode_paged_attention(q_dec, kc, vc, table.long(), torch.tensor(ctx))
    for r in range(4):
        torch.testing.assert_close(o_dec[r], o[cu[r + 1] - 1], rtol=1e-6, atol=1e-6)


def test_write_kv_paged_places_tokens():
    g = torch.Generator().manual_seed(6)
    table = torch.tensor([[3, 0, 5], [1, 4, 2]])
    kc, vc = _pool(6)
    k = torch.randn(5, HKV, D, generator=g)
    pos, rows = torch.tensor([0, 15, 16, 33, 17]), torch.tensor([0, 0, 0, 1, 1])
    write_kv_paged(kc, vc, k, -k, table, pos, rows)
    torch.testing.assert_close(kv_slot_mapping(table, pos, rows, PS), torch.tensor([48, 63, 0, 33, 65]))
    for i, (page, off) in enumerate([(3, 0), (3, 15), (0, 0), (2, 1), (4, 1)]):
        assert torch.equal(kc[page, off], k[i]) and torch.equal(vc[page, off], -k[i])
    assert torch.isnan(kc).flatten(0, 1).all(-1).all(-1).sum() == 6 * PS - 5
    torch.testing.assert_close(gather_kv_paged(kc, table[0], 17)[[0, 15, 16]], k[:3])


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_pool(device):
    g = torch.Generator().manual_seed(7)
    C, T = 130, 65
    k, v = torch.randn(C, HKV, D, generator=g), torch.randn(C, HKV, D, generator=g)
    q = torch.randn(T, HQ, D, generator=g)
    table = _table([9], g, 12, 9).to(device)
    kc, vc = _pool(12, device, torch.bfloat16)
    write_kv_paged(kc, vc, k.to(device), v.to(device), table, torch.arange(C))
    o = chunk_paged_attention(q.to(device, torch.bfloat16), kc, vc, table, torch.tensor([C]))
    assert o.dtype == torch.bfloat16
    assert rel_rms(o, _dense_ref(q, k, v)) < 2e-2


def test_against_sdpa_and_gate():
    g = torch.Generator().manual_seed(8)
    T = 63
    k, v = torch.randn(T, HKV, D, generator=g), torch.randn(T, HKV, D, generator=g)
    q = torch.randn(T, HQ, D, generator=g)
    table = _table([4], g, 4, 4)
    kc, vc = _pool(4)
    write_kv_paged(kc, vc, k, v, table, torch.arange(T))
    o = chunk_paged_attention(q, kc, vc, table, torch.tensor([T]))
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
    ).transpose(0, 1)
    assert rel_rms(o, ref) < 1e-6
    gate = torch.randn(T, HQ * D, generator=g)
    torch.testing.assert_close(attention_output_gate(o.flatten(1), gate), o.flatten(1) / (1 + (-gate).exp()))


def test_sdpa_rows_buckets():
    """`sdpa_rows`: at least L, a fixed point on its own values, never decreasing; 16 lengths up to 8192
    rows and 4 more per doubling; past 1024 rows at most a quarter more."""
    from ninfer.ops.reference.attention import sdpa_rows
    got = [sdpa_rows(L) for L in range(1, 32769)]
    assert all(r >= L for L, r in zip(range(1, 32769), got))
    assert all(a <= b for a, b in zip(got, got[1:]))
    assert all(sdpa_rows(r) == r for r in set(got))
    assert len(set(got[:8192])) == 16 and len(set(got)) == 16 + 2 * 4
    assert all(r <= 1.25 * L for L, r in zip(range(1025, 32769), got[1024:]))
    assert (sdpa_rows(1), sdpa_rows(256), sdpa_rows(257), sdpa_rows(2049), sdpa_rows(8192)) == (256, 256, 512, 2560, 8192)
    with pytest.raises(ValueError, match="L must be >= 1"):
        sdpa_rows(0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("L", ODD_LENGTHS + [255, 256, 257])
@pytest.mark.parametrize("hkv", [HKV, HQ])
def test_padded_causal_sdpa_vs_dense(device, L, hkv):
    """`padded_causal_sdpa` (zero rows appended up to `sdpa_rows(L)`) == float64 causal attention of the
    L rows (GQA and one kv head per query head); nothing of the padding reaches the output."""
    from ninfer.ops.reference.attention import padded_causal_sdpa
    g = torch.Generator().manual_seed(L + hkv)
    q = torch.randn(L, HQ, D, generator=g).to(device)
    k = torch.randn(L, hkv, D, generator=g).to(device)
    v = torch.randn(L, hkv, D, generator=g).to(device)
    o = padded_causal_sdpa(q, k, v, D ** -0.5)
    assert o.shape == (L, HQ, D) and o.dtype == q.dtype and torch.isfinite(o).all()
    rep = HQ // hkv
    kd, vd = k.double().cpu().repeat_interleave(rep, 1), v.double().cpu().repeat_interleave(rep, 1)
    s = torch.einsum("lhd,chd->hlc", q.double().cpu(), kd) * D ** -0.5
    s = s.masked_fill(torch.arange(L)[None, :] > torch.arange(L)[:, None], float("-inf"))
    want = torch.einsum("hlc,chd->lhd", torch.softmax(s, -1), vd)
    assert rel_rms(o.double().cpu(), want) < 1e-5



@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("start,L,N", PREFIX_ROWS)
def test_prefix_attention_rows_vs_dense(device, start, L, N):
    """`prefix_attention_rows` (the prefill graphs' attention, start and length as tensors): its first L rows
    == float64 causal attention over the prefix and the stage; the padding rows are zero; pages past the
    context and the spare page's unwritten slots (NaN) are never read into a real row."""
    from ninfer.ops.reference.attention import prefix_attention_rows
    args, want = prefix_rows_case(start, L, N, device)
    o = prefix_attention_rows(*args)
    assert o.shape == (N, HQ, D) and torch.isfinite(o).all()
    assert rel_rms(o[:L].double().cpu(), want) < 1e-5
    assert (o[L:] == 0).all()


