"""ResourceManager: logical lanes and the context-cache catalog; adopts Program's results.

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
Every resource transition (materialization, capture, terminal retain or release, placement or
deletion of an inactive checkpoint) runs through here, at most one at a time (invariant 5).

Context cache (architecture.md §10, catalog in context_cache.py): admission picks the longest
published prefix as the source and offers inactive checkpoints, least valuable first, as victims;
Program's plan names those it needs. A terminal request that ended normally is retained (Program
publishes one complete checkpoint at its publication frontier), the SessionIndex is updated when
its publication_order is newer, then the device/host budgets are enforced.
"""
from __future__ import annotations

import contextlib
import enum
from dataclasses import dataclass
from typing import Iterator, Sequence

from ninfer.contract.program import (InvariantError, Placement, Program, Refusal, RefusalKind, ResourcePlan,
                                           ResourceResult, SequenceHandle, StalePlanError, prefix_digest)
from ninfer.engine.context_cache import ContextCache, RetentionClass
from ninfer.engine.materialization_planner import MaterializationPlanner
from ninfer.engine.request_record import RequestRecord


class LaneState(enum.Enum):
    FREE = "free"
    MATERIALIZING = "materializing"
    ACTIVE = "active"
    TERMINAL_PENDING = "terminal_pending"


class Retention(enum.Enum):
    RELEASE = "release"
    RETAIN = "retain"          # publish one complete checkpoint (context cache)


_RETAINED_ENDS = frozenset({"stop", "length", "tool_calls"})


@dataclass
class Lane:
    index: int
    state: LaneState = LaneState.FREE
    publication_order: int | None = None
    sequence: SequenceHandle | None = None


def _may_reuse(rec: RequestRecord) -> bool:
    """A request with prompt log-probs computes every prompt position: its source is always root."""
    return rec.use_cache and rec.prompt_logprobs is None


