"""Package-neutral contracts between Engine and Program.

Token vocabulary (used everywhere, defined once here):
  num_prompt_tokens    tokens of the prepared prompt
  num_computed_tokens  prompt/output tokens whose effect is in the committed KV and recurrent state
  num_output_tokens    committed generated tokens
  num_reused_tokens    prompt tokens taken from a reused checkpoint instead of being computed
  frontier             the committed position of a sequence (== num_computed_tokens)
  produced_tokens      tokens a model execution produced for one row (provisional)
  accepted_tokens      the prefix of produced_tokens that Engine commits

Engine holds only these host values (ints, tuples, enums). Tensors exist only in Program and below.
"""
from __future__ import annotations

import array
import enum
import hashlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, Sequence


# --------------------------------------------------------------------------------------------
# Sampling (per request; interpreted by Program's sampler, validated here)
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SamplingParams:
    """Per-request sampling. temperature == 0 is greedy.

    logprobs: None = no log-probs; 0 = the sampled token's log-prob; k in 1..20 = also the top-k.
    Log-probs are those of the model's raw distribution (log_softmax of the logits before any
    penalty, bias, temperature or truncation), as vLLM reports by default; a grammar-constrained row's
    (SequenceRequest.constraint) are taken after its token mask, as vLLM's are.
    seed: a per-request RNG; its state advances only when a sampled token is committed.
    """
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0                      # 0 = off
    min_p: float = 0.0
    repetition_penalty: float = 1.0     # over prompt + output tokens (HF/vLLM semantics)
    presence_penalty: float = 0.0       # over output tokens
    frequency_penalty: float = 0.0      # over output tokens
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: int | None = None
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not (self.repetition_penalty > 0.0):
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not (-2.0 <= self.presence_penalty <= 2.0):
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not (-2.0 <= self.frequency_penalty <= 2.0):
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if self.logprobs is not None and not (0 <= self.logprobs <= 20):
            raise ValueError(f"logprobs must be in 0..20, got {self.logprobs}")
        for tok, bias in self.logit_bias:
            if not (-100.0 <= bias <= 100.0):
                raise ValueError(f"logit_bias for token {tok} must be in [-100, 100], got {bias}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class TokenLogprob(NamedTuple):
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]   # (token_id, logprob), best first; empty when logprobs == 0


class TokenConstraint(Protocol):
    """One request's output grammar on the host: which token may come next (created by the Frontend per
    request, carried in SequenceRequest.constraint, driven by the Program; torch-free).

    The constraint follows the row's produced tokens: the Program advances it over the tokens it samples
    (and the forced-control tokens it runs), and rolls it back over the tokens the Engine does not accept
    (a PendingBatch aborted, a speculative round's rejected drafts). While `free` (the reasoning is still
    open) every token is allowed; once `done` (the grammar is complete) only the end-of-turn token is.

      fill_mask(ptr, nbytes)  writes the next token's bitmask into host memory at `ptr`: int32 words, bit
                              t % 32 of word t // 32 set = token t allowed; words past the vocabulary are
                              zeroed (nbytes >= 4 * ceil(vocab / 32))
      advance(tokens) -> n    consumes tokens in order up to the first one the grammar refuses; returns how
                              many it consumed (the state moved by exactly n)
      validate(tokens) -> n   how many leading tokens advance would consume; the state does not move
      rollback(n)             undoes the last n consumed tokens
    A class of constraints may also offer a classmethod `fill_masks(rows, ptr, row_bytes)`: fill_mask of several
    of its constraints at once, rows = [(constraint, i)] written at ptr + i * row_bytes (e.g. in parallel); the
    Program then calls it once per step for that class's rows.
    """

    @property
    def free(self) -> bool: ...        # the next token is unconstrained (the reasoning is still open)

    @property
    def done(self) -> bool: ...        # the grammar is complete: only the end-of-turn token is allowed

    def fill_mask(self, ptr: int, nbytes: int) -> None: ...
    def advance(self, tokens: Sequence[int]) -> int: ...
    def validate(self, tokens: Sequence[int]) -> int: ...
    def rollback(self, n: int) -> None: ...


