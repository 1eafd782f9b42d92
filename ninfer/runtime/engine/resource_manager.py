"""ResourceManager: logical lanes and (later) the context-cache catalog; adopts Program's results.

Lane states (architecture.md §4):

    Free -> Materializing -> Active -> TerminalPending -> Free

    lane    state            request         sequence (Program's name, adopted from a ResourceResult)
    ----    -----            -------         --------
    0       Active           req #12         seq 3 gen 1
    1       TerminalPending  req #9          seq 1 gen 4     (released only when settled)
    2       Free             -               -

A lane is Engine's long-lived active position; it is not a StateImage slot, a KV row or a batch
row, and none of those is derived from it. ResourceManager keeps no mirror of pages, slots or
free space: it asks Program (plan, proof, summary) and adopts the ResourceResult Program returns.
Every resource transition (materialization, terminal release) runs through here, at most one
at a time (invariant 5).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

from ninfer.runtime.contract.types import (InvariantError, Program, Refusal, ResourcePlan, ResourceResult,
                                           SequenceHandle, StalePlanError)
from ninfer.runtime.engine.materialization_planner import MaterializationPlanner
from ninfer.runtime.engine.request_record import RequestRecord


class LaneState(enum.Enum):
    FREE = "free"
    MATERIALIZING = "materializing"
    ACTIVE = "active"
    TERMINAL_PENDING = "terminal_pending"


class Retention(enum.Enum):
    RELEASE = "release"
    RETAIN = "retain"          # publish a checkpoint (context cache, a later issue)


@dataclass
class Lane:
    index: int
    state: LaneState = LaneState.FREE
    publication_order: int | None = None
    sequence: SequenceHandle | None = None


class ResourceManager:
    def __init__(self, program: Program, num_lanes: int, planner: MaterializationPlanner | None = None):
        self.program = program
        self.planner = planner or MaterializationPlanner(program)
        self.lanes = [Lane(i) for i in range(num_lanes)]
        self._transition: str | None = None       # the one global resource transition in flight
        self.num_transitions = 0

    # ---- summaries -----------------------------------------------------------------------
    def free_lane(self) -> int | None:
        for lane in self.lanes:
            if lane.state is LaneState.FREE:
                return lane.index
        return None

    @property
    def num_busy_lanes(self) -> int:
        return sum(lane.state is not LaneState.FREE for lane in self.lanes)

    @property
    def transition_in_flight(self) -> str | None:
        return self._transition

    # ---- planning (pure: no Program mutation) --------------------------------------------
    def plan_admission(self, rec: RequestRecord) -> ResourcePlan | Refusal:
        return self.planner.plan(rec)

    def prove_backfill(self, head: RequestRecord, donors: Sequence[RequestRecord], borrower: RequestRecord) -> bool:
        handles = [d.sequence for d in donors if d.sequence is not None]
        return bool(self.program.prove_backfill(self.planner.sequence_request(head), handles,
                                                self.planner.sequence_request(borrower)))

    # ---- transitions ---------------------------------------------------------------------
    def _begin(self, what: str) -> None:
        if self._transition is not None:
            raise InvariantError(f"resource transition {what!r} started while {self._transition!r} is unsettled")
        self._transition = what
        self.num_transitions += 1

    def _end(self) -> None:
        self._transition = None

    def materialize(self, rec: RequestRecord, plan: ResourcePlan) -> ResourceResult:
        """Claim a lane, run Program's transition, adopt its complete result.

        Returns the adopted result: ok -> the lane is Active with the sequence; not ok -> the
        lane is Free again. Raises StalePlanError (lane Free, nothing mutated) to ask for a re-plan.
        """
        index = self.free_lane()
        if index is None:
            raise InvariantError("materialization without a free lane")
        lane = self.lanes[index]
        lane.state, lane.publication_order = LaneState.MATERIALIZING, rec.publication_order
        rec.lane = index
        self._begin(f"materialize request {rec.request_id}")
        try:
            result = self.program.start_materialize(plan)
        except StalePlanError:
            self._unclaim(lane, rec)
            raise
        finally:
            self._end()
        self._adopt_materialization(lane, rec, result)
        return result

    def _unclaim(self, lane: Lane, rec: RequestRecord) -> None:
        lane.state, lane.publication_order, lane.sequence = LaneState.FREE, None, None
        rec.lane = None

    def _adopt_materialization(self, lane: Lane, rec: RequestRecord, result: ResourceResult) -> None:
        if not isinstance(result, ResourceResult):
            raise InvariantError(f"start_materialize returned {type(result).__name__}")
        if not result.ok:
            if result.sequence is not None or result.pages_held or result.slots_held:
                raise InvariantError(f"aborted materialization still holds resources: {result}")
            self._unclaim(lane, rec)
            return
        if result.sequence is None:
            raise InvariantError("materialization succeeded without a sequence")
        if any(other.sequence == result.sequence for other in self.lanes if other is not lane):
            raise InvariantError(f"sequence {result.sequence} is already owned by another lane")
        if not (0 <= result.num_reused_tokens < rec.num_prompt_tokens):
            raise InvariantError(f"reused {result.num_reused_tokens} of {rec.num_prompt_tokens} prompt tokens")
        lane.state, lane.sequence = LaneState.ACTIVE, result.sequence
        rec.sequence = result.sequence
        rec.num_reused_tokens = result.num_reused_tokens

    def begin_terminal(self, rec: RequestRecord) -> None:
        lane = self._lane_of(rec, LaneState.ACTIVE)
        lane.state = LaneState.TERMINAL_PENDING

    def choose_retention(self, rec: RequestRecord) -> Retention:
        # NOTE (context-cache seam): retain publishes a complete checkpoint at the final frontier
        # and updates the SessionIndex if rec.publication_order is newer than the binding. Until
        # the catalog exists every terminal request releases.
        return Retention.RELEASE

    def settle_terminal(self, rec: RequestRecord) -> ResourceResult:
        """TerminalPending -> (retain | release) -> adopt -> lane Free."""
        lane = self._lane_of(rec, LaneState.TERMINAL_PENDING)
        retention = self.choose_retention(rec)
        assert retention is Retention.RELEASE
        self._begin(f"release request {rec.request_id}")
        try:
            result = self.program.release(lane.sequence)
        finally:
            self._end()
        if not isinstance(result, ResourceResult) or not result.ok or result.pages_held or result.slots_held:
            raise InvariantError(f"release of {lane.sequence} did not end in a clean state: {result}")
        self._unclaim(lane, rec)
        rec.sequence = None
        return result

    def _lane_of(self, rec: RequestRecord, expect: LaneState) -> Lane:
        if rec.lane is None:
            raise InvariantError(f"request {rec.request_id} holds no lane")
        lane = self.lanes[rec.lane]
        if lane.state is not expect or lane.publication_order != rec.publication_order:
            raise InvariantError(f"lane {lane.index} is {lane.state.value} for order {lane.publication_order}, "
                                 f"expected {expect.value} for request {rec.request_id}")
        return lane

    def clear(self) -> None:
        """Engine-wide failure cleanup, after Program's transactions ended and active state was released."""
        self._transition = None
        for lane in self.lanes:
            lane.state, lane.publication_order, lane.sequence = LaneState.FREE, None, None
