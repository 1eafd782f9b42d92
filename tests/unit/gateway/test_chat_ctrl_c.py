"""`ninfer chat`'s Ctrl-C guard: the SIGINT handler cancels the streaming request itself, so the
answer ends even when the KeyboardInterrupt it raises is lost (Python runs handlers at the next
bytecode of the main thread, which may be a finalizer that swallows the exception)."""
from __future__ import annotations

import signal
import threading

import pytest

from ninfer.gateway.cli.cmd_chat import _CtrlC


class _Handle:
    def __init__(self) -> None:
        self.cancels = 0

    def cancel(self) -> None:
        self.cancels += 1


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_sigint_cancels_the_request_before_raising():
    handle = _Handle()
    before = signal.getsignal(signal.SIGINT)
    guard = _CtrlC(handle)
    try:
        assert signal.getsignal(signal.SIGINT) == guard._on_sigint
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
            sum(range(1000))                # the handler runs at a bytecode boundary of this thread
        assert guard.pressed and handle.cancels == 1
        try:                                # a finalizer swallowing the interrupt: the request is cancelled anyway
            signal.raise_signal(signal.SIGINT)
            sum(range(1000))
        except KeyboardInterrupt:
            pass
        assert handle.cancels == 2
    finally:
        guard.restore()
    assert signal.getsignal(signal.SIGINT) is before


def test_a_chat_off_the_main_thread_installs_no_handler():
    handle = _Handle()
    before = signal.getsignal(signal.SIGINT)
    out: list = []
    t = threading.Thread(target=lambda: out.append(_CtrlC(handle)))
    t.start()
    t.join()
    assert signal.getsignal(signal.SIGINT) is before
    out[0].restore()
    assert not out[0].pressed and handle.cancels == 0
