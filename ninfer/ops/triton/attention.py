"""Fast paged attention (CUDA).

    decode_paged_attention   Triton, split-K (flash-decoding): grid (row, kv head, split); each program
                             holds the REP = Hq / Hkv query heads of one kv head (GQA: K/V read once
                             per kv head), walks its token range of the row's context through the block
                             table with an online softmax and writes a partial (m, l, acc); a second
                             launch merges the splits. The split count is derived from the batch and
                             head counts (a host-known bound), never from context_lens, so there is no
                             host sync and the launch is CUDA-graph safe; each program derives its
                             token range from its row's context length on the device, so every split
                             has work whatever the block-table width (max_model_len) is. With `gate=`
                             the merge also applies the layer's output gate.
    chunk_paged_attention    per row: gather the paged prefix at Hkv heads, then PyTorch SDPA (cuDNN /
                             flash kernels, enable_gqa: K/V never repeated) with a bottom-right causal
                             mask; a row without a prefix runs at a padded length (`padded_causal_sdpa`:
                             cuDNN plans are per length); a chunk over a shorter prefix as that too, the
                             prefix's query rows zero (`front_padded_sdpa`), and a long chunk over a long
                             prefix through cuDNN twice, merged by log-sum-exp (`split_prefix_sdpa`). No [L, C]
                             matrix; host row bounds (no sync with CPU index tensors).
    prefix_attention_rows    Triton flash attention of one padded prompt stage over its paged prefix, the
                             stage's start and length read on the device (the prefill graphs' form): grid
                             (token block, kv head, split); a program holds BT tokens x the REP query heads
                             of one kv head as rows (GQA: K/V read once per kv head), walks its share of
                             the keys 0..start + its last real token with an online softmax and
                             the causal mask; the split count is host-known (block-table width, row count),
                             each split's range is sized on the device, and a merge launch combines them
                             when there is more than one.
Same arguments and results as `ninfer.ops.reference.attention` (the oracle). Shapes: q [B, Hq, D];
k_cache, v_cache [num_pages, page_size, Hkv, D]; block_table [B, max_pages]; context_lens [B].
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ninfer.ops.reference import attention as _ref
from ninfer.ops.reference import prefix_routing as _routing
from ninfer.ops.reference.attention import gather_kv_paged
from ninfer.ops.triton.common import device_index
from ninfer.ops.triton import pdl
from ninfer.ops.triton.common import fround
from ninfer.ops.triton.fused import sigmoid_gate_mul

__all__ = ["decode_paged_attention", "chunk_paged_attention", "prefix_attention_rows", "decode_splits",
           "split_prefix_sdpa", "front_padded_sdpa", "lower_right_sdpa"]

_TARGET_PROGRAMS = 264     # ~2 waves over 132 SMs


@triton.jit
def _split_tokens(ctx, nsplit, BN: tl.constexpr):
    """Tokens per split of a row with `ctx` tokens: the context spread evenly over the launched splits
    in BN-token blocks (0 for a context of 0, the graph capture's zeroed inputs: every split empty).
    Splits past ceil(ctx / per) are empty."""
    return tl.cdiv(tl.cdiv(ctx, nsplit), BN) * BN


@triton.jit
def _attend_block(qb, kc, vc, page, off, mn, allowed, m_i, l_i, acc, stride_kp, stride_ks, k_off, stride_vp,
                  stride_vs, v_off, o_d, scale, PREC: tl.constexpr, GUARD: tl.constexpr):
    """One online-softmax step of a paged attention program: the keys and values of one block (token
    rows `page`, `off`, live where mn), scores of the rows qb where `allowed`, folded into (m_i, l_i, acc).
    GUARD: a row may have no allowed key yet (m stays -inf; its p and alpha are 0, not NaN)."""
    kb = tl.load(kc + page[:, None] * stride_kp + off[:, None] * stride_ks + k_off + o_d[None, :],
                 mask=mn[:, None], other=0.0)
    s = tl.dot(qb, tl.trans(kb), input_precision=PREC) * scale
    s = tl.where(allowed, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    if GUARD:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_ref = m_new
    p = tl.exp(s - m_ref[:, None])
    alpha = tl.exp(m_i - m_ref)
    vb = tl.load(vc + page[:, None] * stride_vp + off[:, None] * stride_vs + v_off + o_d[None, :],
                 mask=mn[:, None], other=0.0)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(vb.dtype), vb, input_precision=PREC)
    return m_new, l_i, acc


# NOTE: stride_bt not specialised, as sbt0 in `fused._qk_norm_rope_kernel` (the eager table's width).
@triton.jit(do_not_specialize=["stride_bt"])
def _paged_decode_kernel(
    q, kc, vc, bt, lens, part_o, part_ml, scale, nsplit,
    stride_qb, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_bt,
    HQ: tl.constexpr, REP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
    BH: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr = "tf32",
    PDL: tl.constexpr = False,
):
    pdl.enter(PDL)
    i_b = tl.program_id(0)
    i_kv = tl.program_id(1)
    i_s = tl.program_id(2)
    ctx = tl.load(lens + i_b).to(tl.int32)
    per = _split_tokens(ctx, nsplit, BN)
    start = i_s * per
    end = tl.minimum(start + per, ctx)
    o_h = tl.arange(0, BH)
    mh = o_h < REP
    heads = i_kv * REP + o_h
    o_d = tl.arange(0, D)
    qb = tl.load(q + i_b * stride_qb + heads[:, None] * stride_qh + o_d[None, :], mask=mh[:, None], other=0.0)
    m_i = tl.full([BH], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BH], dtype=tl.float32)
    acc = tl.zeros([BH, D], dtype=tl.float32)
    for n0 in range(start, end, BN):
        pos = n0 + tl.arange(0, BN)
        mn = pos < end
        page = tl.load(bt + i_b.to(tl.int64) * stride_bt + pos // PAGE, mask=mn, other=0).to(tl.int64)
        m_i, l_i, acc = _attend_block(qb, kc, vc, page, pos % PAGE, mn, mn[None, :], m_i, l_i, acc, stride_kp,
                                      stride_ks, i_kv * stride_kh, stride_vp, stride_vs, i_kv * stride_vh, o_d,
                                      scale, PREC, False)
    if start < ctx:                      # the merge reads only the splits that hold tokens
        row = (i_b * HQ + heads) * nsplit + i_s                              # [BH]
        tl.store(part_o + row[:, None] * D + o_d[None, :], acc, mask=mh[:, None])
        tl.store(part_ml + row * 2, m_i, mask=mh)
        tl.store(part_ml + row * 2 + 1, l_i, mask=mh)


@triton.jit
def _combine_splits(part_o, part_ml, base, n, o_d, D: tl.constexpr, BS: tl.constexpr):
    """The split partials at rows base..base + n - 1 (part_o [*, D] acc, part_ml [*, 2] (m, l)) combined
    BS at a time with a running max: (acc [D], l). The first split must hold keys (finite m); a later
    empty one (m = -inf) weighs 0. With no live split l is 0 or NaN (the callers' guards)."""
    m_run = float("-inf")
    l_run = 0.0
    acc = tl.zeros([D], dtype=tl.float32)
    for s0 in range(0, n, BS):
        o_s = s0 + tl.arange(0, BS)
        ms = o_s < n
        row = base + o_s
        m = tl.load(part_ml + row * 2, mask=ms, other=float("-inf"))
        l = tl.load(part_ml + row * 2 + 1, mask=ms, other=0.0)
        part = tl.load(part_o + row[:, None] * D + o_d[None, :], mask=ms[:, None], other=0.0)
        m_new = tl.maximum(m_run, tl.max(m, 0))
        w = tl.where(m > float("-inf"), tl.exp(m - m_new), 0.0)
        alpha = tl.exp(m_run - m_new)
        l_run = l_run * alpha + tl.sum(l * w, 0)
        acc = acc * alpha + tl.sum(part * w[:, None], 0)
        m_run = m_new
    return acc, l_run


@triton.jit
def _merge_kernel(part_o, part_ml, lens, out, gate, nsplit, stride_ob, stride_oh, stride_gb, stride_gh,
                  HQ: tl.constexpr, D: tl.constexpr, BN: tl.constexpr, BS: tl.constexpr, HAS_GATE: tl.constexpr,
                  PDL: tl.constexpr = False):
    """out = the splits' partials of one (row, head) combined: BS splits at a time with a running max
    (a [BS, D] tile, whatever the split count), over the splits that hold tokens (same ranges as the
    split kernel); HAS_GATE: times sigmoid(gate), rounded as `sigmoid_gate_mul` after an o in out's dtype."""
    pdl.enter(PDL)
    i_b = tl.program_id(0)
    i_h = tl.program_id(1)
    ctx = tl.load(lens + i_b).to(tl.int32)
    # NOTE: the splits that hold tokens; max(., BN) only for a context of 0 (no division by zero), whose
    #       output is NaN (0 / 0, as before). The same guard in the split kernel's range would cost it
    #       many registers on sm_90; there ctx 0 gives an empty range without it.
    n_live = tl.cdiv(ctx, tl.maximum(_split_tokens(ctx, nsplit, BN), BN))
    o_d = tl.arange(0, D)
    acc, l_run = _combine_splits(part_o, part_ml, (i_b * HQ + i_h) * nsplit, n_live, o_d, D, BS)
    dt: tl.constexpr = out.dtype.element_ty
    o = acc / l_run
    if HAS_GATE:
        g = tl.load(gate + i_b.to(tl.int64) * stride_gb + i_h * stride_gh + o_d).to(tl.float32)
        o = fround(o, dt) * fround(1.0 / (1.0 + tl.exp(-g)), dt)
    tl.store(out + i_b * stride_ob + i_h * stride_oh + o_d, o.to(dt))


def decode_splits(batch: int, kv_heads: int, max_tokens: int, block_n: int = 64) -> int:
    """Number of splits of a decode launch over contexts of at most max_tokens: about _TARGET_PROGRAMS
    programs in all, at most one split per block_n tokens. (Each program sizes its own token range from
    its row's context length: with a range sized from max_tokens, a short context in a long block
    table ran on a few splits walking many blocks, e.g. one split per kv head at max_model_len 256k.)"""
    max_splits = max(1, triton.cdiv(max_tokens, block_n))
    return min(max_splits, max(1, triton.cdiv(_TARGET_PROGRAMS, batch * kv_heads)))


def decode_paged_attention(q, k_cache, v_cache, block_table, context_lens, scale=None, *, gate=None,
                           gate_stream=None):
    """Decode form; see `ninfer.ops.reference.attention.decode_paged_attention`. q [B, Hq, D] -> [B, Hq, D];
    gate [B, Hq, D] (rows and heads at any stride) or None; gate_stream: the stream writing the gate
    (joined before the merge kernel, which reads it: the split kernel runs beside the gate's writer)."""
    B, Hq, D = q.shape
    P, page, Hkv, _ = k_cache.shape
    rep = Hq // Hkv
    ok = (Hq % Hkv == 0 and D >= 16 and D & (D - 1) == 0 and D <= 256 and rep <= 64
          and k_cache.stride(3) == 1 and v_cache.stride(3) == 1 and q.stride(2) == 1)
    if not ok:
        return _ref.decode_paged_attention(q, k_cache, v_cache, block_table, context_lens, scale, gate=gate,
                                           gate_stream=gate_stream)
    fuse = (gate is not None and gate.shape == q.shape and gate.dtype == q.dtype
            and gate.stride(2) == 1)
    if scale is None:
        scale = D ** -0.5
    BN = 64 if D <= 128 else 32
    nsplit = decode_splits(B, Hkv, block_table.shape[1] * page, BN)
    bt = device_index(block_table, q.device)
    lens = device_index(context_lens, q.device)
    part_o = torch.empty(B * Hq * nsplit, D, dtype=torch.float32, device=q.device)
    part_ml = torch.empty(B * Hq * nsplit, 2, dtype=torch.float32, device=q.device)
    BH = max(16, triton.next_power_of_2(rep))
    _paged_decode_kernel[(B, Hkv, nsplit)](
        q, k_cache, v_cache, bt, lens, part_o, part_ml, float(scale), nsplit,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), bt.stride(0),
        HQ=Hq, REP=rep, D=D, PAGE=page, BH=BH, BN=BN,
        # NOTE: fp32 caches (tests, the fp32 Program) get IEEE fp32 products, not TF32; bf16 is unaffected.
        PREC="ieee" if q.dtype == torch.float32 else "tf32", num_warps=4, num_stages=2, **pdl.launch())
    out = torch.empty_like(q)
    # NOTE: the split count is a run-time argument (it follows the block-table width and the batch): the
    #       merge walks the live splits BS at a time. It loaded all of them as one [next_pow2(nsplit), D]
    #       fp32 tile before: 256 x 256 for the 35B-A3B at B=1 (132 splits), which spilled.
    g = gate if fuse else out
    if gate is not None and gate_stream is not None:
        torch.cuda.current_stream().wait_stream(gate_stream)
    _merge_kernel[(B, Hq)](part_o, part_ml, lens, out, g, nsplit, out.stride(0), out.stride(1), g.stride(0),
                           g.stride(1), HQ=Hq, D=D, BN=BN, BS=16, HAS_GATE=fuse, num_warps=4, **pdl.launch())
    return out if gate is None or fuse else sigmoid_gate_mul(out, gate)


def chunk_paged_attention(q, k_cache, v_cache, block_table, context_lens, cu_seqlens_q=None, scale=None):
    """Prompt-chunk form; see `ninfer.ops.reference.attention.chunk_paged_attention`. q [T_total, Hq, D].

    NOTE: context_lens and cu_seqlens_q are read on the host (the per-row loop); pass CPU tensors
    (the schedule does) to avoid a device-to-host sync per layer. K/V are gathered per row at Hkv
    heads and SDPA runs with enable_gqa (no repeat of K/V to Hq heads); a single row covering all
    of q returns SDPA's output itself when it is already [T, Hq, D] contiguous (no copy)."""
    scale = _ref.check_gqa(q, k_cache, scale)
    rows = _ref.chunk_rows(q, context_lens, cu_seqlens_q)
    out = None
    for b, (ctx, s, e) in enumerate(rows):
        L = e - s
        if L == 0:
            continue
        k = gather_kv_paged(k_cache, block_table[b], ctx)                                   # [C, Hkv, D]
        v = gather_kv_paged(v_cache, block_table[b], ctx)
        if k.dtype != q.dtype:
            k, v = k.to(q.dtype), v.to(q.dtype)
        ot = attend_over_prefix(q[s:e], k, v, scale)                                       # [L, Hq, D]
        if len(rows) == 1 and L == q.shape[0] and ot.is_contiguous():
            return ot
        if out is None:
            out = torch.empty_like(q)
        out[s:e] = ot
    return out if out is not None else torch.empty_like(q)


def attend_over_prefix(q, k, v, scale):
    """q [L, Hq, D] (a sequence's last L tokens) over its whole context k, v [C, Hkv, D] (GQA), causal
    -> [L, Hq, D], by the form `prefix_form` picks."""
    form = _routing.prefix_form(q.shape[1], q.shape[2], q.shape[0], k.shape[0], _cudnn_dtype(q))
    if form == "self":
        # NOTE: causal self-attention at a few padded lengths: cuDNN's plan per new length is paid in
        #       the serve warmup, not by requests (`padded_causal_sdpa`).
        return _ref.padded_causal_sdpa(q, k, v, scale)
    if form == "pad":
        return front_padded_sdpa(q, k, v, scale)
    if form == "split":
        return split_prefix_sdpa(q, k, v, scale)
    return lower_right_sdpa(q, k, v, scale)


def _cudnn_dtype(q) -> bool:
    return q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)


