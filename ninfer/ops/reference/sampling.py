"""Batched token sampler over logits [B, V] with per-row parameters and per-row RNG state.

Pipeline per row (fp32), in this order:
  1. logit bias                     x[id] += bias
  2. repetition penalty (HF)        for ids in prompt ∪ output: x > 0 → x / rp, else x · rp
  3. frequency / presence (OpenAI)  x -= frequency · count_out(id) + presence · [count_out(id) > 0]
  4. temperature == 0 → greedy: argmax of x (ties → the lowest index, torch.argmax's rule); done.
  5. x /= temperature
  6. top-k (0 = off): drop tokens whose value is below the k-th largest (ties at the k-th are kept)
  7. top-p (1 = off): keep the smallest prefix of the descending-sorted distribution whose mass
     reaches top_p (the most likely token is always kept). Where equal values straddle the cut, the
     prefix takes as many of them as it needs, lowest token ids first (so the kept set does not depend
     on a sort's order among ties).
  8. min-p (0 = off): drop tokens with p < min_p · max p
  9. draw from softmax(x) with the row's generator: argmax(p / Exp(1) noise) (an exact sample of p).
Steps 5-8 follow HF's warper order (temperature, top-k, top-p, min-p).

Steps 6-7 read the descending values of each row only down to the cut. When every truncating row
has a top-k of at most CANDIDATES (a host fact of `SamplingTensors.build`; e.g. the model's default
top_k 20 with top_p 0.95), those are the `topk` of the row; otherwise the whole row is sorted. Both
give the same kept set (`_nucleus`): the candidates hold every value above the k-th, and the ties at
the k-th are counted over the whole row.

Steps 6-9 are one `Draw` (`torch_draw` here). The fast sampler (`ninfer.ops.triton.sampling.sample`,
chosen per call on CUDA by `ninfer.ops.opset.sample`) passes its own: the cut (v, n) from the candidates
for rows with a top-k cut, from a radix descent over the whole row for rows that cut by top-p alone, and
the race over the kept tokens without materialising the cut row or its softmax. The two agree token for
token except where fp32 rounding decides (a mass within rounding of top_p, a probability within rounding
of min_p · max p, two scores within rounding of each other).

Log-probs are those of the raw distribution: log_softmax(logits.float()) before any of the above.

RNG convention: the caller owns one generator *state* per row (a CPU uint8 tensor from
`torch.Generator.get_state()`, made by `rng_state_from_seed`). `sample` never mutates it; it
returns the advanced state per row. Committing a token = storing the returned state; aborting =
keeping the old one, so a re-run reproduces the same draw. Greedy rows return their state
unchanged. A row with state None draws from the device's default (global) generator and returns None.
States are device-specific (a CPU state is not a CUDA state): seed them for logits.device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

__all__ = ["apply_token_bitmask_", "CANDIDATES", "SamplingTensors", "cut_rows", "SampleResult", "rng_state_from_seed", "apply_penalties",
           "drawing_rows", "Draw", "torch_draw", "sample"]


# NOTE: the largest top-k whose rows take `topk` candidates instead of the full-vocabulary sort.
CANDIDATES = 1024


def apply_token_bitmask_(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Grammar masking before every sampling step: logits [B, V] (any float dtype), mask [B, W] int32 with
    W * 32 >= V, bit t % 32 of word t // 32 set = token t allowed. Disallowed logits become -inf, in place
    (an all-ones row is unchanged). Shapes only: safe inside a CUDA graph capture. Returns logits."""
    B, V = logits.shape
    W = mask.shape[1]
    if mask.shape[0] != B or W * 32 < V:
        raise ValueError(f"mask {tuple(mask.shape)} does not cover logits {tuple(logits.shape)}")
    bits = torch.bitwise_left_shift(torch.ones(32, dtype=torch.int32, device=mask.device),
                                    torch.arange(32, dtype=torch.int32, device=mask.device))
    banned = (torch.bitwise_and(mask[:, :, None], bits) == 0).view(B, W * 32)[:, :V]
    return logits.masked_fill_(banned, float("-inf"))


