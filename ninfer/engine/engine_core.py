"""EngineCore: the single worker that owns request order, lifecycle and publication.

Only the worker thread touches request records, the Scheduler, the ResourceManager and Program.
Submit threads append to the inbox; consumers set flags on their ticket; both wake the worker
through one condition. The worker blocks on it when there is nothing to do (no busy waiting),
waking early for the next queue deadline or the drain deadline of `close`.

One worker boundary (`step`), in the semantic order of architecture.md §5:
  0. take new submissions from the inbox into the FIFO queue
  1. take timeouts and cancellations of waiting requests
  2. advance started resource transitions (none: Program's transitions complete synchronously)
  3. settle TerminalPending requests (release, adopt, lane Free, final response)
  4. freeze the active cancellation snapshot (cancelled Active requests -> TerminalPending)
  5. try one admission when the fairness gate allows and an admission event happened
  6. choose staged prefill, forced control or a compact decode round
  7. run at most one model execution unit
  8. commit model (Program), terminal resources, budget, Frontend output state
  9. publish response events and observations
A cancellation that arrives while a unit runs is seen by the unit's commit decision (a cancelled
row: zero accepted tokens, terminal) -- still inside the worker, at one linearised point.

Any Program or invariant failure fails the whole Engine (`fail`): Program's pending transaction
is aborted first, then active sequences are released, then ResourceManager is cleared and every
outstanding request completes with an ENGINE_FAILED error. The worker then exits.
"""
from __future__ import annotations

import itertools
import logging
import threading
import time
import traceback
import uuid
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable

from ninfer.contract.program import (BatchKind, InvariantError, PendingBatch, Program, Refusal, RefusalKind,
                                           ResourceResult, SamplingParams, StalePlanError)
from ninfer.engine.admission_policy import AdmissionEvent, OutstandingCapacity
from ninfer.engine.context_cache import CacheConfig, ContextCache
from ninfer.engine.handle import GenerationHandle, RequestTicket
from ninfer.engine.metrics import MetricsCollector
from ninfer.engine.model_transaction import RowDecision, check_membership, decide_row
from ninfer.engine.request_record import RequestRecord, RequestState
from ninfer.engine.resource_manager import ResourceManager
from ninfer.engine.scheduler import ExecutionUnit, Scheduler, UnitKind
from ninfer.contract.frontend import FinishReason, OutputOptions, PreparedPrompt
from ninfer.config import (Availability, AvailabilityState, EngineMetrics, EngineRequestError, ErrorKind,
                          GenerationDelta, GenerationError, GenerationEvent, GenerationResult, GenerationStart,
                          Usage)

S = RequestState
_log = logging.getLogger(__name__)
_BATCH_KIND = {UnitKind.PREFILL: BatchKind.PREFILL, UnitKind.DECODE: BatchKind.DECODE,
               UnitKind.CONTROL: BatchKind.CONTROL}
Trace = Callable[[str, dict], None]


# NOTE: tokens a decode round asks of each row (the Engine's default; `ninfer.engine.facade` sizes the Program's
#       provisional area from it).
DECODE_STEPS = 1


