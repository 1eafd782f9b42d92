"""Paged causal attention with GQA (the full-attention layers), reference form.

KV pool (one per attention layer): k_cache, v_cache [num_pages, page_size, Hkv, D]. A sequence's
token at logical position p lives in page block_table[row, p // page_size], offset p % page_size.
Order of a step: write the new tokens' K/V with `write_kv_paged` (or `qk_norm_rope_write_kv`, the
layer's q/k norm + rotary and the write as one op), then call the attention with context_lens that
include the new tokens. Entries beyond a row's context length are never read (pages may hold
garbage or NaN).

Math: o = softmax(q kᵀ · scale + causal mask) v with scale = D**-0.5; q head h reads kv head
h // (Hq // Hkv). Scores, softmax and the weighted sum are all fp32; output in q.dtype.
The output gate of the layer (o · sigmoid(gate)) is the op `attention_output_gate`; the decode form
takes it too (`gate=`), so that the fast set applies it in the attention's last kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ninfer.ops.reference.fused import qk_norm_rope

__all__ = [
    "kv_slot_mapping",
    "write_kv_paged",
    "qk_norm_rope_write_kv",
    "gather_kv_paged",
    "chunk_paged_attention",
    "prefix_attention_rows",
    "decode_paged_attention",
    "attention_output_gate",
]


def kv_slot_mapping(
    block_table: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor | None, page_size: int
) -> torch.Tensor:
    """Flat pool index page * page_size + offset of each new token.

    Args:
        block_table: [B, max_pages] int32/int64 physical page ids.
        positions: [N] int logical positions inside each token's sequence.
        rows: [N] int block-table row of each token, or None (all row 0).
    Returns:
        [N] int64.
    """
    positions = positions.to(device=block_table.device, dtype=torch.long)
    if rows is None:
        rows = torch.zeros_like(positions)
    rows = rows.to(device=block_table.device, dtype=torch.long)
    pages = block_table.long()[rows, positions // page_size]
    return pages * page_size + positions % page_size


def write_kv_paged(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_table: torch.Tensor,
    positions: torch.Tensor,
    rows: torch.Tensor | None = None,
) -> None:
    """Write N new tokens' K/V into the pools in place (cast to the pool dtype).

    Args:
        k_cache, v_cache: [num_pages, page_size, Hkv, D] (modified in place).
        k, v: [N, Hkv, D].
        block_table: [B, max_pages]; positions: [N]; rows: [N] or None (see `kv_slot_mapping`).
    """
    P, S = k_cache.shape[:2]
    slots = kv_slot_mapping(block_table, positions, rows, S).to(k_cache.device)
    k_cache.view(P * S, *k_cache.shape[2:]).index_copy_(0, slots, k.to(k_cache.dtype))
    v_cache.view(P * S, *v_cache.shape[2:]).index_copy_(0, slots, v.to(v_cache.dtype))


def qk_norm_rope_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    positions: torch.Tensor,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """`qk_norm_rope` of q, k, then `write_kv_paged` of the normed and rotated k and of v.

    Args:
        q: [N, Hq, D]; k, v: [N, Hkv, D] (strided views of one projection row allowed).
        q_weight, k_weight: [D] zero-centred; cos, sin: [N, rot]; eps: the norm's epsilon.
        k_cache, v_cache, block_table, positions, rows: as in `write_kv_paged` (caches modified in place).
    Returns:
        q' [N, Hq, D] contiguous in q.dtype (k' lives only in the cache).
    """
    q, k = qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps)
    write_kv_paged(k_cache, v_cache, k, v, block_table, positions, rows)
    return q


def gather_kv_paged(
    cache: torch.Tensor, block_table_row: torch.Tensor, length: int
) -> torch.Tensor:
    """Contiguous copy of the first `length` tokens of one sequence: [length, Hkv, D]."""
    S = cache.shape[1]
    n_pages = (length + S - 1) // S
    pages = block_table_row[:n_pages].to(device=cache.device, dtype=torch.long)
    return cache.index_select(0, pages).flatten(0, 1)[:length]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q [L, Hq, D] at the last L positions of k, v [C, Hkv, D] (causal) -> [L, Hq, D] fp32."""
    L, Hq, _ = q.shape
    C, Hkv, _ = k.shape
    rep = Hq // Hkv
    qf = q.float().transpose(0, 1)                                          # [Hq, L, D]
    kf = k.float().repeat_interleave(rep, dim=1).transpose(0, 1)            # [Hq, C, D]
    vf = v.float().repeat_interleave(rep, dim=1).transpose(0, 1)
    scores = (qf @ kf.transpose(-1, -2)) * scale                            # [Hq, L, C]
    qpos = torch.arange(C - L, C, device=q.device)[:, None]
    kpos = torch.arange(C, device=q.device)[None, :]
    scores = scores.masked_fill(kpos > qpos, float("-inf"))
    return (torch.softmax(scores, dim=-1) @ vf).transpose(0, 1)