def mask_words(vocab_size: int) -> int:
    """int32 words of one row of a token bitmask over `vocab_size` tokens."""
    return (vocab_size + 31) // 32


# --------------------------------------------------------------------------------------------
# Resources
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MediaInput:
    """One image or video of a prompt, preprocessed on the host (the Frontend's work): its placeholder run
    prompt_token_ids[offset:offset + length] is replaced by the vision tower's `length` output rows."""
    kind: str                          # "image" | "video"
    offset: int
    length: int
    digest: str                        # content identity (the media bytes' digest)
    pixel_values: Any                  # host rows [patches, channels x temporal x patch x patch] (MediaPlaceholder's)
    grid_thw: tuple[int, int, int]     # patches along time, height, width (before the 2 x 2 merge)


@dataclass(frozen=True, slots=True)
class SequenceRequest:
    """Everything Program needs to plan and run one sequence's complete growth."""
    prompt_token_ids: tuple[int, ...]
    max_output_tokens: int
    sampling: SamplingParams = SamplingParams()
    lookahead: int = 0
    prompt_logprobs: int | None = None     # None = off; k = log-prob of every prompt token + top-k
    # Vision (a prompt with media). rope_positions: host int array [3, P], the prompt's MRoPE positions (None:
    # text, every axis = the token's position); rope_delta: a token after the prompt at position p rotates as
    # position p + rope_delta on every axis.
    media: tuple[MediaInput, ...] = ()
    rope_positions: Any = None
    rope_delta: int = 0
    # Output grammar (None: free): the request's TokenConstraint, its state owned by the Program from
    # materialization to release (one sequence drives it).
    constraint: TokenConstraint | None = field(default=None, compare=False)

    def identity_prompt(self) -> tuple[int, ...]:
        """The prompt's ids as prefix identities see them (`identity_token_ids`)."""
        return identity_token_ids(self.prompt_token_ids, [(m.offset, m.length, m.digest) for m in self.media])
    # Context cache (architecture.md §6, §10). publication: hold a publication slot from activation
    # so that the terminal step can publish one complete checkpoint. reconstruction_prefix: a prompt
    # frontier whose state is kept in that slot (the Frontend's reconstruction boundary of the prompt);
    # an output boundary committed later replaces it.
    publication: bool = False
    reconstruction_prefix: int | None = None


@dataclass(frozen=True, slots=True)
class SequenceHandle:
    """Program's name for one active sequence; `generation` detects use after release."""
    seq_id: int
    generation: int


class RefusalKind(enum.Enum):
    SHORT_NOW = "short_now"            # not enough free pages/slots now; may fit when others finish
    INFEASIBLE = "infeasible"          # does not fit even from root with everything released


class Refusal(NamedTuple):
    kind: RefusalKind
    reason: str                        # names the resource and the numbers


def identity_token_ids(token_ids: Sequence[int], runs: Sequence[tuple[int, int, str]] = ()) -> tuple[int, ...]:
    """The ids a prefix's identity is taken over: the token ids, with each media placeholder run (offset,
    length, content digest) replaced by negative ids derived from its media's digest, so that two prompts
    with the same placeholders but different images never share a checkpoint."""
    if not runs:
        return tuple(token_ids)
    out = list(token_ids)
    for offset, length, digest in runs:
        h = int(hashlib.blake2b(digest.encode(), digest_size=7).hexdigest(), 16)
        out[offset:offset + length] = [-1 - h - k for k in range(length)]
    return tuple(out)


def prefix_digest(token_ids: Sequence[int]) -> str:
    """The token digest of a prefix: what a checkpoint proves and what the prefix index matches."""
    return hashlib.blake2b(array.array("q", token_ids).tobytes(), digest_size=16).hexdigest()


class Placement(enum.Enum):
    DEVICE = "device"                  # StateImage slot + shared KV pages, reusable at once
    HOST = "host"                      # host-memory replica; materializing copies it back


