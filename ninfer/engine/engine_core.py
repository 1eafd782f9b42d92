"""EngineCore: the single worker that owns request order, lifecycle and publication.

Only the worker thread touches request records, the Scheduler, the ResourceManager and Program.
Submit threads append to the inbox; consumers set flags on their ticket; both wake the worker
through one condition (`RequestIntake`, the only state the threads share). The worker blocks on it
when there is nothing to do (no busy waiting), waking early for the next queue deadline or the
drain deadline of `close`.

One worker boundary (`step`), in the semantic order of architecture.md §5, and who runs each step:
  0. take new submissions from the inbox into the FIFO queue      RequestIntake -> Scheduler
  1. take timeouts and cancellations of waiting requests          TerminalPath.expire_waiting
  2. advance started resource transitions (none: Program's transitions complete synchronously)
  3. settle TerminalPending requests (release, adopt, lane Free, final response)
                                                                  TerminalPath.settle_pending
  4. freeze the active cancellation snapshot (cancelled Active requests -> TerminalPending)
                                                                  TerminalPath.freeze_cancellations
  5. try one admission when the fairness gate allows and an admission event happened
                                                                  Admission.try_admission
  6. choose staged prefill, forced control or a compact decode round     Scheduler.choose_unit
  7. run at most one model execution unit                         UnitExecutor.run
  8. commit model (Program), terminal resources, budget, Frontend output state     UnitExecutor
  9. publish response events and observations                     Publisher; gauges here
A cancellation that arrives while a unit runs is seen by the unit's commit decision (a cancelled
row: zero accepted tokens, terminal) -- still inside the worker, at one linearised point.

Any Program or invariant failure fails the whole Engine (`fail`): Program's pending transaction
is aborted first, then active sequences are released, then ResourceManager is cleared and every
outstanding request completes with an ENGINE_FAILED error. The worker then exits.

Who owns what: RequestIntake the cross-thread state (inbox, calls, availability, close);
Publisher the table of outstanding records and every event sent to a consumer; Scheduler the
queue, the prefill gate and round membership; ResourceManager the lanes and the context cache;
UnitExecutor the batch of the running unit. EngineCore composes them and runs the loop.
"""
from __future__ import annotations

import logging
import time
import traceback
from concurrent.futures import Future
from typing import Any, Callable

from ninfer.config import Availability, EngineMetrics, ErrorKind
from ninfer.contract.frontend import OutputOptions, PreparedPrompt
from ninfer.contract.program import InvariantError, Program, SamplingParams
from ninfer.engine.admission import Admission
from ninfer.engine.admission_policy import OutstandingCapacity
from ninfer.engine.context_cache import CacheConfig, ContextCache
from ninfer.engine.handle import GenerationHandle
from ninfer.engine.intake import RequestIntake
from ninfer.engine.metrics import MetricsCollector
from ninfer.engine.publication import Publisher, Trace
from ninfer.engine.request_record import RequestRecord
from ninfer.engine.resource_manager import ResourceManager
from ninfer.engine.scheduler import Scheduler
from ninfer.engine.terminal import TerminalPath
from ninfer.engine.unit_executor import UnitExecutor

__all__ = ["DECODE_STEPS", "EngineCore", "Trace"]
_log = logging.getLogger(__name__)


# NOTE: tokens a decode round asks of each row (the Engine's default; `ninfer.engine.facade` sizes the Program's
#       provisional area from it).
DECODE_STEPS = 1


