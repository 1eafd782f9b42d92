"""Public, owning host values of the NInfer Engine facade.

Gateways (CLI, HTTP) use only `ninfer.Engine`, these types and the Frontend types re-exported here.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace

from ninfer.contract.program import SamplingParams, TokenLogprob
from ninfer.contract.frontend import (FinishReason, OutputDelta, OutputOptions,
                                                   PreparedPrompt, ToolCall, ToolCallDelta)

MAX_CONCURRENCY = 8        # active requests at once: EngineConfig.max_concurrency is in 1..MAX_CONCURRENCY
SPECULATIVE_METHODS = ("mtp",)     # EngineConfig.speculative methods
MAX_SPECULATIVE_TOKENS = 7         # num_speculative_tokens is in 1..MAX_SPECULATIVE_TOKENS

__all__ = ["EngineConfig", "SpeculativeConfig", "SamplingParams", "TokenLogprob", "FinishReason", "OutputOptions",
           "PreparedPrompt", "ToolCall", "ToolCallDelta", "OutputDelta", "Availability",
           "AvailabilityState", "GenerationStart", "GenerationDelta", "GenerationResult",
           "GenerationError", "ErrorKind", "Usage", "Purpose", "EngineRequestError", "HistogramSnapshot",
           "EngineMetrics", "GenerationEvent", "ScoreInput", "ScoreResult"]


class Purpose(str, enum.Enum):
    GENERATION = "generation"
    CAUSAL_SCORING = "causal_scoring"


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """Speculative decoding, fixed at start (`EngineConfig.speculative`; vLLM's `--speculative-config`).

    method                  "mtp": the checkpoint's multi-token-prediction layer drafts, the target verifies
    num_speculative_tokens  K, 1..7: drafts per round; a round produces 1..K+1 tokens per row, and every
                            request reserves K positions past its output (the lookahead)
    force_accept_len        0 (off) or 1..K+1: every round keeps exactly this many tokens whatever the target
                            says (a benchmarking aid for synthetic weights: the output is not the model's)
    draft_vocab_size        0 (the whole vocabulary) or N: the drafts are the argmax over the first N token ids
                            (the frequent ones, in a byte-level BPE's merge order), so a draft step reads N
                            lm_head rows; verification is unchanged, so the output is the same at any N
    """
    method: str
    num_speculative_tokens: int
    force_accept_len: int = 0
    draft_vocab_size: int = 0

    def __post_init__(self) -> None:
        if self.method not in SPECULATIVE_METHODS:
            raise ValueError(f"speculative method must be one of {', '.join(SPECULATIVE_METHODS)}, got {self.method!r}")
        k = self.num_speculative_tokens
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"num_speculative_tokens must be an integer in 1..{MAX_SPECULATIVE_TOKENS}, got {k!r}")
        f = self.force_accept_len
        if isinstance(f, bool) or not isinstance(f, int) or not (f == 0 or 1 <= f <= k + 1):
            raise ValueError(f"force_accept_len must be 0 (off) or in 1..{k + 1} (num_speculative_tokens + 1), "
                             f"got {f!r}")
        n = self.draft_vocab_size
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"draft_vocab_size must be an integer >= 0 (0: the whole vocabulary), got {n!r}")

    @property
    def lookahead(self) -> int:
        """Positions past a request's last token that one speculative round may write (its K drafts)."""
        return self.num_speculative_tokens

    @classmethod
    def of(cls, value: "SpeculativeConfig | dict | None") -> "SpeculativeConfig | None":
        """None, a SpeculativeConfig, or a dict {"method": "mtp", "num_speculative_tokens": K
        [, "force_accept_len": L]} (the vLLM `--speculative-config` form)."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"speculative must be None, a SpeculativeConfig or a dict, got {type(value).__name__}")
        known = ("method", "num_speculative_tokens", "force_accept_len", "draft_vocab_size")
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"speculative: unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
        missing = [k for k in known[:2] if k not in value]
        if missing:
            raise ValueError(f"speculative needs {' and '.join(missing)} (e.g. "
                             f"{{'method': 'mtp', 'num_speculative_tokens': 3}})")
        return cls(**value)


@dataclass(frozen=True)
class EngineConfig:
    """Frozen start-time configuration. CLI flags mirror these field names one to one, except
    `speculative`: --speculative-method and --num-speculative-tokens, as vLLM spells them."""
    purpose: Purpose = Purpose.GENERATION
    device: str = "auto"                  # "auto" = cuda when available, else cpu
    dtype: str = "auto"                   # "auto" = bfloat16 on CUDA, float32 on CPU; or bf16/fp32
    max_concurrency: int = 4              # 1..8 active requests
    queue_size: int = 16                  # bounded FIFO waiting queue
    request_timeout_s: float = 600.0      # default deadline of a request while waiting in the queue
    # NOTE: a prefill stage has a fixed host cost whatever its size, so fewer, larger stages give the
    #       shorter TTFT (docs/performance.md, "Decision log"); 8192, as vLLM and SGLang use. A stage runs
    #       between decode rounds, so a long prompt delays the others by one stage.
    prefill_chunk_tokens: int = 8192      # staged prefill size
    page_size: int = 16                   # KV page size (power of two, 16..256)
    num_pages: int = 0                    # 0 = max_concurrency x ceil(max_model_len / page_size)
    # NOTE: with num_pages == 0, the pool is the smaller of that full-length size and this share of the
    # memory free after the weights, StateImage slots and workspace (CUDA: device memory; CPU: available
    # host memory).
    kv_memory_fraction: float = 0.5
    # NOTE: 0 = auto: the model's native length (max_position_embeddings) when the KV pool holds one
    # sequence of it, else the longest it holds (the Engine decides before loading, `Engine.start_plan`).
    max_model_len: int = 0                # prompt + output limit of one request
    enforce_eager: bool = False           # no CUDA graphs
    decode_step_ahead: bool = True        # decode rounds launch the next step before their sync (step_ahead.py)
    # NOTE: the run's seed (as vLLM's --seed): requests without a seed get consecutive private RNG
    # streams derived from it, so a run is reproducible and another seed changes it; it also seeds
    # the synthetic weights of load_format "dummy".
    seed: int = 0
    # context cache (prefix reuse across requests and conversation turns)
    prefix_cache: bool = True             # reuse and publish checkpoints of hybrid state
    cache_slots: int = -1                 # StateImage slots for inactive checkpoints (-1 = 2 x max_concurrency)
    cache_device_bytes: int = 0           # device budget of inactive checkpoints (0 = bounded by the pools)
    cache_host_bytes: int = 0             # host-memory replica budget (0 = no host replicas)
    cache_capture_stride: int = 0         # also capture every N prompt tokens (0 = off; any N >= 1)
    # weights: "artifact" = a .ninfer file; "dummy" = seeded random weights of a registered `identity`
    # generated on the device, with the built-in Frontend (a benchmarking aid: outputs are synthetic)
    load_format: str = "artifact"
    identity: str = ""                    # required with load_format "dummy" (e.g. qwen3_6-27b)
    # speculative decoding: None (off), a SpeculativeConfig or its dict form {"method": "mtp",
    # "num_speculative_tokens": K}; normalized to SpeculativeConfig | None
    speculative: SpeculativeConfig | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.purpose, Purpose):
            object.__setattr__(self, "purpose", Purpose(self.purpose))
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.dtype not in ("auto", "bf16", "bfloat16", "fp32", "float32"):
            raise ValueError(f"dtype must be auto, bf16 or fp32, got {self.dtype!r}")
        if not (1 <= self.max_concurrency <= MAX_CONCURRENCY):
            raise ValueError(f"max_concurrency must be in 1..{MAX_CONCURRENCY}, got {self.max_concurrency}")
        if not (0 <= self.queue_size <= 4096):
            raise ValueError(f"queue_size must be in 0..4096, got {self.queue_size}")
        if not (self.request_timeout_s > 0):
            raise ValueError(f"request_timeout_s must be > 0, got {self.request_timeout_s}")
        if not (1 <= self.prefill_chunk_tokens <= 65536):
            raise ValueError(f"prefill_chunk_tokens must be in 1..65536, got {self.prefill_chunk_tokens}")
        if self.page_size not in (16, 32, 64, 128, 256):
            raise ValueError(f"page_size must be a power of two in 16..256, got {self.page_size}")
        if self.num_pages < 0:
            raise ValueError(f"num_pages must be >= 0, got {self.num_pages}")
        if not (0.0 < self.kv_memory_fraction <= 0.95):
            raise ValueError(f"kv_memory_fraction must be in (0, 0.95], got {self.kv_memory_fraction}")
        if not (self.max_model_len == 0 or 2 <= self.max_model_len <= 262144):
            raise ValueError(f"max_model_len must be 0 (auto) or in 2..262144, got {self.max_model_len}")
        if not (-1 <= self.cache_slots <= 1024):
            raise ValueError(f"cache_slots must be in -1..1024 (-1 = auto), got {self.cache_slots}")
        for name in ("cache_device_bytes", "cache_host_bytes", "cache_capture_stride"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.load_format not in ("artifact", "dummy"):
            raise ValueError(f"load_format must be artifact or dummy, got {self.load_format!r}")
        if self.load_format == "dummy":
            if not self.identity:
                raise ValueError("load_format dummy needs an identity (e.g. qwen3_6-27b)")
            from ninfer.targets.registry import lookup
            lookup(self.identity)                 # UnknownIdentityError (a ValueError) names the known ones
        elif self.identity:
            raise ValueError("identity is only used with load_format dummy (an artifact names its own)")
        object.__setattr__(self, "speculative", SpeculativeConfig.of(self.speculative))
        if self.speculative is not None and self.purpose is Purpose.CAUSAL_SCORING:
            raise ValueError("speculative decoding applies to generation; purpose causal_scoring takes none")

    @property
    def lookahead(self) -> int:
        """Positions past a request's output that a decode round may write (speculation's K; 0 without)."""
        return 0 if self.speculative is None else self.speculative.lookahead

    @property
    def synthetic(self) -> bool:
        """True for dummy weights: every output of such an engine is meaningless (benchmarks only)."""
        return self.load_format == "dummy"

    @property
    def num_cache_slots(self) -> int:
        if not self.prefix_cache:
            return 0
        return 2 * self.max_concurrency if self.cache_slots < 0 else self.cache_slots

    def resolved(self, cuda_available: bool) -> "EngineConfig":
        """Resolve "auto" values (never mutates)."""
        device = self.device
        if device == "auto":
            device = "cuda" if cuda_available else "cpu"
        dtype = {"bfloat16": "bf16", "float32": "fp32"}.get(self.dtype, self.dtype)
        if dtype == "auto":
            dtype = "bf16" if device.startswith("cuda") else "fp32"
        return replace(self, device=device, dtype=dtype)


class AvailabilityState(str, enum.Enum):
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    SHUTTING_DOWN = "shutting_down"


@dataclass(frozen=True, slots=True)
class Availability:
    state: AvailabilityState
    reason: str = ""

    @property
    def ready(self) -> bool:
        return self.state is AvailabilityState.READY


class ErrorKind(str, enum.Enum):
    OVERLOADED = "overloaded"            # queue full at submit (HTTP 429)
    QUEUE_TIMEOUT = "queue_timeout"      # deadline passed while waiting (HTTP 503/408)
    INVALID_REQUEST = "invalid_request"  # cannot be represented / too long / infeasible (HTTP 400)
    NOT_READY = "not_ready"              # engine starting, failed or shutting down (HTTP 503)
    ENGINE_FAILED = "engine_failed"      # engine-wide failure (HTTP 500)


@dataclass(frozen=True, slots=True)
class Usage:
    num_prompt_tokens: int
    num_output_tokens: int
    num_reused_tokens: int = 0
    num_reasoning_tokens: int = 0
    # speculative decoding (None when it is off): the request's speculative rounds and the drafts they
    # accepted; each round produced its accepted drafts plus one token of the target's
    num_spec_rounds: int | None = None
    num_spec_accepted_tokens: int | None = None

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens taken from the context cache (OpenAI's usage.prompt_tokens_details.cached_tokens)."""
        return self.num_reused_tokens

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens a speculative round produced, averaged over the request's rounds (accepted drafts + 1);
        None without speculation or before the first round."""
        if not self.num_spec_rounds:
            return None
        return 1.0 + (self.num_spec_accepted_tokens or 0) / self.num_spec_rounds


@dataclass(frozen=True, slots=True)
class GenerationStart:
    request_id: str
    num_prompt_tokens: int
    num_reused_tokens: int


@dataclass(frozen=True, slots=True)
class GenerationDelta:
    request_id: str
    delta: OutputDelta
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True, slots=True)
class GenerationResult:
    request_id: str
    text: str
    reasoning: str
    tool_calls: tuple[ToolCall, ...]
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    usage: Usage
    logprobs: tuple[TokenLogprob, ...] | None = None
    extra: dict = field(default_factory=dict)
    # one entry per prompt token when submitted with prompt_logprobs (the first is None: no context)
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None


@dataclass(frozen=True, slots=True)
class GenerationError:
    request_id: str
    kind: ErrorKind
    message: str
    usage: Usage | None = None


GenerationEvent = GenerationStart | GenerationDelta | GenerationResult | GenerationError


class EngineRequestError(RuntimeError):
    """A request the Engine rejected or could not complete.

    Raised by `Engine.submit` for OVERLOADED, NOT_READY and INVALID_REQUEST (nothing was queued), and
    by `GenerationHandle.result()` / `Engine.generate` when the request ended with a GenerationError
    (QUEUE_TIMEOUT, INVALID_REQUEST found at admission, ENGINE_FAILED). Gateways map `kind` to HTTP.
    """

    def __init__(self, kind: ErrorKind, message: str, request_id: str | None = None):
        super().__init__(f"{kind.value}: {message}")
        self.kind = kind
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """Cumulative histogram (Prometheus style): counts[i] = observations <= bounds[i]; `count` is +Inf."""
    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """A consistent snapshot published by the Engine worker (read from any thread; never calls Program)."""
    availability: Availability
    running: int                          # requests holding a lane (materializing, active, terminal pending)
    waiting: int                          # accepted requests not yet admitted
    max_concurrency: int
    queue_size: int
    outstanding: int                      # requests holding outstanding capacity
    outstanding_capacity: int             # max_concurrency + queue_size
    outstanding_capacity_free: int
    pages_total: int
    pages_free: int
    slots_total: int
    slots_free: int
    page_size: int
    num_requests_submitted: int           # accepted at submit
    num_requests_rejected: dict[str, int]  # by ErrorKind value, raised at submit
    num_prompt_tokens: int                # prompt tokens of admitted requests
    num_reused_tokens: int
    num_generation_tokens: int            # committed output tokens
    num_finished: dict[str, int]          # by FinishReason value (results)
    num_errors: dict[str, int]            # by ErrorKind value (GenerationError events)
    num_prefill_units: int
    num_decode_rounds: int
    num_control_units: int
    queue_time_s: HistogramSnapshot
    ttft_s: HistogramSnapshot
    inter_token_s: HistogramSnapshot
    e2e_s: HistogramSnapshot
    decode_batch_size: HistogramSnapshot
    # context cache (prefix reuse): admissions that looked for a source, those that reused one,
    # the prompt tokens reused, checkpoints captured while running, evicted, moved to host memory;
    # inactive checkpoints now and their bytes
    num_cache_queries: int = 0
    num_cache_hits: int = 0
    num_cache_hit_tokens: int = 0
    num_cache_captures: int = 0
    num_cache_evictions: int = 0
    num_cache_offloads: int = 0
    num_checkpoints_device: int = 0
    num_checkpoints_host: int = 0
    checkpoint_device_bytes: int = 0
    checkpoint_host_bytes: int = 0
    # speculative decoding (vLLM's spec_decode counters; all 0 and () when it is off): K, then per round of
    # a row that committed a token: rounds (drafts), draft tokens proposed, drafts accepted, and
    # accepted_per_pos[i] = rounds whose draft at position i was accepted (i = 0..K-1)
    num_speculative_tokens: int = 0
    num_spec_drafts: int = 0
    num_spec_draft_tokens: int = 0
    num_spec_accepted_tokens: int = 0
    num_spec_accepted_per_pos: tuple[int, ...] = ()


# ---------------------------------------------------------------------------------------------
# CausalScoring (Engine.score on an engine started with purpose=CAUSAL_SCORING)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ScoreInput:
    """One text to score: `text` or `token_ids`. With a `context` (text or ids) only the text's
    tokens are scored, each given the context and the text before it (continuation scoring)."""
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    context: str | None = None
    context_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.token_ids is None):
            raise ValueError("ScoreInput needs exactly one of text or token_ids")
        if self.context is not None and self.context_ids is not None:
            raise ValueError("ScoreInput takes at most one of context or context_ids")


@dataclass(frozen=True, slots=True)
class ScoreResult:
    """Scores of one ScoreInput. Tokens are context + text (+ a leading BOS with add_bos).

    num_scored_tokens: tokens with a log-prob (the text's, except the very first token of the
    sequence, which has no context). logprob: their summed log-likelihood (natural log).
    perplexity: exp(-logprob / num_scored_tokens); None when nothing was scored.
    is_greedy: every scored token is the model's argmax (evaluation harnesses' "is_greedy").
    token_logprobs: with per_token, one entry per token of `token_ids`, None where unscored.
    """
    token_ids: tuple[int, ...]
    num_context_tokens: int
    num_scored_tokens: int
    logprob: float
    perplexity: float | None
    is_greedy: bool
    token_logprobs: tuple[TokenLogprob | None, ...] | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)