@dataclass(frozen=True, slots=True)
class Provenance:
    """Committed execution provenance of a checkpoint (Program's fact; Engine only carries it)."""
    kind: str                          # "prompt" | "stride" | "reconstruction" | "terminal"
    producer: int                      # seq_id of the sequence whose state it is
    source: int | None                 # checkpoint the producer materialized from (None: root)
    resource_revision: int             # revision at publication


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """The stable summary of one published, immutable checkpoint."""
    checkpoint_id: int
    frontier: int                      # tokens whose effect the checkpoint proves
    digest: str                        # prefix_digest of exactly those tokens
    placement: Placement
    nbytes: int                        # StateImage + KV bytes of the prefix (device or host copy)
    provenance: Provenance


class CacheUsage(NamedTuple):
    """Program's summary of inactive checkpoints (ResourceManager keeps no mirror of it)."""
    num_device: int
    num_host: int
    device_bytes: int                  # slots + pages that no active sequence maps
    host_bytes: int


@dataclass(frozen=True, slots=True)
class ResourcePlan:
    """A sealed, opaque plan bound to Program's resource_revision. Stale plans are re-planned.

    kind "materialize": a waiting request from `source` (a checkpoint id, None = root);
    kind "capture": publish a checkpoint of the active `sequence` at its frontier.
    victims: inactive checkpoints the plan evicts (or moves to host memory) to fit; fixed once started.
    """
    plan_id: int
    resource_revision: int
    request: SequenceRequest
    pages: int                         # pages of the complete growth reservation
    slots: int                         # StateImage slots
    num_reused_tokens: int = 0
    kind: str = "materialize"
    source: int | None = None
    victims: tuple[int, ...] = ()
    offload: tuple[int, ...] = ()      # the victims moved to host memory instead of deleted
    sequence: SequenceHandle | None = None


@dataclass(frozen=True, slots=True)
class ResourceResult:
    """The complete end state of a resource transition, adopted by ResourceManager."""
    ok: bool
    resource_revision: int
    sequence: SequenceHandle | None = None
    num_reused_tokens: int = 0
    pages_held: int = 0
    slots_held: int = 0
    reason: str = ""
    checkpoint: CheckpointInfo | None = None     # published by this transition
    evicted: tuple[int, ...] = ()                # checkpoints deleted by this transition
    offloaded: tuple[int, ...] = ()              # checkpoints moved to host memory by this transition


class CapacitySummary(NamedTuple):
    """A stable summary Program publishes for metrics and readiness (never a mirror to mutate)."""
    pages_total: int
    pages_free: int
    slots_total: int
    slots_free: int
    page_size: int


class StalePlanError(RuntimeError):
    """A plan's resource_revision no longer matches; nothing was mutated, re-plan."""


class InvariantError(RuntimeError):
    """Shared physical state can no longer be explained; the Engine must fail as a whole."""


# --------------------------------------------------------------------------------------------
# Model transactions
# --------------------------------------------------------------------------------------------
class BatchKind(enum.Enum):
    PREFILL = "prefill"       # final prefill stage: one row, the first sampled token
    DECODE = "decode"
    CONTROL = "control"       # forced control tokens, no sampler, no RNG advance


@dataclass(frozen=True, slots=True)
class PendingRow:
    sequence: SequenceHandle
    tokens: tuple[int, ...]                      # produced tokens (provisional); produced = len(tokens)
    logprobs: tuple[TokenLogprob, ...] | None    # one per token when the request asked for log-probs
    drafted: int = 0                             # draft tokens a speculative round proposed for the row (0:
                                                 # no speculation); produced - 1 of them were accepted

    @property
    def produced_tokens(self) -> int:
        return len(self.tokens)


