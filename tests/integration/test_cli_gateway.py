"""The `ninfer generate | chat | serve` commands on the demo model: --help, the one-line errors and
Ctrl-C/Ctrl-D as real subprocesses (`python -m ninfer`), the generate and chat sessions through the
CLI's `main` in this process (support.serve_util.ninfer_in_process: the same command code, no new
interpreter to start). (`serve` is exercised end to end by test_serve_*.py; here: its flags and errors.)"""
from __future__ import annotations

import functools
import json
import signal
import subprocess
import sys
import threading
import time

import pytest

from support.serve_util import REPO, cli_env, ninfer, ninfer_in_process

NOTICE = "its text is meaningless"


@pytest.mark.parametrize("cmd", ["generate", "chat", "serve"])
def test_help(cmd):
    r = ninfer(cmd, "--help")
    assert r.returncode == 0
    for flag in ("--max-concurrency", "--queue-size", "--device", "--dtype", "--page-size", "--max-model-len",
                 "--prefill-chunk-tokens", "--enforce-eager"):
        assert flag in r.stdout
    if cmd == "serve":
        assert "--api-key" in r.stdout and "--host" in r.stdout and "--port" in r.stdout


def test_generate_streams_and_reports_usage(capsys, monkeypatch):
    ninfer = functools.partial(ninfer_in_process, capsys, monkeypatch)
    a = ninfer("generate", "-p", "Hello", "--max-tokens", "5", "--temperature", "0")
    assert a.returncode == 0, a.stderr
    assert a.stdout.strip()
    assert a.stderr.count(NOTICE) == 1
    usage = [line for line in a.stderr.splitlines() if line.startswith("[usage]")]
    assert len(usage) == 1 and "output_tokens=5" in usage[0] and "finish_reason=length" in usage[0]
    b = ninfer("generate", "-p", "Hello", "--max-tokens", "5", "--temperature", "0")
    assert b.stdout == a.stdout                      # greedy is deterministic


def test_generate_json_and_chat_channels(capsys, monkeypatch):
    ninfer = functools.partial(ninfer_in_process, capsys, monkeypatch)
    r = ninfer("generate", "-p", "Hello", "--max-tokens", "4", "--json", "--chat", "--temperature", "0")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["finish_reason"] == "length" and out["usage"]["output_tokens"] == 4
    # thinking on (default): the random model never closes </think>, so all of it is reasoning
    assert out["reasoning"] and out["text"] == "" and out["usage"]["reasoning_tokens"] == 4
    off = json.loads(ninfer("generate", "-p", "Hello", "--max-tokens", "4", "--json", "--chat", "--think", "off",
                            "--temperature", "0").stdout)
    assert off["text"] and off["reasoning"] == "" and off["usage"]["reasoning_tokens"] == 0
    # streaming text mode: reasoning goes to stderr, the answer to stdout
    s = ninfer("generate", "-p", "Hello", "--max-tokens", "4", "--chat", "--temperature", "0")
    assert s.returncode == 0 and s.stdout.strip() == "" and out["reasoning"] in s.stderr


@pytest.mark.parametrize("args,message", [
    (("generate", "missing.ninfer", "-p", "x"), "model file not found: missing.ninfer"),
    (("generate", "-p", "x", "--max-concurrency", "9"), "max_concurrency must be in 1..8"),
    (("generate", "-p", "x", "--max-tokens", "0"), "--max-tokens must be >= 1"),
    (("serve", "--port", "70000"), "--port must be in 0..65535"),
    (("chat", "/nonexistent/dir/"), "model file not found"),
])
def test_errors_are_one_line(args, message):
    r = ninfer(*args)
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.strip() and NOTICE not in line]
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("ninfer ")
    assert "Traceback" not in r.stderr


def test_chat_commands_through_stdin(capsys, monkeypatch):
    ninfer = functools.partial(ninfer_in_process, capsys, monkeypatch)
    script = "/think off\nHello\n/system You are terse.\nHi again\n/think maybe\n/reset\n/help\nLast one\n"
    r = ninfer("chat", "--max-tokens", "3", "--temperature", "0", input=script)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for expected in ("[thinking off]", "[system message set; conversation reset]", "usage: /think on|off",
                     "[conversation reset]", "commands: /reset"):
        assert expected in out
    assert out.count("[answer cut at --max-tokens]") == 3
    assert r.stderr.count(NOTICE) == 1


def test_chat_ctrl_c_cancels_answer_and_ctrl_d_exits():
    proc = subprocess.Popen([sys.executable, "-m", "ninfer", "chat", "--think", "off", "--max-tokens", "5000",
                             "--temperature", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env(), cwd=REPO)
    out: list[str] = []

    def reader() -> None:
        while True:
            ch = proc.stdout.read(1)
            if not ch:
                return
            out.append(ch)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        def wait_for(cond, timeout: float = 120.0) -> None:
            deadline = time.monotonic() + timeout
            while not cond():
                assert time.monotonic() < deadline, "".join(out)
                assert proc.poll() is None, "".join(out) + proc.stderr.read()
                time.sleep(0.05)

        wait_for(lambda: "chatting with" in "".join(out))
        proc.stdin.write("Tell me everything\n")
        proc.stdin.flush()
        mark = len("".join(out))
        wait_for(lambda: len("".join(out)) > mark + 40)          # the answer is streaming
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: "[cancelled]" in "".join(out))
        proc.stdin.write("/think on\n")                          # still in the chat
        proc.stdin.flush()
        wait_for(lambda: "[thinking on]" in "".join(out))
        proc.stdin.close()                                       # Ctrl-D
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
