"""TerminalPath: how a request's execution ends and its lane is given back (worker-only).

    Waiting ---------------- cancelled / deadline passed ----------------------------> Finished
    Active --end_execution--> TerminalPending --settle--> (lane Free) --complete/error--> Finished

A request that never left the queue ends at once (boundary step 1). An Active request first stops
executing (`end_execution`: it leaves the Scheduler's rounds; its lane keeps the resources), then is
settled (`settle`: ResourceManager releases or adopts the sequence, the lane is free), and only
then its final event is published. A unit's commit settles its own terminal rows at once (with
their last accepted tokens); a request that ended any other way is settled at step 3 of the next
boundary. Cancellation of an Active request is frozen at step 4 (architecture.md §6, Cancellation).
"""
from __future__ import annotations

from ninfer.config import ErrorKind
from ninfer.contract.frontend import FinishReason
from ninfer.engine.admission_policy import AdmissionEvent
from ninfer.engine.publication import Publisher
from ninfer.engine.request_record import RequestRecord, RequestState
from ninfer.engine.resource_manager import ResourceManager
from ninfer.engine.scheduler import Scheduler

S = RequestState


class TerminalPath:
    def __init__(self, scheduler: Scheduler, rm: ResourceManager, publisher: Publisher):
        self.scheduler = scheduler
        self.rm = rm
        self.publisher = publisher

    # ---- 1: waiting requests -------------------------------------------------------------
    def expire_waiting(self, now: float) -> bool:
        """End the waiting requests that were cancelled or whose queue deadline passed."""
        changed = False
        for rec in self.scheduler.waiting:
            if rec.cancel_requested:
                self.scheduler.remove_waiting(rec)
                rec.move(S.FINISHED)
                self.publisher.complete(rec, FinishReason.CANCELLED)
                changed = True
            elif now >= rec.deadline:
                self.scheduler.remove_waiting(rec)
                rec.move(S.FINISHED)
                self.publisher.error(rec, ErrorKind.QUEUE_TIMEOUT,
                                     f"request waited {now - rec.submit_time:.3f}s in the queue (deadline passed)")
                changed = True
        return changed

    # ---- 3, 4: active requests -----------------------------------------------------------
    def settle_pending(self, records: list[RequestRecord]) -> bool:
        """Settle and complete every TerminalPending request among `records`."""
        pending = [r for r in records if r.state is S.TERMINAL_PENDING]
        for rec in pending:
            self.settle(rec)
            self.publisher.complete(rec, rec.terminal_reason)
        return bool(pending)

    def freeze_cancellations(self) -> bool:
        """The active cancellation snapshot: cancelled Active requests -> TerminalPending."""
        snapshot = [r for r in self.scheduler.active if r.cancel_requested]
        for rec in snapshot:
            self.end_execution(rec, FinishReason.CANCELLED)
        return bool(snapshot)

    def end_execution(self, rec: RequestRecord, reason: FinishReason) -> None:
        """Active -> TerminalPending: execution stopped; the lane keeps ownership until settled."""
        rec.move(S.TERMINAL_PENDING)
        rec.terminal_reason = reason
        self.scheduler.deactivate(rec)
        self.rm.begin_terminal(rec)
        self.publisher.emit("terminal_pending", rec, reason=reason)

    def settle(self, rec: RequestRecord, last_tokens: tuple[int, ...] = ()) -> None:
        """Release or adopt the request's resources; its lane is free."""
        self.rm.settle_terminal(rec, last_tokens)
        self.scheduler.trigger.note(AdmissionEvent.LANE_FREED)
        self.publisher.emit("released", rec)
