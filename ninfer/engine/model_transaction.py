"""The accepted-prefix decision for one PendingBatch (pure: reads records and previews, mutates nothing).

For every row Engine previews the produced tokens in the request's OutputSession and decides:

    cancelled row         accepted = 0, terminal (CANCELLED); no preview
    otherwise             1 <= accepted <= produced
                          nonterminal -> accepted == produced
                          terminal    -> accepted may be a prefix of produced

Produced tokens beyond the request's remaining budget are never previewed; reaching the budget
makes the row terminal with LENGTH. Any violation by Program (membership) or Frontend (preview
extent, boundary) is an InvariantError: the batch has no consistent disposition.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

from ninfer.contract.program import BatchKind, InvariantError, PendingBatch, PendingRow
from ninfer.engine.request_record import RequestRecord
from ninfer.contract.frontend import FinishReason, Preview


class RowDecision(NamedTuple):
    rec: RequestRecord
    row: PendingRow
    accepted: int
    tokens: tuple[int, ...]            # the accepted tokens
    preview: Preview | None            # None for a cancelled row
    terminal: bool
    reason: FinishReason | None        # set when terminal


def check_membership(batch: PendingBatch, kind: BatchKind, recs: Sequence[RequestRecord]) -> None:
    if batch.consumed:
        raise InvariantError(f"PendingBatch {batch.batch_id} arrived already consumed")
    if batch.kind is not kind:
        raise InvariantError(f"PendingBatch {batch.batch_id} is {batch.kind.value}, expected {kind.value}")
    if batch.size != len(recs):
        raise InvariantError(f"PendingBatch {batch.batch_id} has {batch.size} rows for a unit of {len(recs)}")
    for i, (row, rec) in enumerate(zip(batch.rows, recs)):
        if row.sequence != rec.sequence:
            raise InvariantError(f"PendingBatch {batch.batch_id} row {i} is {row.sequence}, "
                                 f"expected {rec.sequence} (request {rec.request_id})")


def decide_row(rec: RequestRecord, row: PendingRow, cancelled: bool, control: bool = False) -> RowDecision:
    """control: the row carries Frontend's forced-control tokens (previewed as control, never stops)."""
    if cancelled:
        return RowDecision(rec, row, 0, (), None, True, FinishReason.CANCELLED)
    produced = row.produced_tokens
    if produced < 1:
        raise InvariantError(f"row of request {rec.request_id} produced no token")
    if row.logprobs is not None and len(row.logprobs) != produced:
        raise InvariantError(f"row of request {rec.request_id}: {len(row.logprobs)} log-probs for {produced} tokens")
    budget = rec.remaining_budget
    if budget < 1:
        raise InvariantError(f"request {rec.request_id} executed with no budget left")
    span = tuple(row.tokens[:budget])
    preview = rec.session.preview(span, control=True) if control else rec.session.preview(span)
    accepted = preview.accepted_tokens
    if not (1 <= accepted <= len(span)):
        raise InvariantError(f"preview of request {rec.request_id} accepts {accepted} of {len(span)} tokens")
    if not preview.terminal and accepted != len(span):
        raise InvariantError(f"nonterminal preview of request {rec.request_id} accepts {accepted} of {len(span)}")
    if preview.terminal and preview.finish_reason is None:
        raise InvariantError(f"terminal preview of request {rec.request_id} has no finish reason")
    if preview.boundary is not None and not (0 <= preview.boundary <= accepted):
        raise InvariantError(f"boundary {preview.boundary} outside the accepted span of {accepted}")
    if preview.terminal:
        return RowDecision(rec, row, accepted, span[:accepted], preview, True, preview.finish_reason)
    if rec.num_output_tokens + accepted >= rec.max_tokens:
        return RowDecision(rec, row, accepted, span[:accepted], preview, True, FinishReason.LENGTH)
    return RowDecision(rec, row, accepted, span[:accepted], preview, False, None)
