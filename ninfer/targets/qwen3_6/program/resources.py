"""Resources of the Qwen3.6 Program: capacity, materializing and releasing sequences, integrity.

A sequence comes to life in two phases: `plan_materialize` (pure: validates the request and names
the pages, slots and checkpoint victims it needs, sealed at the ledger's resource_revision) and
`start_materialize` (mutates: evicts the victims, acquires the holding, copies the source state in).
`release` gives everything back; `check_integrity` proves `free + owned == total` for pages, slots
and scratch entries and that the Program's records agree with the ledger's.
"""
from __future__ import annotations

from typing import Sequence

from ninfer.contract.program import (CapacitySummary, InvariantError, Refusal, RefusalKind, ResourcePlan,
                                     ResourceResult, SequenceHandle, SequenceRequest)
from ninfer.targets.qwen3_6.program.sequences import LiveSeq


class ResourceOps:
    """Mixed into Qwen36Program: capacity, the life of a sequence and integrity. Uses its ledgers
    (`_ledger`, `_pending`), `_seqs`, `_sampler`, `step_ahead` and the CheckpointOps it is mixed with."""

    @property
    def resource_revision(self) -> int:
        return self._ledger.revision

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len

    @property
    def lookahead(self) -> int:
        return self.config.lookahead

    def capacity(self) -> CapacitySummary:
        p, s = self._ledger.pages, self._ledger.slots
        return CapacitySummary(p.total, p.num_available, s.total, s.num_free, self.config.page_size)

    @staticmethod
    def _growth(request: SequenceRequest) -> int:
        return len(request.prompt_token_ids) + request.max_output_tokens + request.lookahead

    def _validate_request(self, request: SequenceRequest) -> Refusal | None:
        if not request.prompt_token_ids:
            return Refusal(RefusalKind.INFEASIBLE, "empty prompt")
        if request.max_output_tokens < 1 or request.lookahead < 0:
            return Refusal(RefusalKind.INFEASIBLE,
                           f"max_output_tokens must be >= 1 and lookahead >= 0, got "
                           f"{request.max_output_tokens} and {request.lookahead}")
        bad = [t for t in request.prompt_token_ids if not (0 <= t < self.dims.vocab_size)]
        if bad:
            return Refusal(RefusalKind.INFEASIBLE, f"token id {bad[0]} outside the vocabulary 0..{self.dims.vocab_size - 1}")
        return self._validate_media(request)

    def plan_materialize(self, request: SequenceRequest, source: int | None = None, evictable: Sequence[int] = (),
                         host_bytes_free: int = 0) -> ResourcePlan | Refusal:
        """source: a checkpoint proving a strict prefix of the prompt (None: root). evictable:
        inactive checkpoints, least valuable first; the plan names those it must evict to fit
        (moving to host memory those that fit in `host_bytes_free`)."""
        why = self._validate_request(request)
        if why is not None:
            return why
        return self._plan_from(request, source, evictable, host_bytes_free)

    def start_materialize(self, plan: ResourcePlan) -> ResourceResult:
        self._require_fresh(plan)
        seq_id = self._seqs.new_id()
        holding, evicted, offloaded = self._start_from(plan, seq_id)
        handle = SequenceHandle(seq_id, self._ledger.revision)
        seed = plan.request.sampling.seed
        # NOTE: an unseeded sequence still gets its own stream, so rollback is exact for it too.
        rng = self._sampler.new_rng_state(seed if seed is not None else self._seqs.default_seed())
        s = LiveSeq(handle, plan.request, holding, list(plan.request.prompt_token_ids), rng,
                    frontier=plan.num_reused_tokens, source=plan.source)
        self._seqs.add(s)
        rp = plan.request.reconstruction_prefix
        if rp is not None and rp >= s.frontier:
            self._set_pub_target(s, rp)
            self._pub_target_reached(s, lambda T: holding.slot if T == s.frontier else None)
        return ResourceResult(ok=True, resource_revision=self._ledger.revision, sequence=handle,
                              num_reused_tokens=plan.num_reused_tokens, pages_held=holding.pages_held,
                              slots_held=holding.num_slots, evicted=evicted, offloaded=offloaded)

    def prove_backfill(self, head: SequenceRequest, donors: Sequence[SequenceHandle],
                       borrower: SequenceRequest) -> bool:
        if self._validate_request(head) or self._validate_request(borrower):
            return False
        donor_ids = [self._seq(d).handle.seq_id for d in donors]
        return self._ledger.prove_backfill(self._growth(head), donor_ids, self._growth(borrower),
                                           head.publication, borrower.publication)

    def release(self, seq: SequenceHandle) -> ResourceResult:
        s = self._seq(seq)
        self._pending.require_idle(s.handle.seq_id, "release")
        self.step_ahead.discard(s.handle.seq_id)
        self._ledger.release(s.handle.seq_id)
        self._seqs.remove(s.handle.seq_id)
        return ResourceResult(ok=True, resource_revision=self._ledger.revision)

    def check_integrity(self) -> None:
        self._ledger.check()
        self._pending.check()
        self._check_checkpoints()
        for s in self._seqs:
            if self._ledger.holding(s.handle.seq_id) is not s.holding:
                raise InvariantError(f"sequence {s.handle.seq_id} lost its holding")
            if not (0 <= s.frontier <= len(s.tokens) <= s.holding.reserved_tokens):
                raise InvariantError(f"sequence {s.handle.seq_id}: frontier {s.frontier}, "
                                     f"{len(s.tokens)} tokens, reserved {s.holding.reserved_tokens}")
            if s.holding.table.capacity < s.frontier:
                raise InvariantError(f"sequence {s.handle.seq_id}: frontier beyond its mapped pages")
        live = self._seqs.ids()
        self.step_ahead.check(live)
        if set(self._ledger.owner_ids) != live:
            raise InvariantError(f"the ledger holds resources for {sorted(self._ledger.owner_ids)}, "
                                 f"live sequences are {sorted(live)}")

    def _seq(self, handle: SequenceHandle) -> LiveSeq:
        return self._seqs.get(handle)
