"""UnitExecutor: boundary steps 7-9, one model execution unit and its commit (worker-only).

    prefill stage    Program.prefill(sequence, size)  -> a PendingBatch only on the last stage
    control unit     Program.control(sequence, forced suffix)          -> PendingBatch
    decode round     Program.decode(sequences of the round, steps)     -> PendingBatch

Every PendingBatch is consumed before the next unit runs, in the visible order of one model
output (architecture.md §6):

    Frontend preview of every row (`model_transaction.decide_row`; cancellation flags read here)
    -> Program.commit(accepted prefixes) | Program.abort_pending (nothing accepted)
    -> terminal resource result of the rows that ended (TerminalPath.settle)
    -> budget and scheduler accounting (a speculative row's round: its drafted and produced tokens,
       counted once the row commits at least one token; a cancelled row counts nothing)
    -> OutputSession.commit(preview)
    -> publish the delta; then each ended row's final event

The executor holds the unit's batch (`pending`) from Program's return until commit or abort; on
engine failure the worker aborts it first.
"""
from __future__ import annotations

from typing import Callable

from ninfer.config import GenerationDelta
from ninfer.contract.frontend import FinishReason
from ninfer.contract.program import BatchKind, InvariantError, PendingBatch, Program
from ninfer.engine.metrics import MetricsCollector
from ninfer.engine.model_transaction import RowDecision, check_membership, decide_row
from ninfer.engine.publication import Publisher
from ninfer.engine.request_record import RequestRecord, RequestState
from ninfer.engine.resource_manager import ResourceManager
from ninfer.engine.scheduler import ExecutionUnit, Scheduler, UnitKind
from ninfer.engine.terminal import TerminalPath

S = RequestState
_BATCH_KIND = {UnitKind.PREFILL: BatchKind.PREFILL, UnitKind.DECODE: BatchKind.DECODE,
               UnitKind.CONTROL: BatchKind.CONTROL}