def check_gqa(q: torch.Tensor, k_cache: torch.Tensor, scale: float | None) -> float:
    """Validate GQA head counts (q [.., Hq, D], pool [.., Hkv, D]); return the scale (default D^-1/2)."""
    Hq, Hkv = q.shape[-2], k_cache.shape[2]
    if Hq % Hkv != 0:
        raise ValueError(f"query heads {Hq} must be a multiple of kv heads {Hkv}")
    return q.shape[-1] ** -0.5 if scale is None else scale


def sdpa_rows(L: int) -> int:
    """The row count a causal self-attention of L rows runs at in `padded_causal_sdpa`: L rounded up
    to a multiple of max(256, next_pow2(L) / 8): 16 lengths cover 1..8192 and 4 more each doubling;
    past 1024 rows the padding adds at most a quarter."""
    if L < 1:
        raise ValueError(f"sdpa_rows: L must be >= 1, got {L}")
    g = max(256, (1 << (L - 1).bit_length()) // 8)
    return -(-L // g) * g


def padded_causal_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal self-attention of one sequence through PyTorch SDPA at `sdpa_rows(L)` rows: q [L, Hq, D],
    k, v [L, Hkv, D] (the same L; GQA when Hkv < Hq) -> [L, Hq, D] in q.dtype.
    The rows past L are zeros at the end of q, k and v; a causal row i < L reads keys <= i only, so no
    real row sees them, and their output rows are dropped (exact). Why: cuDNN's SDPA, which PyTorch
    picks for this case on the GPU, builds an execution plan the first time it meets a sequence length
    (a noticeable first-call cost; docs/performance.md, "Decision log"): with a few padded lengths a
    server meets them all in its warmup, not at every new prompt length."""
    L = q.shape[0]
    n = sdpa_rows(L) - L
    if n:
        q, k, v = (F.pad(t, (0, 0, 0, 0, 0, n)) for t in (q, k, v))
    o = F.scaled_dot_product_attention(q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0),
                                       v.transpose(0, 1).unsqueeze(0), is_causal=True, scale=scale,
                                       enable_gqa=q.shape[1] != k.shape[1])
    return o[0].transpose(0, 1)[:L]


def chunk_rows(q: torch.Tensor, context_lens, cu_seqlens_q) -> list[tuple[int, int, int]]:
    """(context length, start, end) of each row's new tokens in a packed prompt chunk q [T_total, ..]
    (host values; cu_seqlens_q None means one row owning all of q)."""
    lens = [int(c) for c in torch.as_tensor(context_lens).tolist()]
    if cu_seqlens_q is None:
        if len(lens) != 1:
            raise ValueError("cu_seqlens_q is required for more than one row")
        cu = [0, q.shape[0]]
    else:
        cu = [int(c) for c in cu_seqlens_q.tolist()]
    rows = []
    for b, ctx in enumerate(lens):
        s, e = cu[b], cu[b + 1]
        if e - s > ctx:
            raise ValueError(f"row {b}: {e - s} new tokens but context length {ctx}")
        rows.append((ctx, s, e))
    return rows


def chunk_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Prompt-chunk (or speculative-verify) form: each row's L new tokens attend to its paged prefix and
    causally to themselves.

    Args:
        q: [T_total, Hq, D], rows packed one after another.
        k_cache, v_cache: [num_pages, page_size, Hkv, D], already holding the new tokens' K/V.
        block_table: [B, max_pages] int32/int64.
        context_lens: [B] int, tokens in each row's context *including* its new tokens (>= L_b).
        cu_seqlens_q: [B+1] int offsets of each row's tokens in q; None means B = 1 and all of q.
    Returns:
        [T_total, Hq, D] in q.dtype. Row b's new token i sits at position context_lens[b] - L_b + i.
    """
    scale = check_gqa(q, k_cache, scale)
    out = torch.empty_like(q)
    for b, (ctx, s, e) in enumerate(chunk_rows(q, context_lens, cu_seqlens_q)):
        if e == s:
            continue
        k = gather_kv_paged(k_cache, block_table[b], ctx)
        v = gather_kv_paged(v_cache, block_table[b], ctx)
        out[s:e] = _attend(q[s:e], k, v, scale).to(q.dtype)
    return out


def prefix_attention_rows(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    start: torch.Tensor,
    length: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of one sequence's prompt stage padded to N rows, from device tensors only (static
    shapes, no host read: the prefill graphs' form). Row i < L (L = length) is the token at position
    start + i; it attends to the keys at positions 0..start + i through block-table row 0: the prefix's
    (written by earlier stages) and the stage's own (written just before, with the same positions).
    Rows i >= L are the padding: their output is zero, and no row reads a key at or past start + L
    (the padding's KV goes elsewhere, block-table row 1 in the prefill graphs).

    Args: q [N, Hq, D]; k_cache, v_cache [num_pages, page_size, Hkv, D]; block_table [R, W] (row 0 read,
    W pages covering start + L); start, length [1] int (device tensors: graph data, not shapes).
    Returns [N, Hq, D] in q.dtype (fp32 scores and softmax, as `chunk_paged_attention`).
    Reference: it reads all W pages of row 0 (keys past start + L zeroed before use, as they may hold
    NaN) and masks [N, W * page_size] scores; the fast op walks only the keys each row reads."""
    scale = check_gqa(q, k_cache, scale)
    N, Hq, _ = q.shape
    Hkv = k_cache.shape[2]
    pages = block_table[0].long()
    C = pages.numel() * k_cache.shape[1]
    kpos = torch.arange(C, device=q.device)
    start = start.to(device=q.device, dtype=torch.long).reshape(1)
    length = length.to(device=q.device, dtype=torch.long).reshape(1)
    end = start + length                                                 # keys 0..end-1 exist
    live = (kpos < end)[:, None, None]
    k = torch.where(live, k_cache.index_select(0, pages).flatten(0, 1).float(), 0.0)      # [C, Hkv, D]
    v = torch.where(live, v_cache.index_select(0, pages).flatten(0, 1).float(), 0.0)
    rows = torch.arange(N, device=q.device)
    # NOTE: a padding row reads the keys of the last real row (no row is all -inf: no NaN), then is zeroed.
    qpos = start + torch.minimum(rows, length - 1)
    allowed = kpos[None, :] <= qpos[:, None]                                            # [N, C]
    rep = Hq // Hkv
    qf = q.float().transpose(0, 1)                                                      # [Hq, N, D]
    kf = k.repeat_interleave(rep, dim=1).transpose(0, 1)                                # [Hq, C, D]
    vf = v.repeat_interleave(rep, dim=1).transpose(0, 1)
    s = (qf @ kf.transpose(-1, -2)) * scale
    o = (torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1) @ vf).transpose(0, 1)   # [N, Hq, D]
    return torch.where((rows < length)[:, None, None], o, 0.0).to(q.dtype)


def decode_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    *,
    gate: torch.Tensor | None = None,
    gate_stream: "torch.cuda.Stream | None" = None,
) -> torch.Tensor:
    """Decode form: one new token per row, each row with its own context length.

    Args:
        q: [B, Hq, D]; k_cache, v_cache: [num_pages, page_size, Hkv, D] (new token already written);
        block_table: [B, max_pages]; context_lens: [B] (including the new token).
        gate: [B, Hq, D] (a strided view of the projection row allowed) or None.
        gate_stream: the CUDA stream that writes `gate` (None: the current one); the current stream
            waits for it right before the gate is read.
    Returns:
        [B, Hq, D] in q.dtype; with gate, `attention_output_gate(o, gate)` (o rounded to q.dtype first).
    """
    cu = torch.arange(q.shape[0] + 1)
    o = chunk_paged_attention(q, k_cache, v_cache, block_table, context_lens, cu, scale)
    if gate is None:
        return o
    if gate_stream is not None:
        torch.cuda.current_stream().wait_stream(gate_stream)
    return attention_output_gate(o, gate)


def attention_output_gate(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The gated-attention output gate, `o * sigmoid(gate)` in o's dtype (as HF).

    Args:
        o: [T, Hq * D] (or [T, Hq, D]); gate: same shape (the second half of each q_proj head).
    """
    return o * torch.sigmoid(gate)
