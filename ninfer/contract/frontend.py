"""The Engine <-> Frontend contract: the owning values a Frontend fills and the Engine carries,
and the OutputSession protocol the Engine previews, commits and finishes (no tensors, no imports of
a model family, the Engine or a Program).

A family's Frontend (tokenizer, chat template, output channels) implements `OutputSession` and
`Frontend`; the Qwen3.6 one is `ninfer.targets.qwen3_6.frontend`. Gateways read these values.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence


class PromptError(ValueError):
    """The request's messages, tools or token ids cannot form a prompt (a client error)."""


class SessionError(RuntimeError):
    """An OutputSession was driven out of order (stale preview, use after termination)."""


class ConstraintError(ValueError):
    """An output constraint cannot be compiled (invalid schema, unsupported keyword, bad regex, grammar too
    large): a client error. `param` names the request field the constraint came from."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


CONSTRAINT_KINDS = ("json_schema", "json_object", "regex", "choice", "ebnf", "lark")


@dataclass(frozen=True, slots=True)
class OutputConstraint:
    """A grammar the answer must match (the Frontend compiles it; the Program masks the sampler with it).

    kind / spec:
      "json_schema"  the JSON schema as JSON text
      "json_object"  "" (any JSON object)
      "regex"        a regular expression the whole answer matches
      "choice"       a JSON array of strings: the answer is exactly one of them
      "ebnf"         a GBNF / xgrammar-style EBNF grammar (what vLLM's guided_grammar takes)
      "lark"         a Lark grammar in llguidance's dialect (may embed %json{...})
    param: the request field it came from, named in errors ("response_format.json_schema.schema", ...).
    after_reasoning: with thinking on, the reasoning stays free and the constraint applies from the token
      after `</think>` (leading whitespace allowed); with thinking off (or False here) from the first token.
    Once the grammar is complete only the end-of-turn token is allowed.
    """
    kind: str
    spec: str
    param: str
    after_reasoning: bool = True

    def __post_init__(self) -> None:
        if self.kind not in CONSTRAINT_KINDS:
            raise ConstraintError(f"unknown constraint kind {self.kind!r} (one of {', '.join(CONSTRAINT_KINDS)})",
                                  self.param)
        if not isinstance(self.spec, str):
            raise ConstraintError(f"the constraint's spec must be text, got {type(self.spec).__name__}", self.param)


class FinishReason(str, enum.Enum):
    STOP = "stop"               # eos / stop token / stop string
    LENGTH = "length"           # max_tokens or context limit
    TOOL_CALLS = "tool_calls"   # the output ended with one or more complete tool calls
    CANCELLED = "cancelled"
    ERROR = "error"


# NOTE: the key under which a Gateway attaches its decoded media item to a chat content part for the Frontend
#       (an object with `kind`, `image` or `frames`, `source_fps`, `frame_indices`, `digest`).
MEDIA_KEY = "_ninfer_media"


@dataclass(frozen=True, slots=True)
class MediaPlaceholder:
    """One image (or one temporal group of a video) placeholder run inside PreparedPrompt.token_ids."""
    kind: str                  # "image" | "video"
    offset: int                # index of the first placeholder token
    length: int                # number of placeholder tokens
    content_digest: str        # digest of the media bytes
    pixel_values: Any = None   # the vision tower's input rows [patches, C x T x P x P] on the host, in a form
                               # the target's Program reads (a float32 array, or the target's own, e.g. uint8
                               # values and a lookup table); None: the prompt was rendered without the
                               # media's pixels: it cannot be run
    grid_thw: tuple[int, int, int] = (0, 0, 0)   # patches along time, height, width (before the merge)


@dataclass(frozen=True, slots=True)
class PreparedPrompt:
    """An owning prompt: token ids, media placeholders and a content identity for prefix reuse."""
    token_ids: tuple[int, ...]
    media: tuple[MediaPlaceholder, ...] = ()
    content_id: str = ""               # digest of token ids and media content
    enable_thinking: bool = False      # the prompt ends inside an opened <think> block
    # Reconstruction (multi-turn reuse). reconstruction_prefix: how many leading prompt tokens
    # the history renderer reproduces whatever this turn outputs and whatever comes next (the
    # prompt up to and including the generation prompt's `<|im_start|>assistant\n`); None when
    # the prompt is not a rendered chat. preserve_thinking: the template keeps past reasoning,
    # so a finished output may be reproduced too (see Preview.boundary).
    reconstruction_prefix: int | None = None
    preserve_thinking: bool = False
    # MRoPE of a prompt with media: positions [3, P] (host int array) and the delta after the prompt
    rope_positions: Any = None
    rope_delta: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.token_ids)

    def identity_token_ids(self) -> tuple[int, ...]:
        """The ids the context cache keys prefixes on: the token ids, each media run replaced by ids of its
        content (`ninfer.contract.program.identity_token_ids`)."""
        from ninfer.contract.program import identity_token_ids
        return identity_token_ids(self.token_ids, [(m.offset, m.length, m.content_digest) for m in self.media])


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str             # JSON object text, values typed by the tool's JSON schema


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""        # appended JSON text


@dataclass(frozen=True, slots=True)
class OutputOptions:
    """Per-request output semantics chosen by the Gateway."""
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    tools: tuple[dict, ...] = ()             # OpenAI tool definitions (for typed argument parsing)
    parse_tool_calls: bool = True            # False for tool_choice="none" / plain completions
    parse_reasoning: bool = True             # split reasoning from content when thinking is on
    thinking_budget: int | None = None       # max reasoning tokens before a forced </think>
    constraint: OutputConstraint | None = None   # a grammar the answer must match (None: free)


@dataclass(frozen=True, slots=True)
class OutputDelta:
    text: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.text or self.reasoning or self.tool_calls)


@dataclass(frozen=True, slots=True)
class Preview:
    """What committing `accepted_tokens` of the given tokens would do. Nothing is visible yet.

    boundary: the number of accepted tokens after which the history renderer reproduces the
    output token for token (None when no such point lies in this span). Reported at the end of
    each complete tool call (the conversation continues with tool responses, which keep this
    turn's reasoning) and at a stop when `preserve_thinking` keeps reasoning; otherwise the
    reusable frontier is PreparedPrompt.reconstruction_prefix.
    state: opaque to everyone but the OutputSession that produced it (consumed by commit).
    """
    accepted_tokens: int
    delta: OutputDelta
    terminal: bool
    finish_reason: FinishReason | None
    boundary: int | None = None
    num_reasoning_tokens: int = 0            # of the accepted tokens, how many were reasoning
    state: object = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class FinalOutput:
    text: str
    reasoning: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: FinishReason
    token_ids: tuple[int, ...] = ()
    num_reasoning_tokens: int = 0
    extra: dict = field(default_factory=dict)


class OutputSession(Protocol):
    """One request's output semantics. The Engine previews a span of produced tokens, commits the
    preview only after the Program committed the model state, and finishes the session once.

    token_constraint: the request's grammar state (a `ninfer.contract.program.TokenConstraint`, created by
    the Frontend from OutputOptions.constraint) or None; the Engine hands it to the Program.
    """
    token_constraint: Any

    def preview(self, tokens: Sequence[int], *, control: bool = False) -> Preview: ...

    def commit(self, preview: Preview) -> None: ...

    def forced_control(self) -> tuple[int, ...] | None: ...

    def finish(self, reason: FinishReason | None = None) -> tuple[OutputDelta, FinalOutput]: ...


class Frontend(Protocol):
    """What the Engine asks of a family's Frontend: a session per request, the sampleable
    vocabulary size, and the tokenizer that causal scoring encodes text with.

    compile_constraint(constraint): compiles (and caches per kind and spec) an OutputConstraint into an
    opaque grammar, raising ConstraintError naming `constraint.param`; a Gateway calls it up front (off
    its event loop) so that a bad constraint is refused before submit. new_session compiles it too (a
    cache hit when the Gateway did) and the session's `token_constraint` (None without a constraint) is
    the per-request grammar state the Program masks the sampler with
    (`ninfer.contract.program.TokenConstraint`).
    """
    vocab_size: int
    tokenizer: Any

    def new_session(self, prompt: PreparedPrompt, options: OutputOptions = ...) -> OutputSession: ...

    def compile_constraint(self, constraint: OutputConstraint) -> Any: ...