def lower_right_sdpa(q, k, v, scale):
    """q [L, Hq, D] (the context's last L tokens) over k, v [C, Hkv, D] with the lower-right causal mask,
    which PyTorch's CausalBias sends to flash-attention where it applies -> [L, Hq, D] (a transposed view
    of SDPA's output)."""
    from torch.nn.attention.bias import causal_lower_right
    mask = causal_lower_right(q.shape[0], k.shape[0])
    o = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                                       v.transpose(0, 1).unsqueeze(0), attn_mask=mask, scale=scale,
                                       enable_gqa=q.shape[1] != k.shape[1])
    return o[0].transpose(0, 1)


def front_padded_sdpa(q, k, v, scale):
    """q [L, Hq, D] (the context's last L tokens) over k, v [C, Hkv, D] as causal self-attention of the
    whole context with the C - L prefix tokens as zero query rows in front (their outputs dropped):
    `padded_causal_sdpa` at sdpa_rows(C) rows. Exact: a real row reads keys up to its own position."""
    P = k.shape[0] - q.shape[0]
    return _ref.padded_causal_sdpa(F.pad(q, (0, 0, 0, 0, P, 0)), k, v, scale)[P:]


def _cudnn_attention(q, k, v, scale, causal):
    """cuDNN SDPA of [N, H, D] tensors (GQA when k has fewer heads) -> (out [H, N, D], lse [H, N] fp32)."""
    hq, n = q.shape[1], q.shape[0]
    r = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
        None, True, 0.0, causal, False, scale=scale)
    return r[0][0], r[1].reshape(hq, n).float().contiguous()


