"""Admission: boundary step 5, one attempt to move a waiting request into a lane (worker-only).

    armed trigger + open prefill gate + a free lane
      -> the FIFO head: plan (ResourceManager asks Program) -> materialize -> adopt -> Active
      -> refused SHORT_NOW: protect the head; a later request may backfill if ResourceManager
         proves the head still enters once its donors finish
      -> refused INFEASIBLE: the head ends with INVALID_REQUEST (it cannot run even on an empty engine)

A plan that went stale before it started is planned again once; a materialization that aborted
puts the request back at its FIFO position. The Scheduler decides which request may be tried
(`admission_policy.AdmissionTrigger` decides when); ResourceManager decides its resource end state.
"""
from __future__ import annotations

from ninfer.config import ErrorKind, GenerationStart
from ninfer.contract.frontend import FinishReason
from ninfer.contract.program import InvariantError, Program, Refusal, RefusalKind, ResourceResult, StalePlanError
from ninfer.engine.admission_policy import AdmissionEvent
from ninfer.engine.metrics import MetricsCollector
from ninfer.engine.publication import Publisher
from ninfer.engine.request_record import RequestRecord, RequestState
from ninfer.engine.resource_manager import ResourceManager
from ninfer.engine.scheduler import Scheduler
from ninfer.engine.terminal import TerminalPath

S = RequestState


class Admission:
    def __init__(self, program: Program, scheduler: Scheduler, rm: ResourceManager, terminal: TerminalPath,
                 publisher: Publisher, metrics: MetricsCollector):
        self.program = program
        self.scheduler = scheduler
        self.rm = rm
        self.terminal = terminal
        self.publisher = publisher
        self.metrics = metrics

    def try_admission(self, now: float) -> bool:
        """One admission attempt when the trigger is armed and the gate is open; whether anything changed."""
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
            self.publisher.error(head, ErrorKind.INVALID_REQUEST,
                                 f"request cannot run on this engine: {outcome.reason}")
            return True
        self.scheduler.protect_head(head, self.scheduler.active)
        for borrower in self.scheduler.borrowers():
            if self.rm.prove_backfill(head, self.scheduler.donors, borrower):
                self.publisher.emit("backfill", borrower, head=head.request_id)
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
        self.publisher.emit("active", rec, sequence=result.sequence)
        self.metrics.admitted(rec.num_prompt_tokens, rec.num_reused_tokens, now - rec.submit_time)
        self.publisher.publish(rec, GenerationStart(rec.request_id, rec.num_prompt_tokens, rec.num_reused_tokens))
        if rec.cancel_requested:                 # committed but not adopted -> adopted; now the terminal path
            self.terminal.end_execution(rec, FinishReason.CANCELLED)
