"""RequestIntake: the one door between caller threads and the Engine worker.

Everything that caller threads and the worker share lives here, under one condition:

    state                 written by                       read by
    -------------------   ------------------------------   ----------------------------------
    inbox                 submit (caller)                  the worker, at boundary step 0
    calls                 call_on_worker (caller)          the worker, at boundary step 0
    wake flag             submit, ticket flags, close      the worker, before it blocks
    availability          the worker (open, fail), close   everyone
    closing, drain time   request_close (caller)           the worker (drain, idle timeout)
    stopped               the worker                       the worker loop, the facade

A submit validates the request, builds its Frontend OutputSession, takes one unit of outstanding
capacity and appends a new RequestRecord to the inbox; it never touches the Scheduler, the
ResourceManager or Program. Rejections raise EngineRequestError (OVERLOADED | NOT_READY |
INVALID_REQUEST) before anything is accepted.
"""
from __future__ import annotations

import itertools
import threading
import uuid
from collections import deque
from concurrent.futures import Future
from typing import Any, Callable

from ninfer.config import Availability, AvailabilityState, EngineRequestError, ErrorKind
from ninfer.contract.frontend import OutputOptions, PreparedPrompt
from ninfer.contract.program import SamplingParams
from ninfer.engine.admission_policy import OutstandingCapacity
from ninfer.engine.handle import GenerationHandle, RequestTicket
from ninfer.engine.metrics import MetricsCollector
from ninfer.engine.request_record import RequestRecord

MAX_SESSION_ID_CHARS = 256
MAX_PROMPT_LOGPROBS = 20