@triton.jit
def _lse_merge_kernel(o1, l1, o2, l2, out, L, off2, s_o1h, s_o1n, s_o2h, s_o2n, n1, n2, s_on, s_oh,
                      D: tl.constexpr, BT: tl.constexpr):
    """out[t, h] = the softmax-weighted combination of two attentions of token t over disjoint key sets:
    o1[h, t] with log-sum-exp l1[h, t], and o2[h, off2 + t] with l2[h, off2 + t]."""
    i_t = tl.program_id(0)
    h = tl.program_id(1)
    t = i_t * BT + tl.arange(0, BT)
    m = t < L
    d = tl.arange(0, D)
    t2 = (t + off2).to(tl.int64)
    a = tl.load(l1 + h * n1 + t, mask=m, other=0.0)
    b = tl.load(l2 + h * n2 + t2, mask=m, other=0.0)
    mx = tl.maximum(a, b)
    wa = tl.exp(a - mx)
    wb = tl.exp(b - mx)
    inv = 1.0 / (wa + wb)
    x = tl.load(o1 + h * s_o1h + t.to(tl.int64)[:, None] * s_o1n + d[None, :], mask=m[:, None], other=0.0)
    y = tl.load(o2 + h * s_o2h + t2[:, None] * s_o2n + d[None, :], mask=m[:, None], other=0.0)
    r = x.to(tl.float32) * (wa * inv)[:, None] + y.to(tl.float32) * (wb * inv)[:, None]
    tl.store(out + t.to(tl.int64)[:, None] * s_on + h * s_oh + d[None, :], r.to(out.dtype.element_ty),
             mask=m[:, None])


