"""Batched token sampler over logits [B, V] with per-row parameters and per-row RNG state.

Pipeline per row (fp32), in this order:
  1. logit bias                     x[id] += bias
  2. repetition penalty (HF)        for ids in prompt ∪ output: x > 0 → x / rp, else x · rp
  3. frequency / presence (OpenAI)  x -= frequency · count_out(id) + presence · [count_out(id) > 0]
  4. temperature == 0 → greedy: argmax of x (ties → the lowest index, torch.argmax's rule); done.
  5. x /= temperature
  6. top-k (0 = off): drop tokens whose value is below the k-th largest (ties at the k-th are kept)
  7. top-p (1 = off): keep the smallest prefix of the descending-sorted distribution whose mass
     reaches top_p (the most likely token is always kept)
  8. min-p (0 = off): drop tokens with p < min_p · max p
  9. draw from softmax(x) with the row's generator: argmax(p / Exp(1) noise) (an exact sample of p).
Steps 5-8 follow HF's warper order (temperature, top-k, top-p, min-p).

Log-probs are those of the raw distribution: log_softmax(logits.float()) before any of the above.

RNG convention: the caller owns one generator *state* per row (a CPU uint8 tensor from
`torch.Generator.get_state()`, made by `rng_state_from_seed`). `sample` never mutates it; it
returns the advanced state per row. Committing a token = storing the returned state; aborting =
keeping the old one, so a re-run reproduces the same draw. Greedy rows return their state
unchanged. A row with state None draws from the device's default (global) generator and returns None.
States are device-specific (a CPU state is not a CUDA state): seed them for logits.device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

__all__ = ["SamplingTensors", "SampleResult", "rng_state_from_seed", "apply_penalties", "drawing_rows", "sample"]


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
            truncates=any(0 < k < vocab_size for k in ks) or any(p < 1.0 for p in ps),
            min_p_any=any(m > 0.0 for m in mins),
        )


class SampleResult(NamedTuple):
    token_ids: torch.Tensor             # [B] int64
    logprobs: torch.Tensor              # [B] fp32, raw log-prob of the chosen token
    top_ids: torch.Tensor               # [B, num_logprobs] int64, raw top-k (descending)
    top_logprobs: torch.Tensor          # [B, num_logprobs] fp32
    rng_states: list[torch.Tensor | None]


def _counts(ids: torch.Tensor, B: int, V: int, device) -> torch.Tensor:
    c = torch.zeros(B, V + 1, dtype=torch.float32, device=device)
    if ids.numel():
        c.scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float32))
    return c[:, :V]


def apply_penalties(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """Steps 1-3 (bias, repetition, frequency/presence) on logits [B, V]; returns fp32 [B, V]."""
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


def _truncate(x: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """Steps 6-8 on temperature-scaled logits x [B, V] (fp32): removed entries become -inf.
    Without top-k / top-p in any row (st.truncates False) the sort is skipped: it would keep everything;
    without min-p, so is that step."""
    V = x.shape[1]
    if not st.truncates:
        if not st.min_p_any:
            return x
        p = torch.softmax(x, dim=-1)
        return x.masked_fill(p < st.min_p[:, None] * p.max(dim=-1, keepdim=True).values, float("-inf"))
    sorted_x, order = x.sort(dim=-1, descending=True)
    k = torch.where(st.top_k > 0, st.top_k.clamp(max=V), torch.full_like(st.top_k, V))
    kth = sorted_x.gather(1, (k - 1)[:, None])
    x = x.masked_fill(x < kth, float("-inf"))
    sorted_x = sorted_x.masked_fill(sorted_x < kth, float("-inf"))
    sp = torch.softmax(sorted_x, dim=-1)
    mass_before = sp.cumsum(dim=-1) - sp
    drop_sorted = (mass_before >= st.top_p[:, None]) & (st.top_p[:, None] < 1.0)
    x = x.masked_fill(torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted), float("-inf"))
    if not st.min_p_any:
        return x
    p = torch.softmax(x, dim=-1)
    return x.masked_fill(p < st.min_p[:, None] * p.max(dim=-1, keepdim=True).values, float("-inf"))


def drawing_rows(temperatures: Sequence[float]) -> list[int]:
    """The rows `sample` draws for (temperature > 0 once stored as fp32), from host values."""
    return [r for r, t in enumerate(temperatures) if float(np.float32(t)) > 0]


def sample(
    logits: torch.Tensor,
    st: SamplingTensors,
    rng_states: Sequence[torch.Tensor | None],
    num_logprobs: int = 0,
    drawn: Sequence[int] | None = None,
) -> SampleResult:
    """Pick one token per row.

    Args:
        logits: [B, V] any float dtype (V = st.vocab_size).
        st: per-row parameters (B rows).
        rng_states: B generator states (see module docstring) or None entries.
        num_logprobs: 0..20, how many raw top log-probs to return per row.
        drawn: `drawing_rows` of the rows' temperatures when the caller has them on the host: then
            nothing here waits for the device (the tokens stay on it until the caller reads them).
    Returns:
        SampleResult (token ids, raw log-probs, raw top-k, advanced rng states).
    """
    B, V = logits.shape
    if V != st.vocab_size or len(rng_states) != B or st.temperature.shape[0] != B:
        raise ValueError(f"logits {tuple(logits.shape)} do not match {st.temperature.shape[0]} rows of "
                         f"vocabulary {st.vocab_size} with {len(rng_states)} rng states")
    raw = torch.log_softmax(logits.float(), dim=-1)
    x = apply_penalties(logits, st)
    greedy = st.temperature <= 0
    tokens = x.argmax(dim=-1)
    new_states: list[torch.Tensor | None] = list(rng_states)
    if drawn is None:
        drawn = torch.nonzero(~greedy).flatten().tolist()
    if drawn:
        temp = torch.where(greedy, torch.ones_like(st.temperature), st.temperature)
        probs = torch.softmax(_truncate(x / temp[:, None], st), dim=-1)
        for b in drawn:
            if rng_states[b] is None:
                noise = torch.empty(V, device=x.device).exponential_()
            else:
                gen = torch.Generator(device=x.device)
                gen.set_state(rng_states[b])
                noise = torch.empty(V, device=x.device).exponential_(generator=gen)
                new_states[b] = gen.get_state()
            # NOTE: removed tokens (p = 0) must never win, even against a zero noise draw.
            tokens[b] = torch.where(probs[b] > 0, probs[b] / noise.clamp_min(1e-30), -1.0).argmax()
    top_lp, top_ids = raw.topk(num_logprobs, dim=-1) if num_logprobs else (
        raw.new_empty(B, 0), torch.empty(B, 0, dtype=torch.long, device=raw.device))
    return SampleResult(tokens, raw.gather(1, tokens[:, None])[:, 0], top_ids, top_lp, new_states)