def rng_state_from_seed(seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Initial generator state for a per-request seed, for sampling on `device`."""
    return torch.Generator(device=device).manual_seed(seed).get_state()


def _pad(rows: Sequence[Sequence[int]], pad: int, device) -> torch.Tensor:
    width = max((len(r) for r in rows), default=0)
    out = torch.full((len(rows), width), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        if len(r):
            out[i, :len(r)] = torch.as_tensor(list(r), dtype=torch.long)
    return out.to(device)


@dataclass(frozen=True, slots=True)
class SamplingTensors:
    """Per-row sampling parameters as device tensors (B rows). Build with `SamplingTensors.build`.

    temperature/top_p/min_p/penalties: [B] fp32; top_k: [B] int64 (0 = off);
    bias_rows/bias_ids/bias_values: [M] (sparse logit bias entries);
    prompt_ids/output_ids: [B, L] int64 padded with vocab_size (repetition penalty uses both,
    frequency/presence only output_ids).
    """
    vocab_size: int
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    repetition_penalty: torch.Tensor
    presence_penalty: torch.Tensor
    frequency_penalty: torch.Tensor
    bias_rows: torch.Tensor
    bias_ids: torch.Tensor
    bias_values: torch.Tensor
    prompt_ids: torch.Tensor
    output_ids: torch.Tensor
    # NOTE: host facts of the rows (from `build`): whether any row truncates by top-k / top-p (the only
    #       use of the full-vocabulary sort) or by min-p; `sample` skips the work of a step none needs.
    truncates: bool = True
    min_p_any: bool = True
    # NOTE: the number of descending values per row that top-k / top-p need, when every truncating row
    #       has 1 <= top_k <= CANDIDATES (their largest top_k); 0: some row needs the whole sorted row.
    candidates: int = 0
    # NOTE: whether any row has a logit bias or a non-neutral penalty; without one, steps 1-3 are skipped.
    penalized: bool = True
    # NOTE: for the fast sampler's draw: the largest top-k of the rows that cut by top-k (0: none; -1: not
    #       known), and whether some row cuts by top-p without a top-k cut (`top_p_cut` then decides it).
    top_k_max: int = -1
    top_p_only: bool = True

    @classmethod
    def build(
        cls,
        *,
        vocab_size: int,
        device: torch.device | str,
        temperature: Sequence[float],
        top_k: Sequence[int] | None = None,
        top_p: Sequence[float] | None = None,
        min_p: Sequence[float] | None = None,
        repetition_penalty: Sequence[float] | None = None,
        presence_penalty: Sequence[float] | None = None,
        frequency_penalty: Sequence[float] | None = None,
        logit_bias: Sequence[Sequence[tuple[int, float]]] | None = None,
        prompt_tokens: Sequence[Sequence[int]] | None = None,
        output_tokens: Sequence[Sequence[int]] | None = None,
    ) -> "SamplingTensors":
        """One list entry per row; omitted parameters take their neutral value."""
        B = len(temperature)

        def f(vals, neutral):
            vals = [neutral] * B if vals is None else list(vals)
            if len(vals) != B:
                raise ValueError(f"expected {B} rows, got {len(vals)}")
            return torch.tensor(vals, dtype=torch.float32, device=device)

        bias = [[] for _ in range(B)] if logit_bias is None else logit_bias
        flat = [(r, int(t), float(b)) for r, row in enumerate(bias) for t, b in row]
        for _, t, _ in flat:
            if not 0 <= t < vocab_size:
                raise ValueError(f"logit_bias token {t} outside the vocabulary [0, {vocab_size})")
        empty = [[] for _ in range(B)]
        ks = [0] * B if top_k is None else [int(k) for k in top_k]
        ps = [1.0] * B if top_p is None else [float(np.float32(p)) for p in top_p]
        mins = [0.0] * B if min_p is None else [float(np.float32(m)) for m in min_p]
        # NOTE: the cut's host facts from two: the largest top-k cut and whether a row cuts by top-p alone (a
        #       top-p row either has a top-k cut or cuts by top-p alone); the candidates bound every truncating
        #       row only without the latter
        k_max = max([k for k in ks if 0 < k < vocab_size], default=0)
        p_only = any(not 0 < k < vocab_size and p < 1.0 for k, p in zip(ks, ps))
        return cls(
            vocab_size=vocab_size,
            temperature=f(temperature, 1.0),
            top_k=f(top_k, 0).long(),
            top_p=f(top_p, 1.0),
            min_p=f(min_p, 0.0),
            repetition_penalty=f(repetition_penalty, 1.0),
            presence_penalty=f(presence_penalty, 0.0),
            frequency_penalty=f(frequency_penalty, 0.0),
            bias_rows=torch.tensor([r for r, _, _ in flat], dtype=torch.long, device=device),
            bias_ids=torch.tensor([t for _, t, _ in flat], dtype=torch.long, device=device),
            bias_values=torch.tensor([b for _, _, b in flat], dtype=torch.float32, device=device),
            prompt_ids=_pad(prompt_tokens or empty, vocab_size, device),
            output_ids=_pad(output_tokens or empty, vocab_size, device),
            truncates=k_max > 0 or p_only,
            min_p_any=any(m > 0.0 for m in mins),
            candidates=k_max if not p_only and k_max <= CANDIDATES else 0,
            top_k_max=k_max,
            top_p_only=p_only,
            penalized=bool(flat) or any(
                v is not None and any(float(np.float32(x)) != neutral for x in v)
                for v, neutral in ((repetition_penalty, 1.0), (presence_penalty, 0.0), (frequency_penalty, 0.0))),
        )


class SampleResult(NamedTuple):
    token_ids: torch.Tensor             # [B] int64
    logprobs: torch.Tensor | None       # [B] fp32, raw log-prob of the chosen token (None: not asked for)
    top_ids: torch.Tensor               # [B, num_logprobs] int64, raw top-k (descending)
    top_logprobs: torch.Tensor          # [B, num_logprobs] fp32
    rng_states: list[torch.Tensor | None]


def _counts(ids: torch.Tensor, B: int, V: int, device) -> torch.Tensor:
    c = torch.zeros(B, V + 1, dtype=torch.float32, device=device)
    if ids.numel():
        c.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    return c[:, :V]


def apply_penalties(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """Steps 1-3 (bias, repetition, frequency/presence) on logits [B, V]; returns fp32 [B, V] (logits
    themselves when fp32 and no row is penalized: nothing here or after writes into the result)."""
    if not st.penalized:
        return logits.float()
    B, V = logits.shape
    x = logits.float().clone()
    if st.bias_ids.numel():
        x.index_put_((st.bias_rows, st.bias_ids), st.bias_values, accumulate=True)
    out_counts = _counts(st.output_ids, B, V, x.device)
    seen = (_counts(st.prompt_ids, B, V, x.device) + out_counts) > 0
    rp = st.repetition_penalty[:, None]
    x = torch.where(seen, torch.where(x > 0, x / rp, x * rp), x)
    x = x - st.frequency_penalty[:, None] * out_counts - st.presence_penalty[:, None] * (out_counts > 0)
    return x


def _nucleus(x: torch.Tensor, vals: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Where steps 6-7 cut each row of x [B, V] (fp32): (v [B], n [B] int64) such that the kept tokens are
    those above v and the n lowest-id tokens equal to v.

    vals [B, C]: the C largest values of each row, descending (C = V: the sorted row). Exact when every row
    with top_p < 1 has 1 <= top_k <= C, or C = V: the candidates then hold every value above the k-th,
    and the tie group at the k-th (which can reach past them) is counted over the whole row, its members
    having equal probability. Rows with top-k off or top_k >= V take no top-k cut."""
    V, C = x.shape[1], vals.shape[1]
    has_k = (top_k > 0) & (top_k < V)
    kth = torch.where(has_k, vals.gather(1, (top_k.clamp(1, C) - 1)[:, None])[:, 0],
                      torch.full_like(vals[:, 0], float("-inf")))
    m = vals[:, :1]
    z = torch.exp(x - m).masked_fill(x < kth[:, None], 0.0).sum(dim=1)          # top-k's normaliser
    above = vals > kth[:, None]
    sp = torch.exp(vals - m).masked_fill(~above, 0.0) / z[:, None]
    mass_before = sp.cumsum(dim=1) - sp
    active = top_p < 1.0
    drop = above & (mass_before >= top_p[:, None]) & active[:, None]
    # a cut above the k-th value: the first dropped candidate j (j >= 1: the top token stays); the kept
    # members of the group at vals[j - 1] are those of its members before j
    found = drop.any(dim=1)
    j = drop.int().argmax(dim=1).clamp_min(1)
    v_cut = vals.gather(1, (j - 1)[:, None])[:, 0]
    n_cut = j - (vals > v_cut[:, None]).sum(dim=1)
    # else the cut is in the group at the k-th: r of its members (r = 0, 1, ..) are kept while the mass
    # before them, mass(> k-th) + r p_k, is below top_p; all of them without top-p
    n_tie = (x == kth[:, None]).sum(dim=1)
    p_k = torch.exp(kth - m[:, 0]) / z
    r = torch.ceil((top_p - sp.sum(dim=1)) / p_k).clamp_min(0)
    n_tie_kept = torch.where(active, torch.minimum(r, n_tie.to(r.dtype)).long(), n_tie)
    v = torch.where(found, v_cut, kth)
    n = torch.where(found, n_cut, torch.where(has_k, n_tie_kept, torch.full_like(n_tie, V)))
    return v, n


def cut_rows(x: torch.Tensor, vals: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Steps 6-7 on x [B, V] fp32 given vals [B, C], each row's C largest values descending (see
    `_nucleus`): x with the removed tokens at -inf (a new tensor)."""
    v, n = _nucleus(x, vals, top_k, top_p)
    tie = x == v[:, None]
    keep = (x > v[:, None]) | (tie & (tie.cumsum(dim=1) <= n[:, None]))
    return x.masked_fill(~keep, float("-inf"))


def _truncate(x: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """Steps 6-8 on temperature-scaled logits x [B, V] (fp32): removed entries become -inf.
    Without top-k / top-p in any row (st.truncates False) the cut is skipped: it would keep everything;
    without min-p, so is that step."""
    if st.truncates:
        vals = x.topk(st.candidates, dim=1).values if st.candidates else x.sort(dim=1, descending=True).values
        x = cut_rows(x, vals, st.top_k, st.top_p)
    if not st.min_p_any:
        return x
    p = torch.softmax(x, dim=-1)
    return x.masked_fill(p < st.min_p[:, None] * p.max(dim=-1, keepdim=True).values, float("-inf"))


def drawing_rows(temperatures: Sequence[float]) -> list[int]:
    """The rows `sample` draws for (temperature > 0 once stored as fp32), from host values."""
    return [r for r, t in enumerate(temperatures) if float(np.float32(t)) > 0]


# NOTE: steps 6-9 on the temperature-scaled logits xs [B, V] fp32 given one Exp(1) noise row per row
#       (greedy rows: ones): the drawn token per row [B] int64.
Draw = Callable[[torch.Tensor, SamplingTensors, torch.Tensor], torch.Tensor]


def torch_draw(xs: torch.Tensor, st: SamplingTensors, noise: torch.Tensor) -> torch.Tensor:
    """Steps 6-9 in torch: the truncated softmax, then argmax p / noise over the kept tokens."""
    probs = torch.softmax(_truncate(xs, st), dim=-1)
    # NOTE: removed tokens (p = 0) must never win, even against a zero noise draw.
    return torch.where(probs > 0, probs / noise.clamp_min(1e-30), -1.0).argmax(dim=-1)


def sample(
    logits: torch.Tensor,
    st: SamplingTensors,
    rng_states: Sequence[torch.Tensor | None],
    num_logprobs: int = 0,
    drawn: Sequence[int] | None = None,
    logprobs: bool = True,
    draw: Draw | None = None,
) -> SampleResult:
    """Pick one token per row.

    Args:
        logits: [B, V] any float dtype (V = st.vocab_size).
        st: per-row parameters (B rows).
        rng_states: B generator states (see module docstring) or None entries.
        num_logprobs: 0..20, how many raw top log-probs to return per row.
        drawn: `drawing_rows` of the rows' temperatures when the caller has them on the host: then
            nothing here waits for the device (the tokens stay on it until the caller reads them).
        logprobs: False skips the raw log-softmax: the result's logprobs are None (num_logprobs must be 0).
        draw: steps 6-9 (default `torch_draw`).
    Returns:
        SampleResult (token ids, raw log-probs, raw top-k, advanced rng states).
    """
    B, V = logits.shape
    if V != st.vocab_size or len(rng_states) != B or st.temperature.shape[0] != B:
        raise ValueError(f"logits {tuple(logits.shape)} do not match {st.temperature.shape[0]} rows of "
                         f"vocabulary {st.vocab_size} with {len(rng_states)} rng states")
    if num_logprobs and not logprobs:
        raise ValueError("num_logprobs > 0 needs logprobs=True")
    x = apply_penalties(logits, st)
    greedy = st.temperature <= 0
    new_states: list[torch.Tensor | None] = list(rng_states)
    if drawn is None:
        drawn = torch.nonzero(~greedy).flatten().tolist()
    if not drawn:
        tokens = x.argmax(dim=-1)
    else:
        temp = torch.where(greedy, torch.ones_like(st.temperature), st.temperature)
        xs = x / temp[:, None]
        # NOTE: one noise row per drawn row, each from its own generator (greedy rows: ones, no draw), then
        #       one batched race: a row's winner is argmax p / Exp(1) over the tokens it keeps.
        mixed = len(drawn) < B
        noise = (torch.ones if mixed else torch.empty)(B, V, device=x.device)
        for b in drawn:
            if rng_states[b] is None:
                noise[b].exponential_()
            else:
                gen = torch.Generator(device=x.device)
                gen.set_state(rng_states[b])
                noise[b].exponential_(generator=gen)
                new_states[b] = gen.get_state()
        tokens = (draw or torch_draw)(xs, st, noise)
        if mixed:
            tokens = torch.where(greedy, x.argmax(dim=-1), tokens)
    if not logprobs:
        none = torch.empty(B, 0, device=x.device)
        return SampleResult(tokens, None, none.long(), none, new_states)
    raw = torch.log_softmax(logits.float(), dim=-1)
    top_lp, top_ids = raw.topk(num_logprobs, dim=-1) if num_logprobs else (
        raw.new_empty(B, 0), torch.empty(B, 0, dtype=torch.long, device=raw.device))
    return SampleResult(tokens, raw.gather(1, tokens[:, None])[:, 0], top_ids, top_lp, new_states)
