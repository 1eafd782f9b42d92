"""The engine requests of one HTTP request (one per choice): submit, follow, wait, close.

A client that goes away closes its handles, which cancels the requests and gives their capacity
back; every engine request gets one log line (id, tokens, TTFT, tokens/s, with speculative decoding
its rounds and mean acceptance length, finish reason).
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from ninfer.config import EngineRequestError, GenerationDelta, GenerationError, GenerationResult, GenerationStart
from ninfer.gateway.http import responses as R
from ninfer.gateway.http.convert import EngineCall
from ninfer.gateway.http.errors import from_engine_error
from ninfer.gateway.http.state import GatewayState

log = logging.getLogger("ninfer.gateway.http")


class ClientGone(Exception):
    """The HTTP client disconnected before its response was complete."""


async def until_disconnect(request: Request, aw, poll_s: float = 0.2):
    """Await `aw`; if the client disconnects first, cancel it and raise ClientGone."""
    task = asyncio.ensure_future(aw)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        if not task.done():
            task.cancel()


class Run:
    """One engine request of an HTTP request: its handle, progress and timings for the log line."""

    def __init__(self, call: EngineCall, handle, request_id: str):
        self.call = call
        self.handle = handle
        self.request_id = request_id
        self.t_submit = time.monotonic()
        self.t_first: float | None = None
        self.num_prompt_tokens = call.prompt.num_prompt_tokens
        self.num_reused_tokens = 0
        self.num_output_tokens = 0
        self.mean_acceptance_length: float | None = None    # speculative decoding (Usage)
        self.num_spec_rounds: int | None = None
        self.final: GenerationResult | GenerationError | None = None
        self.text_offset = 0                  # legacy logprobs text_offset in streamed text
        self.logged = False

    def observe(self, ev) -> None:
        if isinstance(ev, GenerationStart):
            self.num_prompt_tokens = ev.num_prompt_tokens
            self.num_reused_tokens = ev.num_reused_tokens
        elif isinstance(ev, GenerationDelta):
            if ev.token_ids and self.t_first is None:
                self.t_first = time.monotonic()
            self.num_output_tokens += len(ev.token_ids)
        elif isinstance(ev, (GenerationResult, GenerationError)):
            self.final = ev
            if ev.usage is not None:
                self.num_output_tokens = ev.usage.num_output_tokens
                self.num_reused_tokens = ev.usage.num_reused_tokens
                self.num_spec_rounds = ev.usage.num_spec_rounds
                self.mean_acceptance_length = ev.usage.mean_acceptance_length
            self.log_line()

    def log_line(self) -> None:
        self.logged = True
        end = time.monotonic()
        ttft = f"{self.t_first - self.t_submit:.3f}s" if self.t_first is not None else "-"
        elapsed = end - self.t_submit
        rate = self.num_output_tokens / elapsed if elapsed > 0 else 0.0
        if self.final is None:
            outcome = "finish=abort (client gone)"
        elif isinstance(self.final, GenerationError):
            outcome = f"error={self.final.kind.value}"
        else:
            outcome = f"finish={R.FINISH.get(self.final.finish_reason, self.final.finish_reason.value)}"
        spec = ""
        if self.num_spec_rounds is not None:
            mal = self.mean_acceptance_length
            spec = (f" spec_rounds={self.num_spec_rounds} "
                    f"mean_acceptance_length={'-' if mal is None else format(mal, '.2f')}")
        log.info("request %s prompt_tokens=%d cached_tokens=%d output_tokens=%d ttft=%s tokens/s=%.1f "
                 "e2e=%.3fs%s %s", self.request_id, self.num_prompt_tokens, self.num_reused_tokens,
                 self.num_output_tokens, ttft, rate, elapsed, spec, outcome)


def submit_all(state: GatewayState, engine, calls: tuple[EngineCall, ...], rid: str) -> list[Run]:
    runs: list[Run] = []
    try:
        for c in calls:
            request_id = rid if len(calls) == 1 else f"{rid}-{c.index}"
            kw = {} if c.prompt_logprobs is None else {"prompt_logprobs": c.prompt_logprobs}
            if c.session_id is not None:
                kw["session_id"] = c.session_id
            handle = engine.submit(c.prompt, c.sampling, max_tokens=c.max_tokens, output=c.output,
                                   request_id=request_id, **kw)
            state.inflight.add(handle)
            runs.append(Run(c, handle, request_id))
    except EngineRequestError as e:
        close_runs(state, runs, log_unfinished=False)
        log.info("request %s refused: %s", rid, e)
        raise from_engine_error(GenerationError(rid, e.kind, e.message)) from None
    except BaseException:
        close_runs(state, runs, log_unfinished=False)      # NOTE: choices already submitted give capacity back
        raise
    return runs


def close_runs(state: GatewayState, runs: list[Run], log_unfinished: bool = True) -> None:
    for r in runs:
        r.handle.close()            # cancels a request that has not ended; releases the consumer side
        state.inflight.discard(r.handle)
        if log_unfinished and r.final is None and not r.logged:
            r.log_line()


async def merged_events(runs: list[Run]) -> AsyncIterator[tuple[Run, object]]:
    """Events of several runs in arrival order, until every run has its final event."""
    if len(runs) == 1:
        run = runs[0]
        async for ev in run.handle:
            run.observe(ev)
            yield run, ev
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(run: Run) -> None:
        async for ev in run.handle:
            await queue.put((run, ev))

    tasks = [asyncio.ensure_future(pump(r)) for r in runs]
    try:
        remaining = len(runs)
        while remaining:
            run, ev = await queue.get()
            run.observe(ev)
            if isinstance(ev, (GenerationResult, GenerationError)):
                remaining -= 1
            yield run, ev
    finally:
        for t in tasks:
            t.cancel()


async def collect(runs: list[Run]) -> None:
    async for _ in merged_events(runs):
        pass


def first_error(runs: list[Run]) -> GenerationError | None:
    for r in sorted(runs, key=lambda r: r.call.index):
        if isinstance(r.final, GenerationError):
            return r.final
    return None


async def finished_runs(request: Request, state: GatewayState, runs: list[Run], rid: str):
    """Wait for every run of a non-streaming request: the runs in choice order, a 499 Response
    when the client left (its requests are cancelled), or the engine's error raised."""
    try:
        await until_disconnect(request, collect(runs))
    except ClientGone:
        log.info("request %s: client disconnected; cancelled", rid)
        return Response(status_code=499)
    finally:
        close_runs(state, runs)
    err = first_error(runs)
    if err is not None:
        raise from_engine_error(err)
    return sorted(runs, key=lambda r: r.call.index)
