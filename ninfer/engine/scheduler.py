"""Scheduler: request order, the staged-prefill gate, fairness between units, round membership.

It owns (architecture.md §5):
  - the FIFO waiting queue and its head (ordered by publication_order);
  - the staged-prefill owner (at most one request consumes its prompt at a time);
  - the fairness rotation between prefill stages, forced-control units and decode rounds, so that
    existing decode work is never starved by consecutive prefill stages;
  - the membership of each decode round: all and only the decode-ready requests, exact B;
  - the protected head and donor set of a blocked FIFO head (backfill protection).
It never reads resource vectors, checkpoint payloads or allocator state: Program answers
feasibility, ResourceManager turns the answer into lanes.
"""
from __future__ import annotations

import bisect
import enum
from collections import deque
from typing import NamedTuple

from ninfer.engine.admission_policy import AdmissionEvent, AdmissionTrigger
from ninfer.engine.request_record import RequestRecord, RequestState


class UnitKind(enum.Enum):
    PREFILL = "prefill"
    CONTROL = "control"
    DECODE = "decode"


_ROTATION = (UnitKind.PREFILL, UnitKind.CONTROL, UnitKind.DECODE)


class ExecutionUnit(NamedTuple):
    kind: UnitKind
    records: tuple[RequestRecord, ...]      # row order of the unit


class Scheduler:
    def __init__(self) -> None:
        self._waiting: deque[RequestRecord] = deque()
        self._active: list[RequestRecord] = []        # activation order; decode rows follow it
        self.prefill_owner: RequestRecord | None = None
        self.protected_head: RequestRecord | None = None
        self.donors: tuple[RequestRecord, ...] = ()
        self.trigger = AdmissionTrigger()
        self._last_kind: UnitKind | None = None

    # ---- waiting queue -------------------------------------------------------------------
    @property
    def waiting(self) -> tuple[RequestRecord, ...]:
        return tuple(self._waiting)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def head(self) -> RequestRecord | None:
        return self._waiting[0] if self._waiting else None

    def enqueue(self, rec: RequestRecord) -> None:
        if self._waiting and self._waiting[-1].publication_order >= rec.publication_order:
            raise AssertionError("requests must enter the queue in publication_order")
        self._waiting.append(rec)
        self.trigger.note(AdmissionEvent.QUEUE_CHANGED)

    def restore(self, rec: RequestRecord) -> None:
        """Put a request whose materialization aborted back at its FIFO position."""
        orders = [r.publication_order for r in self._waiting]
        self._waiting.insert(bisect.bisect_left(orders, rec.publication_order), rec)
        self.trigger.note(AdmissionEvent.QUEUE_CHANGED)

    def remove_waiting(self, rec: RequestRecord) -> None:
        self._waiting.remove(rec)
        if rec is self.protected_head:
            self.clear_protection()
        self.trigger.note(AdmissionEvent.QUEUE_CHANGED)

    # ---- admission order -----------------------------------------------------------------
    def protect_head(self, head: RequestRecord, incumbents: tuple[RequestRecord, ...]) -> None:
        """The head is short of resources now: remember it and the donors that must finish for it."""
        if self.protected_head is not head:
            self.protected_head = head
            self.donors = incumbents
        else:
            live = set(map(id, incumbents))
            self.donors = tuple(d for d in self.donors if id(d) in live)

    def clear_protection(self) -> None:
        self.protected_head = None
        self.donors = ()

    def borrowers(self) -> tuple[RequestRecord, ...]:
        """Waiting requests behind a protected head, in FIFO order (each needs Program's proof)."""
        if self.protected_head is None or not self._waiting or self._waiting[0] is not self.protected_head:
            return ()
        return tuple(r for r in list(self._waiting)[1:] if not r.cancel_requested)

    # ---- active set ----------------------------------------------------------------------
    @property
    def active(self) -> tuple[RequestRecord, ...]:
        return tuple(self._active)

    def activate(self, rec: RequestRecord) -> None:
        if self.prefill_owner is not None:
            raise AssertionError("a second staged-prefill request was admitted")
        self._active.append(rec)
        self.prefill_owner = rec
        self.trigger.note(AdmissionEvent.PREFILL_GATE_CHANGED)

    def prefill_done(self, rec: RequestRecord) -> None:
        if self.prefill_owner is rec:
            self.prefill_owner = None
            self.trigger.note(AdmissionEvent.PREFILL_GATE_CHANGED)

    def deactivate(self, rec: RequestRecord) -> None:
        """Execution ended (the request enters TerminalPending)."""
        self.prefill_done(rec)
        self._active.remove(rec)

    def clear(self) -> None:
        self._waiting.clear()
        self._active.clear()
        self.prefill_owner = None
        self.clear_protection()

    # ---- units ---------------------------------------------------------------------------
    def choose_unit(self) -> ExecutionUnit | None:
        """The next model execution unit, rotating over the kinds that have work.

        The rotation guarantees that after a prefill stage a waiting decode round (or control
        unit) runs before the next prefill stage, and that no kind waits more than two units.
        """
        work: dict[UnitKind, tuple[RequestRecord, ...]] = {}
        owner = self.prefill_owner
        if owner is not None and owner.state is RequestState.PREFILL:
            work[UnitKind.PREFILL] = (owner,)
        control = [r for r in self._active if r.state is RequestState.CONTROL_READY]
        if control:
            work[UnitKind.CONTROL] = (control[0],)
        decode = tuple(r for r in self._active if r.state is RequestState.DECODE_READY)
        if decode:
            work[UnitKind.DECODE] = decode
        if not work:
            return None
        start = 0 if self._last_kind is None else (_ROTATION.index(self._last_kind) + 1) % len(_ROTATION)
        for i in range(len(_ROTATION)):
            kind = _ROTATION[(start + i) % len(_ROTATION)]
            if kind in work:
                self._last_kind = kind
                return ExecutionUnit(kind, work[kind])
        raise AssertionError("unreachable")