def split_prefix_sdpa(q, k, v, scale):
    """One chunk's attention over its prefix through cuDNN: q [L, Hq, D] (the context's last L tokens),
    k, v [C, Hkv, D] -> [L, Hq, D]. With P = C - L prefix tokens and P0 = P rounded down to
    `prefix_routing.SPLIT_GRAIN`:
        call 1   the chunk against keys [0, P0), no mask, at sdpa_rows(L) query rows (zeros past L)
        call 2   causal self-attention over keys [P0, C): the P - P0 prefix tokens as zero query rows
                 in front of the chunk's (their outputs dropped), at sdpa_rows(C - P0) rows, zero K / V
                 past C (a real row reads keys <= its own position only, so never those)
    merged by log-sum-exp (`_lse_merge_kernel`). P0 == 0 is call 2 alone (`front_padded_sdpa`). So the
    cuDNN shapes are (sdpa_rows(L), a multiple of SPLIT_GRAIN) and sdpa_rows(length): few plans. A cuDNN
    failure warns once and falls back to flash (`chunk_paged_attention`'s lower-right mask)."""
    L, C = q.shape[0], k.shape[0]
    P0, rem = _routing.split_bounds(L, C)
    if P0 == 0:
        return front_padded_sdpa(q, k, v, scale)
    D = q.shape[2]
    try:
        if D & (D - 1) or D > 256:
            raise RuntimeError(f"head dim {D}: the merge kernel takes a power of 2 up to 256")
        n1, n2 = _ref.sdpa_rows(L), _ref.sdpa_rows(rem + L)
        o1, l1 = _cudnn_attention(F.pad(q, (0, 0, 0, 0, 0, n1 - L)), k[:P0], v[:P0], scale, False)
        tail = n2 - rem - L
        o2, l2 = _cudnn_attention(F.pad(q, (0, 0, 0, 0, rem, tail)), F.pad(k[P0:], (0, 0, 0, 0, 0, tail)),
                                  F.pad(v[P0:], (0, 0, 0, 0, 0, tail)), scale, True)
        if o1.stride(2) != 1:
            o1 = o1.contiguous()
        if o2.stride(2) != 1:
            o2 = o2.contiguous()
    except RuntimeError as err:
        import warnings
        warnings.warn(f"cuDNN attention over a prefix failed ({str(err).splitlines()[0][:200]}); "
                      "prompt chunks over a prefix run through flash-attention from now on", RuntimeWarning)
        _routing.cudnn_split_ok = False
        return lower_right_sdpa(q, k, v, scale)
    out = torch.empty_like(q)
    BT = 16
    _lse_merge_kernel[(triton.cdiv(L, BT), q.shape[1])](
        o1, l1, o2, l2, out, L, rem, o1.stride(0), o1.stride(1), o2.stride(0), o2.stride(1), n1, n2,
        out.stride(0), out.stride(1), D=D, BT=BT, num_warps=4)
    return out


