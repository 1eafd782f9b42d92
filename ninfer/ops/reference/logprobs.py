"""Memory-bounded scoring: log-probs of many positions without materialising [T, V] at once.

For prompt scoring (echo + logprobs) the hidden states [T, H] of all positions go through the
lm_head chunk by chunk over T; each chunk's logits [c, V] are computed in the hidden dtype (as the
model's lm_head), then log_softmax in fp32. Peak extra memory is about c · V · 8 bytes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

__all__ = ["TokenLogprobs", "logprobs_from_logits", "chunked_logprobs"]


class TokenLogprobs(NamedTuple):
    token_logprobs: torch.Tensor | None   # [T] fp32 log p(target_t), None without targets
    token_ranks: torch.Tensor | None      # [T] int64, 1 + #tokens with a strictly larger log-prob
    top_ids: torch.Tensor                 # [T, k] int64, descending
    top_logprobs: torch.Tensor            # [T, k] fp32


def logprobs_from_logits(
    logits: torch.Tensor, target_ids: torch.Tensor | None = None, top_k: int = 0
) -> TokenLogprobs:
    """Log-probs of `target_ids` [T] and the top-k of log_softmax(logits.float()) for logits [T, V]."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    tok = rank = None
    if target_ids is not None:
        tok = lp.gather(1, target_ids.to(lp.device, torch.long)[:, None])
        rank = (lp > tok).sum(dim=-1) + 1
        tok = tok[:, 0]
    if top_k:
        top_lp, top_ids = lp.topk(top_k, dim=-1)
    else:
        top_lp = lp.new_empty(lp.shape[0], 0)
        top_ids = torch.empty(lp.shape[0], 0, dtype=torch.long, device=lp.device)
    return TokenLogprobs(tok, rank, top_ids, top_lp)


def chunked_logprobs(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    target_ids: torch.Tensor | None = None,
    top_k: int = 0,
    max_chunk_bytes: int = 256 << 20,
) -> TokenLogprobs:
    """Score T positions against the vocabulary, chunked over T.

    Args:
        hidden: [T, H] post-final-norm hidden states.
        lm_head: [V, H] (nn.Linear weight layout).
        target_ids: [T] the token whose log-prob is wanted at each position (usually input_ids shifted by one), or None.
        top_k: 0..V top log-probs per position.
        max_chunk_bytes: bound on the fp32 [c, V] logits buffer of one chunk (at least one position per chunk).
    Returns:
        TokenLogprobs with [T]-leading tensors on hidden.device.
    """
    T, V = hidden.shape[0], lm_head.shape[0]
    c = max(1, max_chunk_bytes // (V * 4))
    parts = [
        logprobs_from_logits(
            F.linear(hidden[s:s + c], lm_head),
            None if target_ids is None else target_ids[s:s + c],
            top_k,
        )
        for s in range(0, T, c)
    ]
    if not parts:
        return logprobs_from_logits(hidden.new_empty(0, V), None if target_ids is None else target_ids, top_k)
    cat = lambda xs: None if xs[0] is None else torch.cat(xs)  # noqa: E731
    return TokenLogprobs(*(cat([p[i] for p in parts]) for i in range(4)))
