"""CausalScoreCore: the Engine of the CausalScoring purpose (architecture.md §1).

Scoring calls Program serially, one window at a time, on the caller's thread under one lock. It
creates no request record, continuation, checkpoint or cache replica, and never enters the
Scheduler or the ResourceManager: each window runs over Program's temporary empty State and Main
KV (`ninfer.contract.scoring`). The facade (`ninfer.Engine`) uses the same lifecycle
methods as EngineCore (attach_program, fail_startup, run, request_close, availability, metrics);
`submit` refuses every generation request.

Windows follow the standard sliding-window perplexity recipe (Hugging Face "Perplexity of
fixed-length models") over the token sequence t_0 .. t_{N-1}:

    prev_end = 0
    for begin in 0, stride, 2*stride, ...:
        end = min(begin + window, N)
        window tokens t[begin:end], fed at positions 0 .. end-begin-1 over an empty state
        scored: t_j for max(prev_end, begin + 1, first_target) <= j < end
        prev_end = end; stop when end == N

Tokens of the overlap are context, never scored twice; with overlapping windows (stride <
window) every token j >= max(1, first_target) is scored exactly once. Token 0 is never scored (the family has no BOS; `add_bos` prepends one).
With stride == window the first token of every window has no context and is not scored, exactly
as in the recipe (its `labels` at window position 0 are dropped by the shift). NOTE: the recipe's
`num_loss_tokens = num_valid_tokens - 1` undercounts by one per window when windows overlap; the
counts here are the tokens actually scored (the ones `outputs.loss` averages over).
"""
from __future__ import annotations

import math
import threading
from typing import Any, Callable, NamedTuple, Sequence

from ninfer.contract.scoring import CausalScoringProgram, ScoringWindow
from ninfer.contract.program import TokenLogprob
from ninfer.engine.metrics import MetricsCollector
from ninfer.config import (Availability, AvailabilityState, EngineMetrics, EngineRequestError, ErrorKind,
                          ScoreInput, ScoreResult)

MAX_TOP_K = 20
BOS_TOKEN = "<|endoftext|>"        # the document separator; Qwen3.6's tokenizer defines no bos_token


class WindowPlan(NamedTuple):
    begin: int                     # absolute index of the window's first token
    end: int                       # absolute end (exclusive)
    first_scored: int              # absolute index of the first scored token (begin < first_scored < end)
    advance: int                   # tokens the recipe moves past with this window (progress)


def plan_windows(num_tokens: int, window: int, stride: int, first_target: int = 1) -> list[WindowPlan]:
    """The windows that score tokens max(1, first_target) .. num_tokens-1 (see the module docstring).
    Windows of the recipe without a scored token are left out (their `advance` moves to the next)."""
    if not (2 <= window and 1 <= stride <= window):
        raise ValueError(f"window must be >= 2 and stride in 1..window, got window {window}, stride {stride}")
    out: list[WindowPlan] = []
    prev_end = carried = 0
    for begin in range(0, num_tokens, stride):
        end = min(begin + window, num_tokens)
        lo = max(prev_end, begin + 1, first_target)
        carried += end - prev_end
        if lo < end:
            out.append(WindowPlan(begin, end, lo, carried))
            carried = 0
        prev_end = end
        if end == num_tokens:
            break
    return out


