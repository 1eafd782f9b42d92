"""The Engine worker's record of one accepted request (worker-owned; never touched by other threads).

Token vocabulary (see `ninfer.contract.program`):
  num_prompt_tokens    tokens of the prepared prompt
  num_computed_tokens  prompt tokens whose effect is committed in Program (prefill progress)
  num_output_tokens    committed generated tokens (sampled and forced-control tokens)
  num_reused_tokens    prompt tokens taken from a reused checkpoint (the context cache)
  frontier             num_computed_tokens + num_output_tokens
  produced_tokens      tokens one model execution produced for a row (provisional)
  accepted_tokens      the prefix of produced_tokens that Engine commits
  num_spec_rounds      speculative rounds of the request that committed a token (each produced its
                       accepted drafts + 1 tokens; Program's lookahead > 0)
  num_spec_accepted_tokens  drafts those rounds accepted (produced_tokens - 1 per round)

Request lifecycle (architecture.md §4):

    Waiting -> Materializing -> Prefill -> DecodeReady | ControlReady -> TerminalPending -> Finished

`publication_order` is a monotonic number taken when the request enters the Engine; the FIFO
queue is ordered by it and a SessionIndex update uses it to decide which completion wins.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ninfer.contract.program import InvariantError, SamplingParams, SequenceHandle, TokenLogprob
from ninfer.engine.handle import RequestTicket
from ninfer.contract.frontend import FinishReason, OutputOptions, OutputSession, PreparedPrompt


class RequestState(enum.Enum):
    WAITING = "waiting"
    MATERIALIZING = "materializing"
    PREFILL = "prefill"
    DECODE_READY = "decode_ready"
    CONTROL_READY = "control_ready"
    TERMINAL_PENDING = "terminal_pending"
    FINISHED = "finished"


S = RequestState
_ALLOWED: dict[RequestState, frozenset[RequestState]] = {
    S.WAITING: frozenset({S.MATERIALIZING, S.FINISHED}),
    # NOTE: Materializing -> Waiting when the started transition aborted (its result is adopted and
    # the request keeps its FIFO position); -> TerminalPending when cancellation is seen after adoption.
    S.MATERIALIZING: frozenset({S.PREFILL, S.WAITING, S.TERMINAL_PENDING}),
    S.PREFILL: frozenset({S.PREFILL, S.DECODE_READY, S.CONTROL_READY, S.TERMINAL_PENDING}),
    S.DECODE_READY: frozenset({S.DECODE_READY, S.CONTROL_READY, S.TERMINAL_PENDING}),
    S.CONTROL_READY: frozenset({S.DECODE_READY, S.CONTROL_READY, S.TERMINAL_PENDING}),
    S.TERMINAL_PENDING: frozenset({S.FINISHED}),
    S.FINISHED: frozenset(),
}
ACTIVE_STATES = frozenset({S.PREFILL, S.DECODE_READY, S.CONTROL_READY})


@dataclass(eq=False)
class RequestRecord:
    request_id: str
    publication_order: int
    prompt: PreparedPrompt
    sampling: SamplingParams
    max_tokens: int
    options: OutputOptions
    session: OutputSession                        # the request's own Frontend OutputSession
    ticket: RequestTicket
    submit_time: float
    deadline: float                               # absolute clock time; applies while Waiting
    state: RequestState = RequestState.WAITING
    lane: int | None = None
    sequence: SequenceHandle | None = None
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    num_reused_tokens: int = 0
    num_reasoning_tokens: int = 0
    num_spec_rounds: int = 0
    num_spec_accepted_tokens: int = 0
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: int | None = None           # asked top-k of prompt log-probs (None = off)
    prompt_logprob_entries: list[TokenLogprob | None] | None = None   # collected from prefill stages
    terminal_reason: FinishReason | None = None   # set when execution ends (entering TerminalPending)
    control_tokens: tuple[int, ...] = ()          # the forced-control suffix asked by Frontend (ControlReady)
    last_boundary: int | None = None              # absolute output position of the last reconstruction boundary
    session_key: str | None = None                # a lookup hint for the context cache (never ownership)
    use_cache: bool = False                       # may reuse and publish checkpoints (context cache on)
    capture_points: tuple[int, ...] = ()          # prompt frontiers where prefill stops to capture
    admit_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt.token_ids)

    @property
    def frontier(self) -> int:
        return self.num_computed_tokens + self.num_output_tokens

    @property
    def remaining_budget(self) -> int:
        return self.max_tokens - self.num_output_tokens

    @property
    def cancel_requested(self) -> bool:
        return self.ticket.cancel_requested

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    def move(self, new: RequestState) -> None:
        """Change lifecycle state; an illegal transition breaks an Engine invariant."""
        if new not in _ALLOWED[self.state]:
            raise InvariantError(f"request {self.request_id}: illegal transition {self.state.value} -> {new.value}")
        self.state = new

    def force_finished(self) -> None:
        """Engine-wide failure cleanup only: every request ends regardless of its state."""
        self.state = RequestState.FINISHED