class EngineCore:
    def __init__(self, frontend: Any, *, max_concurrency: int, queue_size: int, request_timeout_s: float,
                 prefill_chunk_tokens: int, max_model_len: int, decode_steps: int = DECODE_STEPS,
                 clock: Callable[[], float] = time.monotonic, trace: Trace | None = None,
                 cache: CacheConfig | None = None):
        self.frontend = frontend
        self.max_concurrency = max_concurrency
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.decode_steps = decode_steps
        self.cache_config = cache
        self.clock = clock
        self.capacity = OutstandingCapacity(max_concurrency + queue_size)
        self.metrics_collector = MetricsCollector(max_concurrency, queue_size, self.capacity.limit)
        self.intake = RequestIntake(frontend, self.metrics_collector, self.capacity,
                                    max_concurrency=max_concurrency, queue_size=queue_size,
                                    request_timeout_s=request_timeout_s, max_model_len=max_model_len, clock=clock)
        self.publisher = Publisher(self.metrics_collector, clock, trace)
        # the serve warmup's prompt lengths (`Engine.warm_up`), a host value read from Program at attach
        self.warmup_lengths: tuple[int, ...] = ()
        # worker-owned (the collaborators that need Program are built by attach_program)
        self.program: Program | None = None
        self.scheduler = Scheduler()
        self.rm: ResourceManager | None = None
        self.terminal: TerminalPath | None = None
        self.admission: Admission | None = None
        self.units: UnitExecutor | None = None
        self._capacity_revision: int | None = None

    # ---- facts other objects own, read through the core ----------------------------------
    @property
    def availability(self) -> Availability:
        return self.intake.availability

    @property
    def stopped(self) -> bool:
        return self.intake.stopped

    @property
    def max_model_len(self) -> int:
        """prompt + max_tokens + lookahead limit of one request (capped by Program's once attached)."""
        return self.intake.max_model_len

    @property
    def lookahead(self) -> int:
        """Positions each request reserves past its output (speculation's drafts; 0 without), counted in
        max_model_len: prompt + max_tokens + lookahead <= max_model_len. Known once Program is attached."""
        return self.intake.lookahead

    @property
    def records(self) -> dict[int, RequestRecord]:
        """publication_order -> record of every outstanding request (worker-only)."""
        return self.publisher.records

    @property
    def result_extra(self) -> dict:
        """Entries added to every GenerationResult.extra (e.g. {"synthetic_weights": True})."""
        return self.publisher.result_extra

    @result_extra.setter
    def result_extra(self, extra: dict) -> None:
        self.publisher.result_extra = extra

    # ================================ any thread ========================================
    def wake(self) -> None:
        self.intake.wake()

    def submit(self, prompt: PreparedPrompt, sampling: SamplingParams, *, max_tokens: int,
               output: OutputOptions = OutputOptions(), request_id: str | None = None,
               deadline_s: float | None = None, prompt_logprobs: int | None = None,
               session_id: str | None = None, context_cache: bool = True) -> GenerationHandle:
        """Accept one request or raise EngineRequestError(OVERLOADED | NOT_READY | INVALID_REQUEST)
        (`RequestIntake.submit`)."""
        return self.intake.submit(prompt, sampling, max_tokens=max_tokens, output=output, request_id=request_id,
                                  deadline_s=deadline_s, prompt_logprobs=prompt_logprobs, session_id=session_id,
                                  context_cache=context_cache)

    def call_on_worker(self, fn: Callable[[], Any]) -> Future:
        """Run fn() on the worker thread at the start of its next boundary, between model execution units
        (serve warmup: PyTorch keeps cuDNN attention plans per thread, so a plan made on any other thread
        is not the one a request finds). Returns a Future of fn's result; an exception raised by fn is set
        on it and does not fail the engine. A call not yet run when the worker stops (close, failure)
        ends with EngineRequestError(NOT_READY). fn must not touch requests, resources or Program state."""
        return self.intake.call_on_worker(fn)

    def plan_attention(self) -> Future:
        """The Program's `warmup_attention_plans(stage size, max_model_len)` on the worker (serve warmup),
        as a Future of (shapes run, shapes in all); (0, 0) for a Program without that hook."""
        def run():
            hook = getattr(self.program, "warmup_attention_plans", None)
            return (0, 0) if hook is None else hook(self.prefill_chunk_tokens, self.max_model_len)
        return self.call_on_worker(run)

    def metrics(self) -> EngineMetrics:
        return self.metrics_collector.snapshot(self.availability, self.capacity.used)

    def reset_request_metrics(self) -> None:
        """Zero the request counters and histograms (after the serve warmup: its requests are not traffic)."""
        self.metrics_collector.reset_counts()

    def request_close(self, timeout: float) -> None:
        """Stop accepting; let outstanding requests finish until `timeout`, then cancel the rest."""
        self.intake.request_close(self.clock() + max(0.0, timeout))

    # ================================ worker ============================================
    def attach_program(self, program: Program) -> None:
        self.program = program
        cfg = self.cache_config
        self.rm = ResourceManager(program, self.max_concurrency,
                                  cache=ContextCache(cfg) if cfg is not None and cfg.enabled else None)
        self.terminal = TerminalPath(self.scheduler, self.rm, self.publisher)
        self.admission = Admission(program, self.scheduler, self.rm, self.terminal, self.publisher,
                                   self.metrics_collector)
        self.units = UnitExecutor(program, self.scheduler, self.rm, self.terminal, self.publisher,
                                  self.metrics_collector, self.clock, prefill_chunk_tokens=self.prefill_chunk_tokens,
                                  decode_steps=self.decode_steps)
        max_model_len = min(self.max_model_len, program.max_model_len)
        # NOTE: speculation's lookahead (Program.lookahead, K drafts past the last token) is reserved with every
        # request (MaterializationPlanner) and counted in the prompt + max_tokens limit (RequestIntake).
        lookahead = int(getattr(program, "lookahead", 0))
        if lookahead:
            self.metrics_collector.speculative(lookahead)
            self.publisher.speculative = True
        hint = getattr(program, "warmup_prompt_lengths", None)
        if hint is not None:
            self.warmup_lengths = tuple(hint(self.prefill_chunk_tokens, max_model_len - lookahead))
        self._publish_gauges()
        self.intake.open(max_model_len, use_cache=self.rm.cache is not None, lookahead=lookahead,
                         supports_media=bool(getattr(self.program, "supports_media", False)),
                         media_patch_limit=int(getattr(self.program, "media_patch_limit", 0)))

    def fail_startup(self, reason: str) -> None:
        self.intake.fail(reason)

    def run(self) -> None:
        """The worker loop: one boundary after another; block when a boundary made no progress."""
        while not self.stopped:
            progress = self.step()
            if self.stopped:
                break
            if not progress:
                self.intake.wait(self._idle_timeout())
        self.intake.drop_calls()

    def _idle_timeout(self) -> float | None:
        times = [r.deadline for r in self.scheduler.waiting]
        if self.intake.drain_deadline is not None:
            times.append(self.intake.drain_deadline)
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
        progress = self._take_inbox()                                      # 0
        progress |= self.intake.run_calls()
        progress |= self.terminal.expire_waiting(now)                      # 1
        if self.rm.transition_in_flight is not None:                       # 2
            raise InvariantError(f"resource transition {self.rm.transition_in_flight!r} left unsettled")
        progress |= self.terminal.settle_pending(list(self.records.values()))   # 3
        progress |= self.terminal.freeze_cancellations()                   # 4
        progress |= self.admission.try_admission(now)                      # 5
        unit = self.scheduler.choose_unit()                                # 6
        if unit is not None:
            self.units.run(unit)                                           # 7, 8, 9
            progress = True
        progress |= self._maybe_finish_close()
        if progress:
            self._publish_gauges()
        return progress

    def _take_inbox(self) -> bool:
        new = self.intake.take_new()
        for rec in new:
            self.publisher.add(rec)
            self.scheduler.enqueue(rec)
            self.publisher.emit("enqueue", rec)
        return bool(new)

    # ---- observations, close, failure -------------------------------------------------------
    def _publish_gauges(self) -> None:
        revision = self.program.resource_revision
        capacity = None
        if revision != self._capacity_revision:
            capacity = self.program.capacity()
            self._capacity_revision = revision
            if self.rm.cache is not None:
                self.metrics_collector.cache(self.rm.cache.stats, self.program.cache_usage())
        waiting = self.scheduler.num_waiting + self.intake.num_inbox
        self.metrics_collector.gauges(self.rm.num_busy_lanes, waiting, capacity)

    def _maybe_finish_close(self) -> bool:
        if not self.intake.closing:
            return False
        if self.intake.drain_deadline is not None and self.clock() >= self.intake.drain_deadline:
            for rec in list(self.records.values()):
                rec.ticket.cancel_requested = True
        return self.intake.stop_if_drained(len(self.records))

    def _cleanup(self, what: str, call: Callable[[Any], Any], arg: Any) -> None:
        """Best effort once the engine has failed: a cleanup error is logged and traced, never raised."""
        try:
            call(arg)
        except Exception as e:  # noqa: BLE001 - the engine is already failed; keep cleaning up
            _log.warning("engine failure cleanup: %s(%r) raised %s: %s", what, arg, type(e).__name__, e)
            self.publisher.emit("cleanup_error", None, call=what, error=f"{type(e).__name__}: {e}")

    def fail(self, reason: str, tb: str = "") -> None:
        """Engine-wide failure: end Program's transactions, release, clear, answer everyone. Idempotent."""
        if not self.intake.fail(reason):
            return
        self.publisher.emit("engine_failed", None, reason=reason, traceback=tb)
        program = self.program
        pending = self.units.pending if self.units is not None else None
        if program is not None and pending is not None and not pending.consumed:
            self._cleanup("abort_pending", program.abort_pending, pending)
        if self.units is not None:
            self.units.pending = None
        if program is not None:
            for rec in self.records.values():
                if rec.sequence is not None:
                    self._cleanup("release", program.release, rec.sequence)
                    rec.sequence = None
        if self.rm is not None:
            self.rm.clear()
        self.scheduler.clear()
        inbox = self.intake.take_all()
        self.intake.drop_calls()
        for rec in list(self.records.values()) + inbox:
            rec.force_finished()
            self.publisher.error(rec, ErrorKind.ENGINE_FAILED, f"engine failed: {reason}")
        self.records.clear()
