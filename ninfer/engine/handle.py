"""What the consumer side holds: the response channel, the request ticket and the GenerationHandle.

Threads:
  worker     puts events into the channel, marks `response_done`
  consumer   iterates (sync or async), cancels, releases (wait ended or handle dropped)
The ticket is the only object both sides share. It carries flags only; the consumer never touches
the request record, the Scheduler or Program.

Capacity release (architecture.md §4):
    release_capacity = response_done && consumer_released && !capacity_released
Either fact may come first; the release runs exactly once.

NOTE: locks here are re-entrant because a dropped handle's finalizer may run inside any thread
(garbage collection), including while that thread already holds one of these locks.
"""
from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections import deque
from typing import Callable

from ninfer.config import (EngineRequestError, GenerationDelta, GenerationError, GenerationEvent,
                          GenerationResult, GenerationStart)

FINAL_EVENTS = (GenerationResult, GenerationError)


def _wake_future(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class ResponseChannel:
    """An unbounded single-consumer event queue readable from threads and from asyncio."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.RLock())
        self._events: deque[GenerationEvent] = deque()
        self._waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None

    def put(self, event: GenerationEvent) -> None:
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            loop, fut = waiter
            try:
                loop.call_soon_threadsafe(_wake_future, fut)
            except RuntimeError:        # the consumer's loop is closed: nobody is waiting any more
                pass

    def get(self, timeout: float | None = None) -> GenerationEvent:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._events:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError("no event within the timeout")
                self._cond.wait(remaining)
            return self._events.popleft()

    def get_nowait(self) -> GenerationEvent | None:
        with self._cond:
            return self._events.popleft() if self._events else None

    async def get_async(self) -> GenerationEvent:
        loop = asyncio.get_running_loop()
        while True:
            with self._cond:
                if self._events:
                    return self._events.popleft()
                fut = loop.create_future()
                self._waiter = (loop, fut)
            await fut


class RequestTicket:
    """Flags shared by the worker and the consumer of one request."""

    def __init__(self, request_id: str, release_capacity: Callable[[], None], wake_worker: Callable[[], None]):
        self.request_id = request_id
        self.channel = ResponseChannel()
        self._lock = threading.RLock()
        self._release_capacity = release_capacity
        self._wake_worker = wake_worker
        self.cancel_requested = False
        self.consumer_released = False
        self.response_done = False
        self.capacity_released = False

    def request_cancel(self) -> None:
        if not self.cancel_requested:
            self.cancel_requested = True
            self._wake_worker()

    def mark_response_done(self) -> None:
        with self._lock:
            self.response_done = True
            self._maybe_release()

    def release_consumer(self) -> None:
        with self._lock:
            self.consumer_released = True
            self._maybe_release()

    def drop(self) -> None:
        """The handle was abandoned: set cancellation and consumer_released, nothing else."""
        if not self.response_done:
            self.request_cancel()
        self.release_consumer()

    def _maybe_release(self) -> None:
        if self.response_done and self.consumer_released and not self.capacity_released:
            self.capacity_released = True
            self._release_capacity()


class GenerationHandle:
    """The consumer's view of one submitted request.

    Iterate it (``for ev in handle`` or ``async for ev in handle``) to receive GenerationStart,
    GenerationDelta events and then exactly one GenerationResult or GenerationError. `result()`
    waits for the final event (raising EngineRequestError for a GenerationError). `cancel()`
    asks the worker to stop the request; it still ends with a final event (a cancelled request
    ends with GenerationResult(finish_reason=CANCELLED) and its partial output). Dropping the
    handle, or `close()`, cancels and releases it.
    """

    def __init__(self, ticket: RequestTicket):
        self._ticket = ticket
        self._final: GenerationResult | GenerationError | None = None
        self._finalizer = weakref.finalize(self, ticket.drop)

    @property
    def request_id(self) -> str:
        return self._ticket.request_id

    @property
    def done(self) -> bool:
        """The final event has been received by this consumer."""
        return self._final is not None

    def cancel(self) -> None:
        self._ticket.request_cancel()

    def close(self) -> None:
        """Stop consuming: cancel if still running and release the consumer side."""
        if self._final is None:
            self._ticket.request_cancel()
        self._ticket.release_consumer()
        self._finalizer.detach()

    def _take(self, event: GenerationEvent) -> GenerationEvent:
        if isinstance(event, FINAL_EVENTS):
            self._final = event
            self._ticket.release_consumer()
            self._finalizer.detach()
        return event

    def next_event(self, timeout: float | None = None) -> GenerationEvent | None:
        """The next event (blocking up to `timeout`); None after the final event was delivered."""
        if self._final is not None:
            return None
        return self._take(self._ticket.channel.get(timeout))

    def poll(self) -> list[GenerationEvent]:
        """All events available now, without blocking."""
        out = []
        while self._final is None:
            ev = self._ticket.channel.get_nowait()
            if ev is None:
                break
            out.append(self._take(ev))
        return out

    def __iter__(self):
        while self._final is None:
            yield self._take(self._ticket.channel.get())

    def __aiter__(self):
        return self

    async def __anext__(self) -> GenerationEvent:
        if self._final is not None:
            raise StopAsyncIteration
        return self._take(await self._ticket.channel.get_async())

    def result(self, timeout: float | None = None) -> GenerationResult:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._final is None:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._take(self._ticket.channel.get(remaining))
        return self._unwrap()

    async def result_async(self) -> GenerationResult:
        while self._final is None:
            self._take(await self._ticket.channel.get_async())
        return self._unwrap()

    def _unwrap(self) -> GenerationResult:
        final = self._final
        if isinstance(final, GenerationError):
            raise EngineRequestError(final.kind, final.message, final.request_id)
        assert isinstance(final, GenerationResult)
        return final

    def __enter__(self) -> "GenerationHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GenerationHandle({self.request_id!r}, done={self.done})"


__all__ = ["GenerationHandle", "RequestTicket", "ResponseChannel", "GenerationStart", "GenerationDelta"]