class UnitExecutor:
    def __init__(self, program: Program, scheduler: Scheduler, rm: ResourceManager, terminal: TerminalPath,
                 publisher: Publisher, metrics: MetricsCollector, clock: Callable[[], float], *,
                 prefill_chunk_tokens: int, decode_steps: int):
        self.program = program
        self.scheduler = scheduler
        self.rm = rm
        self.terminal = terminal
        self.publisher = publisher
        self.metrics = metrics
        self.clock = clock
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.decode_steps = decode_steps
        self.pending: PendingBatch | None = None        # the unconsumed batch of the running unit

    def run(self, unit: ExecutionUnit) -> None:
        if self.publisher.tracing:
            self.publisher.emit("unit", None, kind=unit.kind, rows=tuple(r.request_id for r in unit.records))
        self.metrics.unit(unit.kind.value, len(unit.records))
        if unit.kind is UnitKind.PREFILL:
            self._prefill(unit)
        elif unit.kind is UnitKind.CONTROL:
            self._control(unit)
        else:
            self.pending = self.program.decode([r.sequence for r in unit.records], self.decode_steps)
            self._consume(self.pending, unit)

    def _prefill(self, unit: ExecutionUnit) -> None:
        rec = unit.records[0]
        remaining = rec.num_prompt_tokens - rec.num_computed_tokens
        size = min(self.prefill_chunk_tokens, remaining)
        stop = self.rm.prefill_stop(rec)
        if stop is not None:
            size = min(size, stop - rec.num_computed_tokens)
        stage = self.program.prefill(rec.sequence, size)
        self.pending = stage.pending
        done = stage.num_computed_tokens
        if not (rec.num_computed_tokens < done <= rec.num_prompt_tokens):
            raise InvariantError(f"prefill of request {rec.request_id} moved from {rec.num_computed_tokens} "
                                 f"to {done} of {rec.num_prompt_tokens} prompt tokens")
        if (stage.pending is None) != (done < rec.num_prompt_tokens):
            raise InvariantError(f"prefill stage of request {rec.request_id} at {done}/{rec.num_prompt_tokens} "
                                 f"{'lacks' if stage.pending is None else 'has'} the first-token batch")
        rec.num_computed_tokens = done
        if rec.prompt_logprob_entries is not None:
            rec.prompt_logprob_entries.extend(stage.prompt_logprobs)
            got = len(rec.prompt_logprob_entries)
            if stage.pending is not None and got != rec.num_prompt_tokens:
                raise InvariantError(f"prefill of request {rec.request_id} returned prompt log-probs for "
                                     f"{got} of {rec.num_prompt_tokens} prompt tokens")
        if stage.pending is not None:
            self._consume(stage.pending, unit)
        elif done in rec.capture_points and not rec.cancel_requested:
            self.rm.capture(rec)

    def _control(self, unit: ExecutionUnit) -> None:
        rec = unit.records[0]
        if len(rec.control_tokens) > rec.remaining_budget:
            # NOTE: a forced suffix is committed whole or not at all; without the budget for it
            # the request ends here, as it would at its next sampled token.
            self.terminal.end_execution(rec, FinishReason.LENGTH)
            return
        self.pending = self.program.control(rec.sequence, rec.control_tokens)
        self._consume(self.pending, unit)

    def _consume(self, batch: PendingBatch, unit: ExecutionUnit) -> None:
        recs = unit.records
        check_membership(batch, _BATCH_KIND[unit.kind], recs)
        control = unit.kind is UnitKind.CONTROL
        if control and tuple(batch.rows[0].tokens) != recs[0].control_tokens:
            raise InvariantError(f"control batch {batch.batch_id} produced {batch.rows[0].tokens}, "
                                 f"Frontend asked for {recs[0].control_tokens}")
        # NOTE: the cancellation flags read here are this unit's linearisation point.
        decisions = [decide_row(rec, row, rec.cancel_requested, control) for rec, row in zip(recs, batch.rows)]
        accepted = [d.accepted for d in decisions]
        if any(accepted) and self.rm.cache is not None:
            # NOTE: the Frontend's reconstruction boundaries ride with their rows into Program's commit.
            self.program.commit(batch, accepted, [d.preview.boundary if d.preview is not None else None
                                                  for d in decisions])
        elif any(accepted):
            self.program.commit(batch, accepted)
        else:
            self.program.abort_pending(batch)
        if not batch.consumed:
            raise InvariantError(f"PendingBatch {batch.batch_id} is not consumed after commit/abort")
        self.pending = None
        if self.publisher.tracing:
            self.publisher.emit("program_commit", None, batch=batch.batch_id, accepted=tuple(accepted))
        now = self.clock()
        for d in decisions:                              # terminal resource result, when required
            if unit.kind is UnitKind.PREFILL:
                self.scheduler.prefill_done(d.rec)
            if d.terminal:
                self.terminal.end_execution(d.rec, d.reason)
                self.terminal.settle(d.rec, d.tokens)
        for d in decisions:
            if d.accepted:
                self._commit_row(d, now)
        for d in decisions:
            if d.terminal:
                self.publisher.complete(d.rec, d.reason)

    def _commit_row(self, d: RowDecision, now: float) -> None:
        rec = d.rec
        # budget accounting
        if d.row.drafted > 0:
            rec.num_spec_rounds += 1
            rec.num_spec_accepted_tokens += d.row.produced_tokens - 1
            self.metrics.spec_round(d.row.drafted, d.row.produced_tokens)
        rec.num_output_tokens += d.accepted
        rec.output_token_ids.extend(d.tokens)
        rec.num_reasoning_tokens += d.preview.num_reasoning_tokens
        logprobs = None
        if rec.logprobs is not None and d.row.logprobs is not None:
            logprobs = tuple(d.row.logprobs[:d.accepted])
            rec.logprobs.extend(logprobs)
        if d.preview.boundary is not None:
            rec.last_boundary = rec.num_output_tokens - d.accepted + d.preview.boundary
        # Frontend output state
        rec.session.commit(d.preview)
        self.publisher.emit("session_commit", rec, tokens=d.tokens)
        if not d.terminal:
            _next_state(rec)
        self._token_times(rec, d.accepted, now)
        self.publisher.publish(rec, GenerationDelta(rec.request_id, d.preview.delta, d.tokens, logprobs))

    def _token_times(self, rec: RequestRecord, accepted: int, now: float) -> None:
        ttft = inter = None
        if rec.first_token_time is None:
            rec.first_token_time = now
            ttft = now - rec.submit_time
        else:
            inter = now - rec.last_token_time
        rec.last_token_time = now
        self.metrics.tokens(accepted, ttft, inter)


def _next_state(rec: RequestRecord) -> None:
    """After a committed nonterminal row: ControlReady when Frontend forces a suffix, else DecodeReady."""
    forced = rec.session.forced_control()
    if forced:
        rec.control_tokens = tuple(forced)
        rec.move(S.CONTROL_READY)
    else:
        rec.control_tokens = ()
        rec.move(S.DECODE_READY)