class EngineCore:
    # entries added to every GenerationResult.extra (e.g. {"synthetic_weights": True} for dummy weights)
    result_extra: dict = {}

    def __init__(self, frontend: Any, *, max_concurrency: int, queue_size: int, request_timeout_s: float,
                 prefill_chunk_tokens: int, max_model_len: int, decode_steps: int = DECODE_STEPS,
                 clock: Callable[[], float] = time.monotonic, trace: Trace | None = None,
                 cache: CacheConfig | None = None):
        self.frontend = frontend
        self.max_concurrency = max_concurrency
        self.queue_size = queue_size
        self.request_timeout_s = request_timeout_s
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.max_model_len = max_model_len
        self.decode_steps = decode_steps
        self.cache_config = cache
        self._cache_on = False                              # set once the Program is attached
        self.clock = clock
        self._trace = trace
        self._cv = threading.Condition(threading.RLock())   # NOTE: re-entrant, handle finalizers wake us
        self._inbox: deque[RequestRecord] = deque()
        self._calls: deque[tuple[Callable[[], Any], Future]] = deque()    # `call_on_worker`
        self._wake = False
        self._availability = Availability(AvailabilityState.STARTING)
        self._order = itertools.count(1)
        self.capacity = OutstandingCapacity(max_concurrency + queue_size)
        self.metrics_collector = MetricsCollector(max_concurrency, queue_size, self.capacity.limit)
        # the serve warmup's prompt lengths (`Engine.warm_up`), a host value read from Program at attach
        self.warmup_lengths: tuple[int, ...] = ()
        # worker-owned state (set up by attach_program)
        self.program: Program | None = None
        self.scheduler = Scheduler()
        self.rm: ResourceManager | None = None
        self.records: dict[int, RequestRecord] = {}        # publication_order -> record, until Finished
        self._pending: PendingBatch | None = None           # the unconsumed batch of the running unit
        self._capacity_revision: int | None = None
        self._closing = False
        self._drain_deadline: float | None = None
        self.stopped = False

    # ================================ any thread ========================================
    @property
    def availability(self) -> Availability:
        return self._availability

    def wake(self) -> None:
        with self._cv:
            self._wake = True
            self._cv.notify_all()

    def submit(self, prompt: PreparedPrompt, sampling: SamplingParams, *, max_tokens: int,
               output: OutputOptions = OutputOptions(), request_id: str | None = None,
               deadline_s: float | None = None, prompt_logprobs: int | None = None,
               session_id: str | None = None, context_cache: bool = True) -> GenerationHandle:
        """Accept one request or raise EngineRequestError(OVERLOADED | NOT_READY | INVALID_REQUEST).

        session_id: a context-cache lookup hint (the conversation); context_cache=False: this
        request neither reuses nor publishes checkpoints (serve warmup)."""
        if not self._availability.ready:
            raise self._reject(ErrorKind.NOT_READY, f"engine is {self._availability.state.value}"
                               + (f": {self._availability.reason}" if self._availability.reason else ""))
        self._validate(prompt, sampling, max_tokens, output, deadline_s)
        if session_id is not None and (not isinstance(session_id, str) or not session_id or len(session_id) > 256):
            raise self._reject(ErrorKind.INVALID_REQUEST, "session_id must be a non-empty string of at most 256 "
                               "characters")
        if prompt_logprobs is not None and (isinstance(prompt_logprobs, bool) or not isinstance(prompt_logprobs, int)
                                            or not 0 <= prompt_logprobs <= 20):
            raise self._reject(ErrorKind.INVALID_REQUEST, f"prompt_logprobs must be in 0..20, got {prompt_logprobs!r}")
        try:
            session = self.frontend.new_session(prompt, output)
        except (ValueError, TypeError) as e:
            raise self._reject(ErrorKind.INVALID_REQUEST, f"output options: {e}") from e
        if not self.capacity.try_acquire():
            raise self._reject(ErrorKind.OVERLOADED, f"engine holds {self.capacity.limit} outstanding requests "
                               f"(max_concurrency {self.max_concurrency} + queue_size {self.queue_size})")
        rid = request_id or f"req-{uuid.uuid4().hex[:16]}"
        ticket = RequestTicket(rid, self.capacity.release, self.wake)
        now = self.clock()
        timeout = self.request_timeout_s if deadline_s is None else deadline_s
        with self._cv:
            if not self._availability.ready or self._closing:
                self.capacity.release()
                raise self._reject(ErrorKind.NOT_READY, f"engine is {self._availability.state.value}")
            rec = RequestRecord(request_id=rid, publication_order=next(self._order), prompt=prompt,
                                sampling=sampling, max_tokens=max_tokens, options=output, session=session,
                                ticket=ticket, submit_time=now, deadline=now + timeout,
                                session_key=session_id, use_cache=bool(context_cache) and self._cache_on)
            if sampling.logprobs is not None:
                rec.logprobs = []
            if prompt_logprobs is not None:
                rec.prompt_logprobs, rec.prompt_logprob_entries = prompt_logprobs, []
            self._inbox.append(rec)
            self._wake = True
            self._cv.notify_all()
        self.metrics_collector.submitted()
        return GenerationHandle(ticket)

    def call_on_worker(self, fn: Callable[[], Any]) -> Future:
        """Run fn() on the worker thread at the start of its next boundary, between model execution units
        (serve warmup: PyTorch keeps cuDNN attention plans per thread, so a plan made on any other thread
        is not the one a request finds). Returns a Future of fn's result; an exception raised by fn is set
        on it and does not fail the engine. A call not yet run when the worker stops (close, failure)
        ends with EngineRequestError(NOT_READY). fn must not touch requests, resources or Program state."""
        fut: Future = Future()
        with self._cv:
            if not self._availability.ready or self._closing:
                raise EngineRequestError(ErrorKind.NOT_READY, f"engine is {self._availability.state.value}")
            self._calls.append((fn, fut))
            self._wake = True
            self._cv.notify_all()
        return fut

    def plan_attention(self) -> Future:
        """The Program's `warmup_attention_plans(stage size, max_model_len)` on the worker (serve warmup),
        as a Future of (shapes run, shapes in all); (0, 0) for a Program without that hook."""
        def run():
            hook = getattr(self.program, "warmup_attention_plans", None)
            return (0, 0) if hook is None else hook(self.prefill_chunk_tokens, self.max_model_len)
        return self.call_on_worker(run)

    def _take_calls(self) -> list[tuple[Callable[[], Any], Future]]:
        with self._cv:
            calls = list(self._calls)
            self._calls.clear()
        return calls

    def _run_calls(self) -> bool:
        calls = self._take_calls()
        for fn, fut in calls:
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - the caller's error, handed back on its Future
                fut.set_exception(e)
        return bool(calls)

    def _drop_calls(self) -> None:
        for _, fut in self._take_calls():
            if fut.set_running_or_notify_cancel():
                fut.set_exception(EngineRequestError(ErrorKind.NOT_READY,
                                                     f"engine is {self._availability.state.value}"))

    def _reject(self, kind: ErrorKind, message: str) -> EngineRequestError:
        self.metrics_collector.rejected_at_submit(kind.value)
        return EngineRequestError(kind, message)

    def _validate(self, prompt, sampling, max_tokens, output, deadline_s) -> None:
        def bad(msg: str) -> EngineRequestError:
            return self._reject(ErrorKind.INVALID_REQUEST, msg)
        if not isinstance(prompt, PreparedPrompt):
            raise bad(f"prompt must be a PreparedPrompt, got {type(prompt).__name__}")
        if not isinstance(sampling, SamplingParams):
            raise bad(f"sampling must be SamplingParams, got {type(sampling).__name__}")
        if not isinstance(output, OutputOptions):
            raise bad(f"output must be OutputOptions, got {type(output).__name__}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise bad(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        if prompt.num_prompt_tokens < 1:
            raise bad("the prompt has no tokens")
        if prompt.num_prompt_tokens + max_tokens > self.max_model_len:
            raise bad(f"prompt ({prompt.num_prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds "
                      f"max_model_len {self.max_model_len}")
        if deadline_s is not None and not deadline_s > 0:
            raise bad(f"deadline_s must be > 0, got {deadline_s}")

    def metrics(self) -> EngineMetrics:
        return self.metrics_collector.snapshot(self._availability, self.capacity.used)

    def reset_request_metrics(self) -> None:
        """Zero the request counters and histograms (after the serve warmup: its requests are not traffic)."""
        self.metrics_collector.reset_counts()

    def request_close(self, timeout: float) -> None:
        """Stop accepting; let outstanding requests finish until `timeout`, then cancel the rest."""
        with self._cv:
            if self._availability.state is not AvailabilityState.FAILED:
                self._availability = Availability(AvailabilityState.SHUTTING_DOWN, "engine is closing")
            self._closing = True
            deadline = self.clock() + max(0.0, timeout)
            self._drain_deadline = deadline if self._drain_deadline is None else min(self._drain_deadline, deadline)
            self._wake = True
            self._cv.notify_all()

    # ================================ worker ============================================
    def attach_program(self, program: Program) -> None:
        self.program = program
        cfg = self.cache_config
        self.rm = ResourceManager(program, self.max_concurrency,
                                  cache=ContextCache(cfg) if cfg is not None and cfg.enabled else None)
        self._cache_on = self.rm.cache is not None
        self.max_model_len = min(self.max_model_len, program.max_model_len)
        hint = getattr(program, "warmup_prompt_lengths", None)
        if hint is not None:
            self.warmup_lengths = tuple(hint(self.prefill_chunk_tokens, self.max_model_len))
        self._publish_gauges()
        with self._cv:
            if self._availability.state is AvailabilityState.STARTING:
                self._availability = Availability(AvailabilityState.READY)

    def fail_startup(self, reason: str) -> None:
        with self._cv:
            self._availability = Availability(AvailabilityState.FAILED, reason)
            self.stopped = True
            self._cv.notify_all()

    def run(self) -> None:
        """The worker loop: one boundary after another; block when a boundary made no progress."""
        while not self.stopped:
            progress = self.step()
            if self.stopped:
                break
            if not progress:
                with self._cv:
                    if not self._wake:
                        self._cv.wait(self._idle_timeout())
        self._drop_calls()

    def _idle_timeout(self) -> float | None:
        times = [r.deadline for r in self.scheduler.waiting]
        if self._drain_deadline is not None:
            times.append(self._drain_deadline)
        return None if not times else max(0.0, min(times) - self.clock()) + 1e-3

    def step(self) -> bool:
        """Run one worker boundary. Returns whether anything changed."""
        if self.stopped:
            return False
        try:
            return self._boundary()
        except Exception as e:  # noqa: BLE001 - every failure inside the boundary fails the engine
            self.fail(f"{type(e).__name__}: {e}", tb=traceback.format_exc())
            return True

    def _boundary(self) -> bool:
        now = self.clock()
        progress = self._take_inbox()
        progress |= self._run_calls()
        progress |= self._waiting_timeouts_and_cancellations(now)          # 1
        if self.rm.transition_in_flight is not None:                       # 2
            raise InvariantError(f"resource transition {self.rm.transition_in_flight!r} left unsettled")
        progress |= self._settle_terminal_pending()                        # 3
        progress |= self._freeze_active_cancellations()                    # 4
        progress |= self._try_admission(now)                               # 5
        unit = self.scheduler.choose_unit()                                # 6
        if unit is not None:
            self._run_unit(unit)                                           # 7, 8, 9
            progress = True
        progress |= self._maybe_finish_close()
        if progress:
            self._publish_gauges()
        return progress

    # ---- 0, 1: queue ---------------------------------------------------------------------
    def _take_inbox(self) -> bool:
        with self._cv:
            self._wake = False
            new = list(self._inbox)
            self._inbox.clear()
        for rec in new:
            self.records[rec.publication_order] = rec
            self.scheduler.enqueue(rec)
            self._emit("enqueue", rec)
        return bool(new)

    def _waiting_timeouts_and_cancellations(self, now: float) -> bool:
        changed = False
        for rec in self.scheduler.waiting:
            if rec.cancel_requested:
                self.scheduler.remove_waiting(rec)
                rec.move(S.FINISHED)
                self._complete(rec, FinishReason.CANCELLED)
                changed = True
            elif now >= rec.deadline:
                self.scheduler.remove_waiting(rec)
                rec.move(S.FINISHED)
                self._error(rec, ErrorKind.QUEUE_TIMEOUT,
                            f"request waited {now - rec.submit_time:.3f}s in the queue (deadline passed)")
                changed = True
        return changed

    # ---- 3, 4: terminal ------------------------------------------------------------------
    def _settle_terminal_pending(self) -> bool:
        pending = [r for r in self.records.values() if r.state is S.TERMINAL_PENDING]
        for rec in pending:
            self._settle(rec)
            self._complete(rec, rec.terminal_reason)
        return bool(pending)

    def _freeze_active_cancellations(self) -> bool:
        snapshot = [r for r in self.scheduler.active if r.cancel_requested]
        for rec in snapshot:
            self._end_execution(rec, FinishReason.CANCELLED)
        return bool(snapshot)

    def _end_execution(self, rec: RequestRecord, reason: FinishReason) -> None:
        """Active -> TerminalPending: execution stopped; the lane keeps ownership until settled."""
        rec.move(S.TERMINAL_PENDING)
        rec.terminal_reason = reason
        self.scheduler.deactivate(rec)
        self.rm.begin_terminal(rec)
        self._emit("terminal_pending", rec, reason=reason)

    def _settle(self, rec: RequestRecord, last_tokens: tuple[int, ...] = ()) -> None:
        self.rm.settle_terminal(rec, last_tokens)
        self.scheduler.trigger.note(AdmissionEvent.LANE_FREED)
        self._emit("released", rec)

    # ---- 5: admission --------------------------------------------------------------------
    def _try_admission(self, now: float) -> bool:
        if not self.scheduler.num_waiting:
            return False
        trigger = self.scheduler.trigger
        trigger.observe_revision(self.program.resource_revision)
        if not trigger.armed:
            return False
        trigger.consume()
        if self.scheduler.prefill_owner is not None or self.rm.free_lane() is None:
            return False                   # gate closed; PREFILL_GATE_CHANGED / LANE_FREED re-arm it
        head = self.scheduler.head()
        outcome = self._admit(head, now)
        if outcome is True:
            return True
        if outcome.kind is RefusalKind.INFEASIBLE:
            self.scheduler.remove_waiting(head)
            head.move(S.FINISHED)
            self._error(head, ErrorKind.INVALID_REQUEST, f"request cannot run on this engine: {outcome.reason}")
            return True
        self.scheduler.protect_head(head, self.scheduler.active)
        for borrower in self.scheduler.borrowers():
            if self.rm.prove_backfill(head, self.scheduler.donors, borrower):
                self._emit("backfill", borrower, head=head.request_id)
                if self._admit(borrower, now) is True:
                    return True
        return False

    def _admit(self, rec: RequestRecord, now: float) -> bool | Refusal:
        """Plan, start and adopt the materialization of one waiting request."""
        for _ in range(2):
            outcome = self.rm.plan_admission(rec)
            if isinstance(outcome, Refusal):
                return outcome
            self.scheduler.remove_waiting(rec)
            rec.move(S.MATERIALIZING)
            try:
                result = self.rm.materialize(rec, outcome)
            except StalePlanError:
                rec.move(S.WAITING)
                self.scheduler.restore(rec)
                continue
            self.scheduler.trigger.note(AdmissionEvent.TRANSITION_ENDED)
            if not result.ok:
                rec.move(S.WAITING)
                self.scheduler.restore(rec)
                return Refusal(RefusalKind.SHORT_NOW, result.reason or "materialization aborted")
            self._activate(rec, result, now)
            return True
        raise InvariantError(f"the resource plan for request {rec.request_id} went stale twice "
                             f"with no other transition in between")

    def _activate(self, rec: RequestRecord, result: ResourceResult, now: float) -> None:
        if rec.prompt_logprobs is not None and result.num_reused_tokens:
            raise InvariantError(f"request {rec.request_id} asked for prompt log-probs but reuses "
                                 f"{result.num_reused_tokens} prompt tokens without computing them")
        rec.move(S.PREFILL)
        rec.num_computed_tokens = result.num_reused_tokens
        rec.admit_time = now
        self.scheduler.activate(rec)
        self._emit("active", rec, sequence=result.sequence)
        self.metrics_collector.admitted(rec.num_prompt_tokens, rec.num_reused_tokens, now - rec.submit_time)
        self._publish(rec, GenerationStart(rec.request_id, rec.num_prompt_tokens, rec.num_reused_tokens))
        if rec.cancel_requested:                 # committed but not adopted -> adopted; now the terminal path
            self._end_execution(rec, FinishReason.CANCELLED)

    # ---- 7, 8, 9: one model execution unit -----------------------------------------------
    def _run_unit(self, unit: ExecutionUnit) -> None:
        program = self.program
        self._emit("unit", None, kind=unit.kind, rows=tuple(r.request_id for r in unit.records))
        self.metrics_collector.unit(unit.kind.value, len(unit.records))
        if unit.kind is UnitKind.PREFILL:
            rec = unit.records[0]
            remaining = rec.num_prompt_tokens - rec.num_computed_tokens
            size = min(self.prefill_chunk_tokens, remaining)
            stop = self.rm.prefill_stop(rec)
            if stop is not None:
                size = min(size, stop - rec.num_computed_tokens)
            stage = program.prefill(rec.sequence, size)
            self._pending = stage.pending
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
        elif unit.kind is UnitKind.CONTROL:
            rec = unit.records[0]
            if len(rec.control_tokens) > rec.remaining_budget:
                # NOTE: a forced suffix is committed whole or not at all; without the budget for it
                # the request ends here, as it would at its next sampled token.
                self._end_execution(rec, FinishReason.LENGTH)
                return
            self._pending = program.control(rec.sequence, rec.control_tokens)
            self._consume(self._pending, unit)
        else:
            self._pending = program.decode([r.sequence for r in unit.records], self.decode_steps)
            self._consume(self._pending, unit)

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
        self._pending = None
        self._emit("program_commit", None, batch=batch.batch_id, accepted=tuple(accepted))
        now = self.clock()
        for d in decisions:                              # terminal resource result, when required
            if unit.kind is UnitKind.PREFILL:
                self.scheduler.prefill_done(d.rec)
            if d.terminal:
                self._end_execution(d.rec, d.reason)
                self._settle(d.rec, d.tokens)
        for d in decisions:
            if d.accepted:
                self._commit_row(d, now)
        for d in decisions:
            if d.terminal:
                self._complete(d.rec, d.reason)

    def _commit_row(self, d: RowDecision, now: float) -> None:
        rec = d.rec
        # budget accounting
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
        self._emit("session_commit", rec, tokens=d.tokens)
        if not d.terminal:
            forced = rec.session.forced_control()
            if forced:
                rec.control_tokens = tuple(forced)
                rec.move(S.CONTROL_READY)
            else:
                rec.control_tokens = ()
                rec.move(S.DECODE_READY)
        ttft = inter = None
        if rec.first_token_time is None:
            rec.first_token_time = now
            ttft = now - rec.submit_time
        else:
            inter = now - rec.last_token_time
        rec.last_token_time = now
        self.metrics_collector.tokens(d.accepted, ttft, inter)
        self._publish(rec, GenerationDelta(rec.request_id, d.preview.delta, d.tokens, logprobs))

    # ---- completion ----------------------------------------------------------------------
    def _usage(self, rec: RequestRecord) -> Usage:
        return Usage(rec.num_prompt_tokens, rec.num_output_tokens, rec.num_reused_tokens, rec.num_reasoning_tokens)

    def _complete(self, rec: RequestRecord, reason: FinishReason) -> None:
        """Resources and output are committed: form the final result and publish it."""
        if rec.state is not S.FINISHED:
            rec.move(S.FINISHED)
        delta, final = rec.session.finish(reason)
        if not delta.empty:
            self._publish(rec, GenerationDelta(rec.request_id, delta, ()))
        result = GenerationResult(
            request_id=rec.request_id, text=final.text, reasoning=final.reasoning, tool_calls=final.tool_calls,
            token_ids=tuple(rec.output_token_ids), finish_reason=final.finish_reason, usage=self._usage(rec),
            logprobs=tuple(rec.logprobs) if rec.logprobs is not None else None,
            extra={**self.result_extra, **final.extra},
            prompt_logprobs=(tuple(rec.prompt_logprob_entries)
                             if rec.prompt_logprob_entries is not None else None))
        self.metrics_collector.ended(reason=final.finish_reason.value, e2e=self.clock() - rec.submit_time)
        self._finish(rec, result)

    def _error(self, rec: RequestRecord, kind: ErrorKind, message: str) -> None:
        self.metrics_collector.ended(error=kind.value)
        self._finish(rec, GenerationError(rec.request_id, kind, message, self._usage(rec)))

    def _finish(self, rec: RequestRecord, event: GenerationResult | GenerationError) -> None:
        self.records.pop(rec.publication_order, None)
        self._publish(rec, event)
        rec.ticket.mark_response_done()

    def _publish(self, rec: RequestRecord, event: GenerationEvent) -> None:
        self._emit("publish", rec, event=event)
        rec.ticket.channel.put(event)

    def _emit(self, what: str, rec: RequestRecord | None, **info: Any) -> None:
        if self._trace is not None:
            info["request_id"] = rec.request_id if rec is not None else None
            if rec is not None:
                info["state"] = rec.state
            self._trace(what, info)

    # ---- observations, close, failure -------------------------------------------------------
    def _publish_gauges(self) -> None:
        revision = self.program.resource_revision
        capacity = None
        if revision != self._capacity_revision:
            capacity = self.program.capacity()
            self._capacity_revision = revision
            if self.rm.cache is not None:
                self.metrics_collector.cache(self.rm.cache.stats, self.program.cache_usage())
        with self._cv:
            waiting = self.scheduler.num_waiting + len(self._inbox)
        self.metrics_collector.gauges(self.rm.num_busy_lanes, waiting, capacity)

    def _maybe_finish_close(self) -> bool:
        if not self._closing:
            return False
        if self._drain_deadline is not None and self.clock() >= self._drain_deadline:
            for rec in list(self.records.values()):
                rec.ticket.cancel_requested = True
        with self._cv:
            idle = not self.records and not self._inbox
            if idle:
                self.stopped = True
        return idle

    def _cleanup(self, what: str, call: Callable[[Any], Any], arg: Any) -> None:
        """Best effort once the engine has failed: a cleanup error is logged and traced, never raised."""
        try:
            call(arg)
        except Exception as e:  # noqa: BLE001 - the engine is already failed; keep cleaning up
            _log.warning("engine failure cleanup: %s(%r) raised %s: %s", what, arg, type(e).__name__, e)
            self._emit("cleanup_error", None, call=what, error=f"{type(e).__name__}: {e}")

    def fail(self, reason: str, tb: str = "") -> None:
        """Engine-wide failure: end Program's transactions, release, clear, answer everyone. Idempotent."""
        with self._cv:
            if self._availability.state is AvailabilityState.FAILED and self.stopped:
                return
            self._availability = Availability(AvailabilityState.FAILED, reason)
            self.stopped = True
        self._emit("engine_failed", None, reason=reason, traceback=tb)
        program = self.program
        if program is not None and self._pending is not None and not self._pending.consumed:
            self._cleanup("abort_pending", program.abort_pending, self._pending)
        self._pending = None
        if program is not None:
            for rec in self.records.values():
                if rec.sequence is not None:
                    self._cleanup("release", program.release, rec.sequence)
                    rec.sequence = None
        if self.rm is not None:
            self.rm.clear()
        self.scheduler.clear()
        with self._cv:
            inbox = list(self._inbox)
            self._inbox.clear()
        self._drop_calls()
        for rec in list(self.records.values()) + inbox:
            rec.force_finished()
            self._error(rec, ErrorKind.ENGINE_FAILED, f"engine failed: {reason}")
        self.records.clear()