class RequestIntake:
    def __init__(self, frontend: Any, metrics: MetricsCollector, capacity: OutstandingCapacity, *,
                 max_concurrency: int, queue_size: int, request_timeout_s: float, max_model_len: int,
                 clock: Callable[[], float]):
        self.frontend = frontend
        self.metrics = metrics
        self.capacity = capacity
        self.max_concurrency = max_concurrency
        self.queue_size = queue_size
        self.request_timeout_s = request_timeout_s
        self.max_model_len = max_model_len        # capped by Program's own limit in `open`
        self.lookahead = 0                        # Program's speculative lookahead (set in `open`)
        self.supports_media = False               # Program reads images and video (set in `open`)
        self.media_patch_limit = 0                # patches of the largest media input Program admits
        self.clock = clock
        self._cv = threading.Condition(threading.RLock())   # NOTE: re-entrant, handle finalizers wake us
        self._inbox: deque[RequestRecord] = deque()
        self._calls: deque[tuple[Callable[[], Any], Future]] = deque()
        self._wake = False
        self._order = itertools.count(1)
        self._availability = Availability(AvailabilityState.STARTING)
        self._use_cache = False                   # the context cache exists (set in `open`)
        self.closing = False
        self.drain_deadline: float | None = None
        self.stopped = False

    # ================================ any thread ========================================
    @property
    def availability(self) -> Availability:
        return self._availability

    def wake(self) -> None:
        with self._cv:
            self._wake = True
            self._cv.notify_all()

    def submit(self, prompt: PreparedPrompt, sampling: SamplingParams, *, max_tokens: int,
               output: OutputOptions = OutputOptions(), request_id: str | None = None,
               deadline_s: float | None = None, prompt_logprobs: int | None = None,
               session_id: str | None = None, context_cache: bool = True) -> GenerationHandle:
        """Accept one request or raise EngineRequestError(OVERLOADED | NOT_READY | INVALID_REQUEST).

        session_id: a context-cache lookup hint (the conversation); context_cache=False: this
        request neither reuses nor publishes checkpoints (serve warmup)."""
        if not self._availability.ready:
            raise self._reject(ErrorKind.NOT_READY, f"engine is {self._availability.state.value}"
                               + (f": {self._availability.reason}" if self._availability.reason else ""))
        self._validate(prompt, sampling, max_tokens, output, deadline_s, prompt_logprobs, session_id)
        try:
            session = self.frontend.new_session(prompt, output)
        except (ValueError, TypeError) as e:
            raise self._reject(ErrorKind.INVALID_REQUEST, f"output options: {e}") from e
        if not self.capacity.try_acquire():
            raise self._reject(ErrorKind.OVERLOADED, f"engine holds {self.capacity.limit} outstanding requests "
                               f"(max_concurrency {self.max_concurrency} + queue_size {self.queue_size})")
        rid = request_id or f"req-{uuid.uuid4().hex[:16]}"
        ticket = RequestTicket(rid, self.capacity.release, self.wake)
        now = self.clock()
        timeout = self.request_timeout_s if deadline_s is None else deadline_s
        with self._cv:
            if not self._availability.ready or self.closing:
                self.capacity.release()
                raise self._reject(ErrorKind.NOT_READY, f"engine is {self._availability.state.value}")
            rec = RequestRecord(request_id=rid, publication_order=next(self._order), prompt=prompt,
                                sampling=sampling, max_tokens=max_tokens, options=output, session=session,
                                ticket=ticket, submit_time=now, deadline=now + timeout,
                                session_key=session_id, use_cache=bool(context_cache) and self._use_cache)
            if sampling.logprobs is not None:
                rec.logprobs = []
            if prompt_logprobs is not None:
                rec.prompt_logprobs, rec.prompt_logprob_entries = prompt_logprobs, []
            self._inbox.append(rec)
            self._wake = True
            self._cv.notify_all()
        self.metrics.submitted()
        return GenerationHandle(ticket)

    def call_on_worker(self, fn: Callable[[], Any]) -> Future:
        """Queue fn() for the worker's next boundary (see `EngineCore.call_on_worker`)."""
        fut: Future = Future()
        with self._cv:
            if not self._availability.ready or self.closing:
                raise EngineRequestError(ErrorKind.NOT_READY, f"engine is {self._availability.state.value}")
            self._calls.append((fn, fut))
            self._wake = True
            self._cv.notify_all()
        return fut

    def request_close(self, deadline: float) -> None:
        """Stop accepting; the worker drains outstanding requests until `deadline` (clock time)."""
        with self._cv:
            if self._availability.state is not AvailabilityState.FAILED:
                self._availability = Availability(AvailabilityState.SHUTTING_DOWN, "engine is closing")
            self.closing = True
            self.drain_deadline = deadline if self.drain_deadline is None else min(self.drain_deadline, deadline)
            self._wake = True
            self._cv.notify_all()

    def _reject(self, kind: ErrorKind, message: str) -> EngineRequestError:
        self.metrics.rejected_at_submit(kind.value)
        return EngineRequestError(kind, message)

    def _validate(self, prompt, sampling, max_tokens, output, deadline_s, prompt_logprobs, session_id) -> None:
        def bad(msg: str) -> EngineRequestError:
            return self._reject(ErrorKind.INVALID_REQUEST, msg)
        if not isinstance(prompt, PreparedPrompt):
            raise bad(f"prompt must be a PreparedPrompt, got {type(prompt).__name__}")
        if not isinstance(sampling, SamplingParams):
            raise bad(f"sampling must be SamplingParams, got {type(sampling).__name__}")
        if not isinstance(output, OutputOptions):
            raise bad(f"output must be OutputOptions, got {type(output).__name__}")
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise bad(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        if prompt.num_prompt_tokens < 1:
            raise bad("the prompt has no tokens")
        if prompt.media:
            # NOTE: without a vision schedule (or without the media's pixels) only the placeholder tokens would
            #       reach the model, two different images giving the same tokens: refused.
            kinds = sorted({m.kind for m in prompt.media})
            if not self.supports_media:
                raise bad(f"this model takes no {' or '.join(kinds)} input (it has no vision tower): the prompt has "
                          f"{len(prompt.media)} media part(s); send text only")
            if any(m.pixel_values is None for m in prompt.media):
                raise bad("the prompt's media parts carry no pixels (render it with the media themselves)")
            for i, m in enumerate(prompt.media):
                n = m.grid_thw[0] * m.grid_thw[1] * m.grid_thw[2]
                if n > self.media_patch_limit:
                    raise bad(f"media part {i} ({m.kind}) has {n} patches, over the {self.media_patch_limit} the "
                              f"vision tower is planned for (send a smaller {m.kind})")
        lookahead = self.lookahead
        if prompt.num_prompt_tokens + max_tokens + lookahead > self.max_model_len:
            if not lookahead:
                raise bad(f"prompt ({prompt.num_prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds "
                          f"max_model_len {self.max_model_len}")
            raise bad(f"prompt ({prompt.num_prompt_tokens} tokens) + max_tokens ({max_tokens}) + the speculative "
                      f"lookahead ({lookahead}) exceeds max_model_len {self.max_model_len}: at most "
                      f"{max(0, self.max_model_len - lookahead - prompt.num_prompt_tokens)} output tokens fit")
        if deadline_s is not None and not deadline_s > 0:
            raise bad(f"deadline_s must be > 0, got {deadline_s}")
        if session_id is not None and (not isinstance(session_id, str) or not session_id
                                       or len(session_id) > MAX_SESSION_ID_CHARS):
            raise bad(f"session_id must be a non-empty string of at most {MAX_SESSION_ID_CHARS} characters")
        if prompt_logprobs is not None and (isinstance(prompt_logprobs, bool) or not isinstance(prompt_logprobs, int)
                                            or not 0 <= prompt_logprobs <= MAX_PROMPT_LOGPROBS):
            raise bad(f"prompt_logprobs must be in 0..{MAX_PROMPT_LOGPROBS}, got {prompt_logprobs!r}")

    # ================================ worker ============================================
    def open(self, max_model_len: int, use_cache: bool, lookahead: int = 0, supports_media: bool = False,
             media_patch_limit: int = 0) -> None:
        """Program is attached: cap the request limit by Program's, take its lookahead, whether it reads media
        and the largest media input it is planned for, and start accepting."""
        self.max_model_len = min(self.max_model_len, max_model_len)
        self.lookahead = lookahead
        self.supports_media = supports_media
        self.media_patch_limit = media_patch_limit
        self._use_cache = use_cache
        with self._cv:
            if self._availability.state is AvailabilityState.STARTING:
                self._availability = Availability(AvailabilityState.READY)

    def fail(self, reason: str) -> bool:
        """Mark the engine FAILED and stopped; False when a failure already stopped it."""
        with self._cv:
            if self._availability.state is AvailabilityState.FAILED and self.stopped:
                return False
            self._availability = Availability(AvailabilityState.FAILED, reason)
            self.stopped = True
            self._cv.notify_all()
            return True

    def take_new(self) -> list[RequestRecord]:
        """The submissions since the last boundary, in publication order; clears the wake flag."""
        with self._cv:
            self._wake = False
            new = list(self._inbox)
            self._inbox.clear()
        return new

    def take_all(self) -> list[RequestRecord]:
        """Engine failure: the submissions the worker never took."""
        with self._cv:
            new = list(self._inbox)
            self._inbox.clear()
        return new

    @property
    def num_inbox(self) -> int:
        with self._cv:
            return len(self._inbox)

    def stop_if_drained(self, num_records: int) -> bool:
        """While closing: stop once no record is outstanding and no submission is left in the inbox."""
        with self._cv:
            idle = not num_records and not self._inbox
            if idle:
                self.stopped = True
        return idle

    def wait(self, timeout: float | None) -> None:
        """Block until woken (a submission, a ticket flag, a call, close) or until `timeout`."""
        with self._cv:
            if not self._wake:
                self._cv.wait(timeout)

    def run_calls(self) -> bool:
        calls = self._take_calls()
        for fn, fut in calls:
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - the caller's error, handed back on its Future
                fut.set_exception(e)
        return bool(calls)

    def drop_calls(self) -> None:
        for _, fut in self._take_calls():
            if fut.set_running_or_notify_cancel():
                fut.set_exception(EngineRequestError(ErrorKind.NOT_READY,
                                                     f"engine is {self._availability.state.value}"))

    def _take_calls(self) -> list[tuple[Callable[[], Any], Future]]:
        with self._cv:
            calls = list(self._calls)
            self._calls.clear()
        return calls
