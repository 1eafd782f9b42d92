"""`/v1/completions` with `echo` and `logprobs`: the legacy log-probs object over prompt + output.

    {"tokens":         [prompt tokens ..., generated tokens ...],
     "token_logprobs": [null, lp_1, ..., lp_{P-1}, generated ...],
     "top_logprobs":   [null, {text: lp, ...}, ...],      # top-k, always including the actual token
     "text_offset":    [0, ...]}                          # character offsets into the choice's text

This is what lm-evaluation-harness's `local-completions` backend reads for log-likelihood
(`{"prompt": [ids], "max_tokens": 1, "logprobs": 1, "echo": true, "temperature": 0}`, then
`sum(token_logprobs[ctxlen:-1])`, and `max(top_logprobs[i].values()) == token_logprobs[i]` for
greedy). The prompt entries come from the Engine's prompt log-probs (`submit(prompt_logprobs=k)`),
computed over the whole prompt, never taken from a reused prefix. `max_tokens: 0` is served by a
one-token request whose output is left out of the response.
"""
from __future__ import annotations

import codecs
from dataclasses import replace

from ninfer.gateway.http.responses import TokenPieces, finish_reason
from ninfer.config import GenerationResult, TokenLogprob


def _entry(pieces: TokenPieces, e: TokenLogprob | None) -> tuple[float | None, dict | None]:
    if e is None:
        return None, None
    top: dict[str, float] = {}
    for t, lp in e.top:
        top.setdefault(pieces.text(t), float(lp))
    top.setdefault(pieces.text(e.token_id), float(e.logprob))     # NOTE: the actual token is always listed
    return float(e.logprob), top


def echo_logprobs(pieces: TokenPieces, prompt_ids: tuple[int, ...],
                  prompt_logprobs: tuple[TokenLogprob | None, ...],
                  output: tuple[TokenLogprob, ...] = ()) -> dict:
    """The legacy object for prompt + generated tokens (`output` entries carry their token ids)."""
    if len(prompt_logprobs) != len(prompt_ids):
        raise ValueError(f"{len(prompt_logprobs)} prompt log-probs for {len(prompt_ids)} prompt tokens")
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    offset = 0
    entries = list(zip(prompt_ids, prompt_logprobs)) + [(e.token_id, e) for e in output]
    for token_id, e in entries:
        lp, top = _entry(pieces, e)
        out["tokens"].append(pieces.text(token_id))
        out["token_logprobs"].append(lp)
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(decoder.decode(pieces.piece(token_id)))
    return out


def echo_choice(index: int, echo_text: str, prompt_ids: tuple[int, ...], result: GenerationResult,
                pieces: TokenPieces, discard_output: bool) -> dict:
    """A completion choice with echo (log-probs when the request asked for them, i.e. when the result
    carries prompt log-probs); `discard_output` for `max_tokens: 0`."""
    output = () if discard_output else tuple(result.logprobs or ())
    text = echo_text if discard_output else echo_text + result.text
    return {"index": index, "text": text,
            "logprobs": (echo_logprobs(pieces, prompt_ids, result.prompt_logprobs, output)
                         if result.prompt_logprobs is not None else None),
            "finish_reason": "length" if discard_output else finish_reason(result.finish_reason, False),
            "stop_reason": None}


def echo_usage(result: GenerationResult, discard_output: bool):
    """Usage of a choice; a `max_tokens: 0` choice generated nothing the client sees."""
    return replace(result.usage, num_output_tokens=0, num_reasoning_tokens=0) if discard_output else result.usage