# NOTE: why the serve warmup plans these: cuDNN builds an execution plan the first time it meets a call
#       shape (tens of ms; docs/performance.md, "Decision log"), and a prompt longer than one stage meets shapes the one-stage warmup lengths never do: its later stages'
#       front-padded lengths past the stage, and the split's (query rows, prefix keys) pairs. PyTorch keeps
#       these plans per thread: the calls must run on the Engine's worker (`EngineCore.call_on_worker`).
def warm_prefix_forms(shapes, heads: int, kv_heads: int, head_dim: int, dtype, device,
                      budget_s: float | None = None) -> int:
    """Run `attend_over_prefix` once per (L, C) of `shapes` (`prefix_routing.prefix_plan_shapes`) on random
    tensors, so that cuDNN builds the plans a long prompt would otherwise build on its first use. Stops
    starting new shapes once budget_s seconds have passed (None: no limit). Returns how many shapes ran."""
    if not shapes:
        return 0
    t0 = time.perf_counter()
    g = torch.Generator(device=device).manual_seed(0)
    Lmax = max(L for L, _ in shapes)
    Cmax = max(C for _, C in shapes)
    q = torch.randn(Lmax, heads, head_dim, device=device, dtype=dtype, generator=g)
    k = torch.randn(Cmax, kv_heads, head_dim, device=device, dtype=dtype, generator=g)
    v = torch.randn(Cmax, kv_heads, head_dim, device=device, dtype=dtype, generator=g)
    done = 0
    for L, C in shapes:
        if budget_s is not None and time.perf_counter() - t0 > budget_s:
            break
        attend_over_prefix(q[:L], k[:C], v[:C], head_dim ** -0.5)
        done += 1
    torch.cuda.synchronize(device)
    return done


