"""Materialization planner: the logical choice for a waiting request, sealed into a plan by Program.

    logical choice -> Program seals ResourcePlan -> RunningTransaction -> ResourceResult -> adopt

The logical choice is the source of the request's continuation and its growth reservation
(prompt + max output + Program's speculative lookahead). Program alone computes occupancy and
feasibility and seals the plan against its current `resource_revision`.

NOTE (context-cache seam, architecture.md §10): the candidate sources are, in order, the
published checkpoints whose token digest is a prefix of the prompt (best first, from
ResourceManager's catalog), then root. Until the context cache lands the catalog is empty and
every request materializes from root.
"""
from __future__ import annotations

from ninfer.runtime.contract.types import (InvariantError, Program, Refusal, ResourcePlan,
                                           SequenceRequest)
from ninfer.runtime.engine.request_record import RequestRecord


class MaterializationPlanner:
    def __init__(self, program: Program, lookahead: int = 0):
        self.program = program
        self.lookahead = lookahead

    def sequence_request(self, rec: RequestRecord) -> SequenceRequest:
        # NOTE: a request with prompt_logprobs must compute every prompt position: its source is
        # always root, never a reused checkpoint (Program returns the log-probs from prefill).
        return SequenceRequest(prompt_token_ids=rec.prompt.token_ids, max_output_tokens=rec.max_tokens,
                               sampling=rec.sampling, lookahead=self.lookahead,
                               prompt_logprobs=rec.prompt_logprobs)

    def plan(self, rec: RequestRecord) -> ResourcePlan | Refusal:
        request = self.sequence_request(rec)
        outcome = self.program.plan_materialize(request)
        if isinstance(outcome, Refusal):
            return outcome
        if not isinstance(outcome, ResourcePlan):
            raise InvariantError(f"plan_materialize returned {type(outcome).__name__}, not a plan or refusal")
        if outcome.request != request:
            raise InvariantError(f"plan {outcome.plan_id} is sealed for another request")
        return outcome
