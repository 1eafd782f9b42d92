"""Response bodies and stream chunks of the OpenAI API, built from Engine events.

Chat log-probs: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`.
Legacy completion log-probs: `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`.
Usage carries `prompt_tokens_details.cached_tokens` (prompt tokens reused from a cached prefix)
and `completion_tokens_details.reasoning_tokens` (generated tokens inside the thinking block).
"""
from __future__ import annotations

import json
import time
import uuid
from functools import lru_cache

from ninfer.config import FinishReason, GenerationResult, TokenLogprob, ToolCallDelta, Usage


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def sse(obj: dict | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n".encode("utf-8")


SSE_DONE = b"data: [DONE]\n\n"

FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.TOOL_CALLS: "tool_calls",
          FinishReason.CANCELLED: "abort", FinishReason.ERROR: "error"}


def finish_reason(reason: FinishReason, tool_calls_returned: bool) -> str:
    if reason is FinishReason.TOOL_CALLS and not tool_calls_returned:
        return "stop"
    return FINISH.get(reason, str(reason.value))


# ---------------------------------------------------------------------------------------------
# Token text for log-probs
# ---------------------------------------------------------------------------------------------
class TokenPieces:
    """The bytes and display text of single tokens (log-prob entries)."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.piece = lru_cache(maxsize=65536)(self._piece)

    def _piece(self, token_id: int) -> bytes:
        tok = self._tok
        fn = getattr(tok, "token_piece", None)
        if fn is None:
            return tok.decode([token_id], skip_special_tokens=False).encode("utf-8")
        try:
            piece = fn(token_id)
        except ValueError:                  # an id outside the vocabulary (padding rows)
            return b""
        return piece.encode("utf-8") if isinstance(piece, str) else bytes(piece)

    def text(self, token_id: int) -> str:
        return self.piece(token_id).decode("utf-8", errors="replace")


def chat_logprobs(pieces: TokenPieces, entries: tuple[TokenLogprob, ...] | None) -> dict | None:
    if entries is None:
        return None
    content = []
    for e in entries:
        b = pieces.piece(e.token_id)
        content.append({
            "token": b.decode("utf-8", errors="replace"), "logprob": float(e.logprob), "bytes": list(b),
            "top_logprobs": [{"token": pieces.text(t), "logprob": float(lp), "bytes": list(pieces.piece(t))}
                             for t, lp in e.top]})
    return {"content": content}


def completion_logprobs(pieces: TokenPieces, entries: tuple[TokenLogprob, ...] | None,
                        offset: int = 0) -> dict | None:
    """Legacy shape; `offset` is the text offset of the first entry (streaming continues it)."""
    if entries is None:
        return None
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in entries:
        text = pieces.text(e.token_id)
        out["tokens"].append(text)
        out["token_logprobs"].append(float(e.logprob))
        top: dict[str, float] = {}
        for t, lp in e.top:
            top.setdefault(pieces.text(t), float(lp))
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(text)
    return out


# ---------------------------------------------------------------------------------------------
# Usage
# ---------------------------------------------------------------------------------------------
def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int, reasoning_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens}}


def merge_usage(usages: list[tuple[int, Usage]]) -> dict:
    """Usage of several choices: (prompt_index, Usage) pairs; each prompt is counted once."""
    seen: dict[int, Usage] = {}
    completion = reasoning = 0
    for k, u in usages:
        seen.setdefault(k, u)
        completion += u.num_output_tokens
        reasoning += u.num_reasoning_tokens
    prompt = sum(u.num_prompt_tokens for u in seen.values())
    cached = sum(u.num_reused_tokens for u in seen.values())
    return usage_dict(prompt, completion, cached, reasoning)


# ---------------------------------------------------------------------------------------------
# Chat
# ---------------------------------------------------------------------------------------------
def tool_call_json(call, index: int | None = None) -> dict:
    d = {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
    if index is not None:
        d["index"] = index
    return d


def chat_choice(index: int, result: GenerationResult, pieces: TokenPieces, want_logprobs: bool,
                max_calls: int | None) -> dict:
    calls = list(result.tool_calls)[:max_calls] if max_calls else list(result.tool_calls)
    message = {"role": "assistant", "content": result.text if (result.text or not calls) else None,
               "reasoning_content": result.reasoning or None,
               "tool_calls": [tool_call_json(c) for c in calls]}
    return {"index": index, "message": message,
            "logprobs": chat_logprobs(pieces, result.logprobs or ()) if want_logprobs else None,
            "finish_reason": finish_reason(result.finish_reason, bool(calls)), "stop_reason": None}


def _body(object_: str, rid: str, model: str, created: int, choices: list[dict], usage: dict | None,
          with_usage_field: bool, fingerprint: str | None) -> dict:
    """The envelope every response and chunk shares; `usage` is present when given (or asked for)."""
    d = {"id": rid, "object": object_, "created": created, "model": model, "choices": choices,
         "system_fingerprint": fingerprint}
    if with_usage_field or usage is not None:
        d["usage"] = usage
    return d


def chat_response(rid: str, model: str, created: int, choices: list[dict], usage: dict,
                  fingerprint: str | None = None) -> dict:
    return _body("chat.completion", rid, model, created, choices, usage, True, fingerprint)


def chat_chunk(rid: str, model: str, created: int, choices: list[dict], usage: dict | None = None,
               with_usage_field: bool = False, fingerprint: str | None = None) -> dict:
    return _body("chat.completion.chunk", rid, model, created, choices, usage, with_usage_field, fingerprint)


def tool_delta_json(d: ToolCallDelta) -> dict:
    out: dict = {"index": d.index}
    fn: dict = {}
    if d.id is not None:
        out["id"] = d.id
        out["type"] = "function"
    if d.name is not None:
        fn["name"] = d.name
    fn["arguments"] = d.arguments
    out["function"] = fn
    return out


# ---------------------------------------------------------------------------------------------
# Completions
# ---------------------------------------------------------------------------------------------
def completion_choice(index: int, text: str, result: GenerationResult, pieces: TokenPieces,
                      want_logprobs: bool) -> dict:
    return {"index": index, "text": text,
            "logprobs": completion_logprobs(pieces, result.logprobs or ()) if want_logprobs else None,
            "finish_reason": finish_reason(result.finish_reason, False), "stop_reason": None}


def completion_response(rid: str, model: str, created: int, choices: list[dict], usage: dict,
                        fingerprint: str | None = None) -> dict:
    return _body("text_completion", rid, model, created, choices, usage, True, fingerprint)


def completion_chunk(rid: str, model: str, created: int, choices: list[dict], usage: dict | None = None,
                     with_usage_field: bool = False, fingerprint: str | None = None) -> dict:
    return _body("text_completion", rid, model, created, choices, usage, with_usage_field, fingerprint)