@triton.jit
def _prefix_attn_kernel(
    q, kc, vc, bt, start_ptr, len_ptr, out, part_o, part_ml, scale, nsplit, N,
    stride_qn, stride_qh, stride_kp, stride_ks, stride_kh, stride_vp, stride_vs, stride_vh, stride_on, stride_oh,
    HQ: tl.constexpr, REP: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, BT: tl.constexpr,
    BH: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr, PREC: tl.constexpr = "tf32",
):
    """Rows r = (token t0 + r // BH, query head i_kv * REP + r % BH). Row of token t < L reads the keys
    0..start + t; a padding token (t >= L) those of token L - 1 (finite, then zeroed by the caller's
    contract: its output is written as 0). The program's key range is 0..start + min(t0 + BT, L) - 1
    (none for a block of padding only), cut into nsplit BN-aligned shares (SPLIT)."""
    i_t = tl.program_id(0)
    i_kv = tl.program_id(1)
    i_s = tl.program_id(2)
    start = tl.load(start_ptr).to(tl.int32)
    L = tl.load(len_ptr).to(tl.int32)
    t0 = i_t * BT
    BM: tl.constexpr = BT * BH
    r = tl.arange(0, BM)
    tok = t0 + r // BH
    hh = r % BH
    head = i_kv * REP + hh
    mrow = (hh < REP) & (tok < N)
    qpos = start + tl.minimum(tok, L - 1)
    hi = tl.where(t0 < L, start + tl.minimum(t0 + BT, L), 0)
    if SPLIT:
        per = _split_tokens(hi, nsplit, BN)
        lo = i_s * per
        hi = tl.minimum(lo + per, hi)
    else:
        lo = 0
    o_d = tl.arange(0, D)
    qb = tl.load(q + tok[:, None].to(tl.int64) * stride_qn + head[:, None] * stride_qh + o_d[None, :],
                 mask=mrow[:, None], other=0.0)
    m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BM], dtype=tl.float32)
    acc = tl.zeros([BM, D], dtype=tl.float32)
    for n0 in range(lo, hi, BN):
        pos = n0 + tl.arange(0, BN)
        mn = pos < hi
        page = tl.load(bt + pos // PAGE, mask=mn, other=0).to(tl.int64)
        # NOTE: a row's first keys may all lie past its position (a block's first tokens): GUARD.
        m_i, l_i, acc = _attend_block(qb, kc, vc, page, pos % PAGE, mn, mn[None, :] & (pos[None, :] <= qpos[:, None]),
                                      m_i, l_i, acc, stride_kp, stride_ks, i_kv * stride_kh, stride_vp, stride_vs,
                                      i_kv * stride_vh, o_d, scale, PREC, True)
    if SPLIT:
        row = (tok.to(tl.int64) * HQ + head) * nsplit + i_s
        tl.store(part_o + row[:, None] * D + o_d[None, :], acc, mask=mrow[:, None])
        tl.store(part_ml + row * 2, m_i, mask=mrow)
        tl.store(part_ml + row * 2 + 1, l_i, mask=mrow)
    else:
        o = tl.where((l_i > 0.0)[:, None], acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None], 0.0)
        o = tl.where((tok < L)[:, None], o, 0.0)
        tl.store(out + tok[:, None].to(tl.int64) * stride_on + head[:, None] * stride_oh + o_d[None, :],
                 o.to(out.dtype.element_ty), mask=mrow[:, None])


