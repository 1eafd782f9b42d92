"""Program-side glue around the sampler and log-prob ops: per-row parameters, token history for
penalties, per-row RNG state, and TokenLogprob records.

RNG: every sequence owns one generator state (`rng_state_from_seed`); `sample` returns the
advanced state without mutating the old one. Program stores the state after a sampled token only
when that token is committed, so an aborted or unaccepted draw leaves the stream untouched.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from ninfer.ops.reference.logprobs import chunked_logprobs, logprobs_from_logits
from ninfer.ops.opset import sample
from ninfer.ops.reference.sampling import SamplingTensors, drawing_rows, rng_state_from_seed
from ninfer.contract.program import SamplingParams, TokenLogprob

__all__ = ["RowSampling", "Sampler", "rng_state_from_seed", "prompt_token_logprobs"]


class RowSampling(NamedTuple):
    params: SamplingParams
    rng_state: torch.Tensor | None
    prompt: Sequence[int]            # prompt tokens (repetition penalty)
    output: Sequence[int]            # committed + provisional output tokens (all penalties)


def _records(tokens: torch.Tensor, lps: torch.Tensor, top_ids: torch.Tensor, top_lps: torch.Tensor,
             ks: Sequence[int | None]) -> list[TokenLogprob | None]:
    out: list[TokenLogprob | None] = []
    tok, lp, ti, tl = tokens.tolist(), lps.tolist(), top_ids.tolist(), top_lps.tolist()
    for r, k in enumerate(ks):
        if k is None:
            out.append(None)
        else:
            out.append(TokenLogprob(tok[r], lp[r], tuple(zip(ti[r][:k], tl[r][:k]))))
    return out


class Sampler:
    def __init__(self, vocab_size: int, device: torch.device, sampleable_vocab_size: int = 0) -> None:
        self.vocab_size = vocab_size
        self.device = device
        # NOTE: lm_head rows past the tokenizer's vocabulary name no token; they are masked out of
        # sampling and of the reported distribution so a padding id can never reach the Frontend.
        self.sampleable = sampleable_vocab_size if 0 < sampleable_vocab_size < vocab_size else vocab_size

    def new_rng_state(self, seed: int) -> torch.Tensor:
        return rng_state_from_seed(seed, self.device)

    @staticmethod
    def plain(p: SamplingParams) -> bool:
        """No penalties, no logit bias, no log-probs: a step's draw needs neither the token history
        nor a host record, so `sample_ids` can run it without a host sync (step_ahead.py)."""
        return (p.repetition_penalty == 1.0 and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
                and not p.logit_bias and p.logprobs is None)

    @classmethod
    def plain_greedy(cls, p: SamplingParams) -> bool:
        """Greedy and plain: `greedy_tokens` gives exactly `sample`'s tokens, and the RNG stays put."""
        return p.temperature <= 0 and cls.plain(p)

    def plain_tensors(self, ps: Sequence[SamplingParams]) -> SamplingTensors:
        """The device parameters of plain rows (no history: their penalties are neutral)."""
        return SamplingTensors.build(
            vocab_size=self.vocab_size, device=self.device, temperature=[p.temperature for p in ps],
            top_k=[p.top_k for p in ps], top_p=[p.top_p for p in ps], min_p=[p.min_p for p in ps])

    def sample_ids(self, logits: torch.Tensor, st: SamplingTensors, ps: Sequence[SamplingParams],
                   rng_states: Sequence[torch.Tensor | None]) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """Plain rows: `sample`'s token ids, left on the device (no sync), and the advanced rng states."""
        res = sample(self._sampleable(logits), st, rng_states, 0, drawn=drawing_rows([p.temperature for p in ps]),
                     logprobs=False)
        return res.token_ids, res.rng_states

    def _sampleable(self, logits: torch.Tensor) -> torch.Tensor:
        """logits with the rows past the sampleable vocabulary at -inf (a copy when there are any)."""
        if self.sampleable < self.vocab_size:
            logits = logits.clone()
            logits[:, self.sampleable:] = float("-inf")
        return logits

    def greedy_ids(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [B, V] -> argmax over the sampleable vocabulary per row, on the logits' device (no sync)."""
        if self.sampleable < self.vocab_size:
            logits = logits[:, :self.sampleable]
        return logits.argmax(dim=-1)

    def greedy_tokens(self, logits: torch.Tensor) -> list[int]:
        """logits [B, V] -> argmax over the sampleable vocabulary per row (one kernel, one sync)."""
        return self.greedy_ids(logits).tolist()

    def sample(self, logits: torch.Tensor, rows: Sequence[RowSampling]
               ) -> tuple[list[int], list[TokenLogprob | None], list[torch.Tensor | None]]:
        """logits [B, V] fp32 -> (token per row, TokenLogprob per row or None, advanced rng state per row)."""
        ps = [r.params for r in rows]
        logits = self._sampleable(logits)
        st = SamplingTensors.build(
            vocab_size=self.vocab_size, device=logits.device,
            temperature=[p.temperature for p in ps], top_k=[p.top_k for p in ps], top_p=[p.top_p for p in ps],
            min_p=[p.min_p for p in ps], repetition_penalty=[p.repetition_penalty for p in ps],
            presence_penalty=[p.presence_penalty for p in ps], frequency_penalty=[p.frequency_penalty for p in ps],
            logit_bias=[p.logit_bias for p in ps],
            prompt_tokens=[r.prompt if r.params.repetition_penalty != 1.0 else () for r in rows],
            output_tokens=[r.output for r in rows])
        ks = [p.logprobs for p in ps]
        want = any(k is not None for k in ks)
        res = sample(logits, st, [r.rng_state for r in rows], max((k or 0) for k in ks),
                     drawn=drawing_rows([p.temperature for p in ps]), logprobs=want)
        lps = _records(res.token_ids, res.logprobs, res.top_ids, res.top_logprobs, ks) if want else [None] * len(ks)
        return res.token_ids.tolist(), lps, res.rng_states

    def logprobs_of(self, logits: torch.Tensor, tokens: Sequence[int], ks: Sequence[int | None]
                    ) -> list[TokenLogprob | None]:
        """Raw log-probs of given (forced) tokens, logits [B, V]."""
        if all(k is None for k in ks):
            return [None] * len(ks)
        t = torch.tensor(list(tokens), dtype=torch.long, device=logits.device)
        res = logprobs_from_logits(logits, t, max((k or 0) for k in ks))
        return _records(t, res.token_logprobs, res.top_ids, res.top_logprobs, ks)


def prompt_token_logprobs(hidden: torch.Tensor, lm_head: torch.Tensor, tokens: Sequence[int], start: int,
                          end: int, num_prompt: int, k: int) -> tuple[TokenLogprob | None, ...]:
    """Prompt log-probs produced by one prefill stage that computed positions [start, end).

    Position j predicts prompt token j + 1, so the stage yields records for prompt tokens
    start+1 .. min(end, num_prompt-1), preceded by None for token 0 on the first stage; over all
    stages that is one entry per prompt token. hidden: [end - start, H] post-final-norm.
    """
    last = min(end, num_prompt - 1)                   # last prompt token scored by this stage
    n = last - start                                  # positions start .. last-1 score tokens start+1 .. last
    out: list[TokenLogprob | None] = [None] if start == 0 else []
    if n > 0:
        targets = torch.tensor(list(tokens[start + 1:last + 1]), dtype=torch.long, device=hidden.device)
        res = chunked_logprobs(hidden[:n], lm_head, targets, k)
        out += _records(targets, res.token_logprobs, res.top_ids, res.top_logprobs, [k] * n)
    return tuple(out)
