"""Admission policy: outstanding capacity at submit, and when the worker re-checks admission.

Outstanding capacity bounds the requests the Engine holds for consumers: every accepted request
takes one unit at submit and gives it back once `response_done && consumer_released`
(architecture.md §4). The bound is `max_concurrency + queue_size`: all lanes busy plus a full
FIFO queue. A submit beyond it is rejected at once (ErrorKind.OVERLOADED).

Admission is re-checked only when a fact that can change its outcome changed (§5):
  - the waiting queue or its FIFO head changed;
  - a lane was freed;
  - the staged-prefill gate changed;
  - a resource transition reached its end state;
  - Program's global resource_revision changed.
Decode progress, output publication and statistics never trigger a re-check.
"""
from __future__ import annotations

import enum
import threading


class OutstandingCapacity:
    """Thread-safe counter of outstanding requests (submit threads take, ticket release gives back)."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"outstanding capacity must be >= 1, got {limit}")
        self.limit = limit
        self._used = 0
        self._lock = threading.RLock()      # NOTE: re-entrant: handle finalizers may release from any thread

    def try_acquire(self) -> bool:
        with self._lock:
            if self._used >= self.limit:
                return False
            self._used += 1
            return True

    def release(self) -> None:
        with self._lock:
            if self._used <= 0:
                raise RuntimeError("outstanding capacity released more often than acquired")
            self._used -= 1

    @property
    def used(self) -> int:
        return self._used

    @property
    def free(self) -> int:
        return self.limit - self._used


class AdmissionEvent(enum.Enum):
    QUEUE_CHANGED = "queue_changed"
    LANE_FREED = "lane_freed"
    PREFILL_GATE_CHANGED = "prefill_gate_changed"
    TRANSITION_ENDED = "transition_ended"
    REVISION_CHANGED = "revision_changed"


class AdmissionTrigger:
    """Remembers whether an admission attempt could now have a different outcome (worker-only)."""

    def __init__(self) -> None:
        self._pending: set[AdmissionEvent] = {AdmissionEvent.QUEUE_CHANGED}
        self._last_revision: int | None = None
        self.num_checks = 0

    def note(self, event: AdmissionEvent) -> None:
        self._pending.add(event)

    def observe_revision(self, revision: int) -> None:
        if revision != self._last_revision:
            self._last_revision = revision
            self._pending.add(AdmissionEvent.REVISION_CHANGED)

    @property
    def armed(self) -> bool:
        return bool(self._pending)

    def consume(self) -> frozenset[AdmissionEvent]:
        """Take the reasons for this attempt; the trigger is disarmed until the next event."""
        reasons, self._pending = frozenset(self._pending), set()
        self.num_checks += 1
        return reasons