@triton.jit
def _prefix_merge_kernel(part_o, part_ml, len_ptr, out, nsplit, stride_on, stride_oh,
                         HQ: tl.constexpr, D: tl.constexpr, BS: tl.constexpr):
    """out[t, h] = the nsplit partials of (t, h) combined; a padding token (t >= L) gets 0."""
    i_t = tl.program_id(0)
    i_h = tl.program_id(1)
    L = tl.load(len_ptr).to(tl.int32)
    o_d = tl.arange(0, D)
    # NOTE: a real token's first split holds keys (the splits fill from key 0); a padding token's hold none
    #       (l is then NaN, and the token gets 0).
    acc, l_run = _combine_splits(part_o, part_ml, (i_t.to(tl.int64) * HQ + i_h) * nsplit, nsplit, o_d, D, BS)
    o = tl.where((l_run > 0.0) & (i_t < L), acc / tl.where(l_run > 0.0, l_run, 1.0), 0.0)
    tl.store(out + i_t.to(tl.int64) * stride_on + i_h * stride_oh + o_d, o.to(out.dtype.element_ty))


def prefix_splits(N: int, kv_heads: int, max_keys: int, block_t: int, block_n: int) -> int:
    """Splits of a prefix_attention_rows launch: about _TARGET_PROGRAMS programs over the token blocks
    and kv heads, at most one per block_n keys of the block table and at most 128 (the partials are
    N x Hq x splits x D fp32)."""
    progs = triton.cdiv(N, block_t) * kv_heads
    return max(1, min(128, triton.cdiv(max_keys, block_n), triton.cdiv(_TARGET_PROGRAMS, progs)))