class ResourceManager:
    def __init__(self, program: Program, num_lanes: int, planner: MaterializationPlanner | None = None,
                 cache: ContextCache | None = None):
        self.program = program
        self.planner = planner or MaterializationPlanner(program)
        self.lanes = [Lane(i) for i in range(num_lanes)]
        # NOTE: the cache needs a Program that publishes checkpoints (CheckpointProgram).
        self.cache = cache if cache is not None and getattr(program, "supports_checkpoints", False) else None
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
        cache = self.cache
        if cache is None:
            return self.planner.plan(rec)
        source = None
        if _may_reuse(rec):
            hit = cache.find_source(rec.prompt.identity_token_ids())
            source = hit.checkpoint_id if hit is not None else None
        host_free = self._host_bytes_free()
        plan = self.planner.plan(rec, source, tuple(cache.eviction_order(exclude=(source,) if source else ())),
                                 host_free)
        if isinstance(plan, Refusal) and plan.kind is RefusalKind.SHORT_NOW and source is not None:
            plan = self.planner.plan(rec, None, tuple(cache.eviction_order()), host_free)
        return plan

    def _host_bytes_free(self) -> int:
        budget = self.cache.config.host_bytes
        return max(0, budget - self.program.cache_usage().host_bytes) if budget else 0

    def prove_backfill(self, head: RequestRecord, donors: Sequence[RequestRecord], borrower: RequestRecord) -> bool:
        handles = [d.sequence for d in donors if d.sequence is not None]
        return bool(self.program.prove_backfill(self.planner.sequence_request(head), handles,
                                                self.planner.sequence_request(borrower)))

    # ---- transitions ---------------------------------------------------------------------
    @contextlib.contextmanager
    def _transition_of(self, what: str) -> Iterator[None]:
        """The one global resource transition in flight (invariant 5), however Program's call ends."""
        if self._transition is not None:
            raise InvariantError(f"resource transition {what!r} started while {self._transition!r} is unsettled")
        self._transition = what
        self.num_transitions += 1
        try:
            yield
        finally:
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
        try:
            with self._transition_of(f"materialize request {rec.request_id}"):
                result = self.program.start_materialize(plan)
        except StalePlanError:
            self._unclaim(lane, rec)
            raise
        self._adopt_materialization(lane, rec, result, plan.source)
        return result

    def _unclaim(self, lane: Lane, rec: RequestRecord) -> None:
        lane.state, lane.publication_order, lane.sequence = LaneState.FREE, None, None
        rec.lane = None

    def _adopt_materialization(self, lane: Lane, rec: RequestRecord, result: ResourceResult,
                               source: int | None) -> None:
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
        if self.cache is not None:
            self.cache.adopt_evictions(result.evicted, result.offloaded)
            if _may_reuse(rec):
                hit = None
                if result.num_reused_tokens:
                    # NOTE: the planned source was found by digest at plan time; nothing else ran since.
                    hit = self.cache.entries.get(source) if source is not None else None
                    if hit is None or hit.frontier != result.num_reused_tokens:
                        raise InvariantError(f"request {rec.request_id} reused {result.num_reused_tokens} tokens "
                                             f"that its planned source {source} does not prove")
                self.cache.observe_query(hit)
            rec.capture_points = tuple(self.cache.capture_points(rec.num_prompt_tokens, rec.num_reused_tokens)
                                       ) if rec.use_cache else ()

    def begin_terminal(self, rec: RequestRecord) -> None:
        lane = self._lane_of(rec, LaneState.ACTIVE)
        lane.state = LaneState.TERMINAL_PENDING

    def choose_retention(self, rec: RequestRecord) -> Retention:
        # NOTE: cancellation (or an error) never publishes from unfinished active state.
        reason = rec.terminal_reason.value if rec.terminal_reason is not None else None
        if self.cache is not None and rec.use_cache and reason in _RETAINED_ENDS:
            return Retention.RETAIN
        return Retention.RELEASE

    def settle_terminal(self, rec: RequestRecord, last_tokens: tuple[int, ...] = ()) -> ResourceResult:
        """TerminalPending -> (retain | release) -> adopt -> optional SessionIndex update -> lane Free.

        last_tokens: the tokens Program committed in the unit that ended the request; budget
        accounting (rec.output_token_ids) takes them only after this terminal result (§6)."""
        lane = self._lane_of(rec, LaneState.TERMINAL_PENDING)
        retention = self.choose_retention(rec)
        with self._transition_of(f"{retention.value} request {rec.request_id}"):
            if retention is Retention.RETAIN:
                result = self.program.retain(lane.sequence)
            else:
                result = self.program.release(lane.sequence)
        if not isinstance(result, ResourceResult) or not result.ok or result.pages_held or result.slots_held:
            raise InvariantError(f"{retention.value} of {lane.sequence} did not end in a clean state: {result}")
        if result.checkpoint is not None:
            if retention is not Retention.RETAIN:
                raise InvariantError(f"release of {lane.sequence} published a checkpoint")
            self._adopt_terminal_checkpoint(rec, result, last_tokens)
        self._unclaim(lane, rec)
        rec.sequence = None
        if self.cache is not None:
            # NOTE: pages the sequence shared with checkpoints become inactive-only now: budgets again.
            self.trim()
        return result

    # ---- context cache transitions -------------------------------------------------------
    def prefill_stop(self, rec: RequestRecord) -> int | None:
        """The next prompt frontier where the current prefill stage must end: a capture point, or
        the prompt's reconstruction prefix (Program keeps that state in the publication slot)."""
        if self.cache is None or not rec.use_cache:
            return None
        done = rec.num_computed_tokens
        points = [p for p in rec.capture_points if p > done]
        rp = rec.prompt.reconstruction_prefix
        if rp is not None and done < rp < rec.num_prompt_tokens:
            points.append(rp)
        return min(points) if points else None

    def _adopt_terminal_checkpoint(self, rec: RequestRecord, result: ResourceResult,
                                   last_tokens: tuple[int, ...]) -> None:
        info = result.checkpoint
        expected = rec.prompt.identity_token_ids() + tuple(rec.output_token_ids) + tuple(last_tokens)
        if info.frontier > len(expected) or prefix_digest(expected[:info.frontier]) != info.digest:
            raise InvariantError(f"terminal checkpoint of request {rec.request_id} proves a prefix that is not "
                                 f"its prompt + output")
        cid = info.checkpoint_id
        same = self.cache.has_digest(info.digest)
        self.cache.add(info, RetentionClass.TERMINAL)
        if same is not None:
            # NOTE: the same prefix is already published: keep the older entry, drop this copy.
            self._delete(cid)
            cid = same
        if rec.session_key is not None:
            self.cache.bind_session(rec.session_key, cid, rec.publication_order)

    def capture(self, rec: RequestRecord) -> ResourceResult | None:
        """Publish the live request's state at its current prompt frontier (a capture point)."""
        cache = self.cache
        if cache is None or not rec.use_cache or rec.sequence is None:
            return None
        f = rec.num_computed_tokens
        digest = prefix_digest(rec.prompt.identity_token_ids()[:f])
        if cache.has_digest(digest) is not None:
            return None
        retention = RetentionClass.PROMPT if f == rec.num_prompt_tokens - 1 else RetentionClass.STRIDE
        offered = tuple(c for c in cache.eviction_order() if cache.entries[c].retention <= retention)
        plan = self.program.plan_capture(rec.sequence, offered)
        if isinstance(plan, Refusal):
            return None
        with self._transition_of(f"capture request {rec.request_id} at {f}"):
            result = self.program.start_capture(plan)
        if not result.ok or result.checkpoint is None or result.checkpoint.digest != digest:
            raise InvariantError(f"capture of request {rec.request_id} at {f} returned {result}")
        cache.adopt_evictions(result.evicted, result.offloaded)
        cache.add(result.checkpoint, retention)
        cache.stats.captures += 1
        self.trim()
        return result

    def _delete(self, checkpoint_id: int) -> None:
        with self._transition_of(f"delete checkpoint {checkpoint_id}"):
            result = self.program.delete_checkpoint(checkpoint_id)
        if not result.ok or tuple(result.evicted) != (checkpoint_id,):
            raise InvariantError(f"delete of checkpoint {checkpoint_id} returned {result}")
        self.cache.adopt_evictions(result.evicted, ())

    def _offload(self, checkpoint_id: int) -> None:
        with self._transition_of(f"offload checkpoint {checkpoint_id}"):
            result = self.program.offload_checkpoint(checkpoint_id)
        if not result.ok or tuple(result.offloaded) != (checkpoint_id,):
            raise InvariantError(f"offload of checkpoint {checkpoint_id} returned {result}")
        self.cache.adopt_evictions((), result.offloaded)

    def trim(self) -> None:
        """Enforce the device budget of inactive checkpoints (moving the least valuable to host
        memory while the host budget allows, deleting otherwise), then the host budget."""
        cache, cfg = self.cache, self.cache.config
        if cfg.device_bytes:
            while self.program.cache_usage().device_bytes > cfg.device_bytes:
                order = cache.eviction_order()
                if not order:
                    break
                victim = order[0]
                nbytes = cache.entries[victim].info.nbytes
                if cfg.host_bytes and self.program.cache_usage().host_bytes + nbytes <= cfg.host_bytes:
                    self._offload(victim)
                else:
                    self._delete(victim)
        if cfg.host_bytes:
            while self.program.cache_usage().host_bytes > cfg.host_bytes:
                order = cache.eviction_order(placement=Placement.HOST)
                if not order:
                    break
                self._delete(order[0])

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
        if self.cache is not None:
            self.cache.clear()
