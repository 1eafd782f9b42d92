"""Materialization planner: the logical choice for a waiting request, sealed into a plan by Program.

    logical choice -> Program seals ResourcePlan -> RunningTransaction -> ResourceResult -> adopt

The logical choice is the source of the request's continuation and its growth reservation
(prompt + max output + Program's speculative lookahead). Program alone computes occupancy and
feasibility and seals the plan against its current `resource_revision`.

The candidate sources (architecture.md §10) are the longest published checkpoint whose token
digest is a strict prefix of the prompt (from ResourceManager's catalog), then root; the plan
may name inactive checkpoints (offered least valuable first) that Program evicts to fit.
"""
from __future__ import annotations

from ninfer.contract.program import (InvariantError, MediaInput, Program, Refusal, ResourcePlan,
                                           SequenceRequest)
from ninfer.engine.request_record import RequestRecord


class MaterializationPlanner:
    def __init__(self, program: Program, lookahead: int | None = None):
        """lookahead None: the Program's own (`Program.lookahead`; 0 for a Program without speculation)."""
        self.program = program
        self.lookahead = int(getattr(program, "lookahead", 0)) if lookahead is None else lookahead

    def sequence_request(self, rec: RequestRecord) -> SequenceRequest:
        # NOTE: a request with prompt_logprobs must compute every prompt position: its source is
        # always root, never a reused checkpoint (Program returns the log-probs from prefill).
        p = rec.prompt
        media = tuple(MediaInput(m.kind, m.offset, m.length, m.content_digest, m.pixel_values, m.grid_thw)
                      for m in p.media)
        return SequenceRequest(prompt_token_ids=p.token_ids, max_output_tokens=rec.max_tokens,
                               sampling=rec.sampling, lookahead=self.lookahead,
                               prompt_logprobs=rec.prompt_logprobs, publication=rec.use_cache,
                               reconstruction_prefix=p.reconstruction_prefix if rec.use_cache else None,
                               media=media, rope_positions=p.rope_positions, rope_delta=p.rope_delta,
                               constraint=getattr(rec.session, "token_constraint", None))

    def plan(self, rec: RequestRecord, source: int | None = None, evictable: tuple[int, ...] = (),
             host_bytes_free: int = 0) -> ResourcePlan | Refusal:
        request = self.sequence_request(rec)
        if source is None and not evictable:
            outcome = self.program.plan_materialize(request)
        else:
            outcome = self.program.plan_materialize(request, source, evictable, host_bytes_free)
        if isinstance(outcome, Refusal):
            return outcome
        if not isinstance(outcome, ResourcePlan):
            raise InvariantError(f"plan_materialize returned {type(outcome).__name__}, not a plan or refusal")
        if outcome.request != request:
            raise InvariantError(f"plan {outcome.plan_id} is sealed for another request")
        return outcome
