"""Publisher: the worker's table of outstanding requests and the events it publishes to them.

Every event a consumer sees leaves the worker through `publish` (GenerationStart, GenerationDelta)
or through `complete` / `error` (the one final GenerationResult | GenerationError, after which the
record leaves the table and the ticket's response is done). Publication always follows Program's
commit and the OutputSession's commit of the same tokens (architecture.md §9, invariant 7); the
callers keep that order, the optional trace (`emit`) lets tests check it.
"""
from __future__ import annotations

from typing import Any, Callable

from ninfer.config import (ErrorKind, GenerationDelta, GenerationError, GenerationEvent, GenerationResult,
                           Usage)
from ninfer.contract.frontend import FinishReason
from ninfer.engine.metrics import MetricsCollector
from ninfer.engine.request_record import RequestRecord, RequestState

Trace = Callable[[str, dict], None]


class Publisher:
    def __init__(self, metrics: MetricsCollector, clock: Callable[[], float], trace: Trace | None = None):
        self.metrics = metrics
        self.clock = clock
        self._trace = trace
        self.records: dict[int, RequestRecord] = {}        # publication_order -> record, until its final event
        # entries added to every GenerationResult.extra (e.g. {"synthetic_weights": True} for dummy weights)
        self.result_extra: dict = {}
        # speculative decoding is on: every Usage carries the request's rounds and accepted drafts
        self.speculative = False

    def add(self, rec: RequestRecord) -> None:
        self.records[rec.publication_order] = rec

    def publish(self, rec: RequestRecord, event: GenerationEvent) -> None:
        self.emit("publish", rec, event=event)
        rec.ticket.channel.put(event)

    def complete(self, rec: RequestRecord, reason: FinishReason) -> None:
        """Resources and output are committed: form the final result and publish it."""
        if rec.state is not RequestState.FINISHED:
            rec.move(RequestState.FINISHED)
        delta, final = rec.session.finish(reason)
        if not delta.empty:
            self.publish(rec, GenerationDelta(rec.request_id, delta, ()))
        result = GenerationResult(
            request_id=rec.request_id, text=final.text, reasoning=final.reasoning, tool_calls=final.tool_calls,
            token_ids=tuple(rec.output_token_ids), finish_reason=final.finish_reason, usage=self._usage(rec),
            logprobs=tuple(rec.logprobs) if rec.logprobs is not None else None,
            extra={**self.result_extra, **final.extra},
            prompt_logprobs=(tuple(rec.prompt_logprob_entries)
                             if rec.prompt_logprob_entries is not None else None))
        self.metrics.ended(reason=final.finish_reason.value, e2e=self.clock() - rec.submit_time)
        self._finish(rec, result)

    def error(self, rec: RequestRecord, kind: ErrorKind, message: str) -> None:
        self.metrics.ended(error=kind.value)
        self._finish(rec, GenerationError(rec.request_id, kind, message, self._usage(rec)))

    def _finish(self, rec: RequestRecord, event: GenerationResult | GenerationError) -> None:
        self.records.pop(rec.publication_order, None)
        self.publish(rec, event)
        rec.ticket.mark_response_done()

    @property
    def tracing(self) -> bool:
        """True when a trace callback listens (callers skip building an event's arguments otherwise)."""
        return self._trace is not None

    def emit(self, what: str, rec: RequestRecord | None, **info: Any) -> None:
        """One trace event (tests and tools); `rec` adds its request id and state."""
        if self._trace is not None:
            info["request_id"] = rec.request_id if rec is not None else None
            if rec is not None:
                info["state"] = rec.state
            self._trace(what, info)

    def _usage(self, rec: RequestRecord) -> Usage:
        if not self.speculative:
            return Usage(rec.num_prompt_tokens, rec.num_output_tokens, rec.num_reused_tokens, rec.num_reasoning_tokens)
        return Usage(rec.num_prompt_tokens, rec.num_output_tokens, rec.num_reused_tokens, rec.num_reasoning_tokens,
                     num_spec_rounds=rec.num_spec_rounds, num_spec_accepted_tokens=rec.num_spec_accepted_tokens)