@dataclass(eq=False)
class PendingBatch:
    """Move-only result of one model execution unit.

    Consumed exactly once, completely, by `Program.commit(batch, accepted)` or
    `Program.abort_pending(batch)`. Program keeps the provisional state behind `batch_id`.
    """
    batch_id: int
    kind: BatchKind
    rows: tuple[PendingRow, ...]
    consumed: bool = field(default=False)

    @property
    def size(self) -> int:
        return len(self.rows)


class PrefillStep(NamedTuple):
    num_computed_tokens: int                 # prompt tokens now in committed state
    pending: PendingBatch | None             # set only by the final stage (first sampled token)
    prompt_logprobs: tuple[TokenLogprob | None, ...] = ()   # for the tokens this stage computed, when asked


class Program(Protocol):
    """The only physical execution entry of one target package (see architecture.md §2, §6, §8)."""

    @property
    def resource_revision(self) -> int: ...
    @property
    def max_model_len(self) -> int: ...            # prompt + output + lookahead limit of one sequence
    @property
    def lookahead(self) -> int: ...                # positions past the last token a decode unit may write
                                                   # (speculation's drafts; 0 without): SequenceRequest.lookahead

    def capacity(self) -> CapacitySummary: ...
    def plan_materialize(self, request: SequenceRequest) -> ResourcePlan | Refusal: ...
    def start_materialize(self, plan: ResourcePlan) -> ResourceResult: ...
    def prove_backfill(self, head: SequenceRequest, donors: Sequence[SequenceHandle],
                       borrower: SequenceRequest) -> bool: ...
    def prefill(self, seq: SequenceHandle, max_tokens: int) -> PrefillStep: ...
    def decode(self, seqs: Sequence[SequenceHandle], num_steps: int = 1) -> PendingBatch: ...
    def control(self, seq: SequenceHandle, tokens: Sequence[int]) -> PendingBatch: ...
    def commit(self, batch: PendingBatch, accepted: Sequence[int]) -> None: ...
    def abort_pending(self, batch: PendingBatch) -> None: ...
    def release(self, seq: SequenceHandle) -> ResourceResult: ...
    def check_integrity(self) -> None: ...        # raises InvariantError on `free + owned != total`
    # Optional (read with getattr at attach; absent: no warmup): warmup_prompt_lengths(stage_tokens,
    # max_model_len) -> the prompt lengths (each <= max_model_len - 2) whose first prefill compiles kernels
    # or captures graphs (serve warmup, `Engine.warm_up`).


class CheckpointProgram(Program, Protocol):
    """A Program that also publishes and reuses immutable checkpoints (`supports_checkpoints`).

    plan_materialize(request, source=None, evictable=())  source: checkpoint id whose proven prefix
        the prompt starts with (frontier <= num_prompt_tokens - 1); evictable: inactive checkpoints
        in the order ResourceManager would give them up (least valuable first); the plan names the
        victims it needs. The continuation copies the source's StateImage, shares its full KV pages
        and copies the partial last page: it never writes into a checkpoint's pages or slot.
    plan_capture / start_capture: publish the active sequence's state at its frontier.
    commit(batch, accepted, boundaries): boundaries[r] is the Frontend's reconstruction boundary
        relative to row r's accepted span (None: none); Program keeps that frontier's state in the
        sequence's publication slot.
    retain(seq): the terminal step: publish one complete checkpoint at the publication frontier and
        release the rest, or release everything when no complete state exists (result.checkpoint None).
    delete_checkpoint / offload_checkpoint: placement or deletion of an inactive checkpoint.
    """
    supports_checkpoints: bool

    def plan_capture(self, seq: SequenceHandle, evictable: Sequence[int] = ()) -> ResourcePlan | Refusal: ...
    def start_capture(self, plan: ResourcePlan) -> ResourceResult: ...
    def retain(self, seq: SequenceHandle) -> ResourceResult: ...
    def delete_checkpoint(self, checkpoint_id: int) -> ResourceResult: ...
    def offload_checkpoint(self, checkpoint_id: int) -> ResourceResult: ...
    def cache_usage(self) -> CacheUsage: ...
    def checkpoint_info(self, checkpoint_id: int) -> CheckpointInfo: ...