class CausalScoreCore:
    def __init__(self, frontend: Any, *, max_model_len: int):
        self.frontend = frontend
        self.max_model_len = max_model_len
        self.program: CausalScoringProgram | None = None
        self._availability = Availability(AvailabilityState.STARTING)
        self._lock = threading.Lock()                  # NOTE: Program is called serially, one window at a time
        self._closed = threading.Event()
        self.metrics_collector = MetricsCollector(1, 0, 0)
        self.num_windows = 0
        self.num_scored_tokens = 0

    # ---- lifecycle (the facade's worker thread) -------------------------------------------
    @property
    def availability(self) -> Availability:
        return self._availability

    def attach_program(self, program: CausalScoringProgram) -> None:
        window = getattr(program, "scoring_window", 0)
        if not window:
            self.fail_startup("a CausalScoring engine needs a Program built for purpose 'causal_scoring'")
            return
        self.program = program
        self.max_model_len = min(self.max_model_len, window)
        if self._availability.state is AvailabilityState.STARTING:
            self._availability = Availability(AvailabilityState.READY)

    def fail_startup(self, reason: str) -> None:
        self._availability = Availability(AvailabilityState.FAILED, reason)
        self._closed.set()

    def run(self) -> None:
        """Nothing to schedule: scoring runs on the caller's thread. Wait for close."""
        self._closed.wait()

    def request_close(self, timeout: float) -> None:
        with self._lock:                       # NOTE: waits for a running score() to end
            if self._availability.state is not AvailabilityState.FAILED:
                self._availability = Availability(AvailabilityState.SHUTTING_DOWN, "engine is closing")
        self._closed.set()

    def metrics(self) -> EngineMetrics:
        return self.metrics_collector.snapshot(self._availability, 0)

    def submit(self, *args, **kwargs):
        raise EngineRequestError(
            ErrorKind.INVALID_REQUEST,
            "this engine was started for purpose 'causal_scoring': it scores texts with Engine.score() and "
            "does not accept generation requests (start an Engine with EngineConfig(purpose='generation'))")

    # ---- scoring ----------------------------------------------------------------------------
    def score(self, inputs: Sequence[ScoreInput], *, window: int | None = None, stride: int | None = None,
              per_token: bool = False, top_k: int = 0, add_bos: bool = False,
              progress: Callable[[int], None] | None = None) -> list[ScoreResult]:
        self._require_ready()
        window = self.max_model_len if window is None else window
        stride = window if stride is None else stride
        if not (2 <= window <= self.max_model_len):
            raise _invalid(f"window must be in 2..{self.max_model_len} (max_model_len), got {window}")
        if not (1 <= stride <= window):
            raise _invalid(f"stride must be in 1..window ({window}), got {stride}")
        if not (0 <= top_k <= MAX_TOP_K):
            raise _invalid(f"top_k must be in 0..{MAX_TOP_K}, got {top_k}")
        prepared = [self._tokens(x, add_bos, i) for i, x in enumerate(inputs)]
        with self._lock:
            self._require_ready()
            return [self._score_one(ids, first, window, stride, per_token, top_k, progress)
                    for ids, first in prepared]

    def _require_ready(self) -> None:
        a = self._availability
        if not a.ready:
            raise EngineRequestError(ErrorKind.NOT_READY, f"engine is {a.state.value}" + (f": {a.reason}" if a.reason else ""))

    def _tokens(self, x: ScoreInput, add_bos: bool, i: int) -> tuple[tuple[int, ...], int]:
        """(token ids, number of context tokens incl. BOS) of one input."""
        if not isinstance(x, ScoreInput):
            raise _invalid(f"inputs[{i}] must be a ScoreInput, got {type(x).__name__}")
        enc = self.frontend.tokenizer.encode
        ctx = tuple(x.context_ids) if x.context_ids is not None else tuple(enc(x.context)) if x.context else ()
        body = tuple(x.token_ids) if x.token_ids is not None else tuple(enc(x.text))
        bos: tuple[int, ...] = ()
        if add_bos:
            tid = self.frontend.tokenizer.token_to_id(BOS_TOKEN)
            if tid is None:
                raise _invalid(f"add_bos: the tokenizer has no {BOS_TOKEN} token")
            bos = (tid,)
        ids = bos + ctx + body
        vocab = self.frontend.vocab_size
        for j, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, int) or not (0 <= t < vocab):
                raise _invalid(f"inputs[{i}]: token {j} = {t!r} is outside the vocabulary 0..{vocab - 1}")
        return ids, len(bos) + len(ctx)

    def _score_one(self, ids: tuple[int, ...], num_context: int, window: int, stride: int, per_token: bool, top_k: int,
                   progress: Callable[[int], None] | None) -> ScoreResult:
        n = len(ids)
        per: list[TokenLogprob | None] = [None] * n
        total, scored, greedy = 0.0, 0, True
        plans = plan_windows(n, window, stride, max(1, num_context))
        for p in plans:
            try:
                res = self.program.score_window(ScoringWindow(ids[p.begin:p.end], p.first_scored - p.begin, top_k))
            except Exception as e:  # noqa: BLE001 - a Program failure fails the engine as a whole
                self._availability = Availability(AvailabilityState.FAILED, f"{type(e).__name__}: {e}")
                raise EngineRequestError(ErrorKind.ENGINE_FAILED, f"scoring failed: {type(e).__name__}: {e}") from e
            m = p.end - p.first_scored
            if len(res.token_logprobs) != m or len(res.ranks) != m or len(res.top) != m:
                self._availability = Availability(AvailabilityState.FAILED, "Program returned a malformed window")
                raise EngineRequestError(ErrorKind.ENGINE_FAILED,
                                         f"Program scored {len(res.token_logprobs)} tokens of a window with {m}")
            total += math.fsum(res.token_logprobs)
            scored += m
            greedy = greedy and all(r == 1 for r in res.ranks)
            if per_token:
                for k in range(m):
                    j = p.first_scored + k
                    per[j] = TokenLogprob(ids[j], res.token_logprobs[k], res.top[k])
            self.num_windows += 1
            if progress is not None:
                progress(p.advance)
        if progress is not None:
            rest = n - sum(p.advance for p in plans)
            if rest > 0:
                progress(rest)
        self.num_scored_tokens += scored
        return ScoreResult(token_ids=ids, num_context_tokens=num_context, num_scored_tokens=scored,
                           logprob=total, perplexity=math.exp(-total / scored) if scored else None,
                           is_greedy=greedy, token_logprobs=tuple(per) if per_token else None)


def _invalid(message: str) -> EngineRequestError:
    return EngineRequestError(ErrorKind.INVALID_REQUEST, message)
