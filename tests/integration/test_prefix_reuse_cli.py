"""`ninfer chat` runs one context-cache session by default; `--no-prefix-cache` turns the cache
off and the greedy conversation is the same token for token."""
from __future__ import annotations

import functools

from support.serve_util import ninfer, ninfer_in_process


def test_chat_flags_in_help():
    r = ninfer("chat", "--help")
    assert r.returncode == 0
    for flag in ("--session", "--no-prefix-cache", "--cache-capture-stride", "--cache-host-bytes",
                 "--cache-device-bytes", "--cache-slots"):
        assert flag in r.stdout


def test_chat_with_and_without_the_cache_is_the_same(capsys, monkeypatch):
    ninfer = functools.partial(ninfer_in_process, capsys, monkeypatch)      # the CLI's main, in this process
    script = "/think off\nHello\nTell me more\nAnd more\n"
    args = ("chat", "--max-tokens", "6", "--temperature", "0")
    cached = ninfer(*args, "--session", "cli-test", input=script)
    plain = ninfer(*args, "--no-prefix-cache", input=script)
    assert cached.returncode == 0 and plain.returncode == 0, cached.stderr + plain.stderr
    assert cached.stdout == plain.stdout
    assert cached.stdout.count("[answer cut at --max-tokens]") == 3