def prefix_attention_rows(q, k_cache, v_cache, block_table, start, length, scale=None, *, block_t=None,
                          block_n=None, num_warps=None, num_stages=None, splits=None):
    """Prefill-graph form; see `ninfer.ops.reference.attention.prefix_attention_rows`. q [N, Hq, D]; start and
    length [1] device tensors. No host read, no shape from them: capturable once, replayed at any
    start and length (within the block table's W pages). block_t (tokens a program; its rows are
    block_t x next_pow2(Hq / Hkv)) / block_n / num_warps / num_stages / splits: tile overrides for a
    benchmark."""
    N, Hq, D = q.shape
    _, page, Hkv, _ = k_cache.shape
    rep = Hq // Hkv
    ok = (Hq % Hkv == 0 and D >= 16 and D & (D - 1) == 0 and D <= 256 and rep <= 64
          and k_cache.stride(3) == 1 and v_cache.stride(3) == 1 and q.stride(2) == 1)
    if not ok:
        return _ref.prefix_attention_rows(q, k_cache, v_cache, block_table, start, length, scale)
    scale = _ref.check_gqa(q, k_cache, scale)
    BH = triton.next_power_of_2(rep)
    # NOTE: D 256 (both models): 16 tokens x 8 heads = 128 rows a program with 64-key blocks, and 8 tokens
    #       for a stage of at most 8 rows (docs/performance.md, "Decision log"); the smaller heads (the tiny
    #       models) keep the general tiles. fp32 (tests, the fp32 Program) keeps the general tiles too: the
    #       128-row tiles fail its GPU tests at D 256 with more than 8 rows.
    if D > 128 and q.element_size() == 2:
        BT = block_t or max(1, (128 if N > 8 else 64) // BH)
        BN = block_n or 64
    else:
        BT = block_t or max(1, 64 // BH)
        BN = block_n or (64 if D <= 128 else 32)
    bt = device_index(block_table, q.device)[0]
    st = device_index(start, q.device)
    ln = device_index(length, q.device)
    nsplit = splits or prefix_splits(N, Hkv, bt.numel() * page, BT, BN)
    out = torch.empty_like(q)
    split = nsplit > 1
    if split:
        part_o = torch.empty(N * Hq * nsplit, D, dtype=torch.float32, device=q.device)
        part_ml = torch.empty(N * Hq * nsplit, 2, dtype=torch.float32, device=q.device)
    else:
        part_o = part_ml = out
    _prefix_attn_kernel[(triton.cdiv(N, BT), Hkv, nsplit)](
        q, k_cache, v_cache, bt, st, ln, out, part_o, part_ml, float(scale), nsplit, N,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0), out.stride(1),
        HQ=Hq, REP=rep, D=D, PAGE=page, BT=BT, BH=BH, BN=BN, SPLIT=split,
        PREC="ieee" if q.dtype == torch.float32 else "tf32", num_warps=num_warps or (4 if D <= 128 else 8),
        num_stages=num_stages or 2)
    if split:
        _prefix_merge_kernel[(N, Hq)](part_o, part_ml, ln, out, nsplit, out.stride(0), out.stride(1),
                                      HQ=Hq, D=D, BS=16, num_warps=4)
    return out
