"""Helpers for the Gateway tests: a real `ninfer serve` subprocess on a free loopback port, the
shared test cache directory (demo model built once), and a scripted tool-calling artifact."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def shared_cache_dir() -> Path:
    """A persistent per-user cache for tests (demo artifact, tokenizer.json), outside ~/.cache."""
    root = os.environ.get("NINFER_TEST_CACHE_ROOT") or tempfile.gettempdir()   # set by tests/conftest.py
    d = Path(root) / f"ninfer-test-cache-{os.getuid()}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def cli_env(**extra: str) -> dict:
    env = dict(os.environ)
    env["NINFER_CACHE_DIR"] = str(shared_cache_dir())
    env.setdefault("OMP_NUM_THREADS", "1")      # several test processes share two cores
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m ninfer serve ...` on 127.0.0.1:<free port>; stop() sends SIGTERM and waits."""

    def __init__(self, *args: str, api_key: str | None = None, log_path: Path | None = None):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        cmd = [sys.executable, "-m", "ninfer", "serve", *args, "--host", "127.0.0.1", "--port", str(self.port)]
        if api_key:
            cmd += ["--api-key", api_key]
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="ninfer-serve-", suffix=".log")[1])
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=cli_env(), cwd=REPO)

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_text()}")
            try:
                if httpx.get(self.base + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"server not ready after {timeout}s:\n{self.log_text()}")

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@contextlib.contextmanager
def serving(*args: str, wait: bool = True, **kw):
    """A Server for the block (a module fixture's `with serving(...) as s: yield s`): ready on entry unless
    wait=False, stopped on exit, and a stop that is not clean (exit code 0) fails."""
    s = Server(*args, **kw)
    try:
        if wait:
            s.wait_ready()
        yield s
    finally:
        assert s.stop() == 0, s.log_text()


def metric(text: str, name: str, default: float | None = None, **labels: str) -> float:
    """The value of one sample of a Prometheus text exposition (labels must match exactly);
    `default` when the sample is absent (a labelled counter that never moved), else KeyError."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        sample, _, label_text = head.partition("{")
        if sample != name:
            continue
        got = {}
        for part in label_text.rstrip("}").split(","):
            if "=" in part:
                k, _, v = part.partition("=")
                got[k] = v.strip('"')
        got.pop("model_name", None)
        if got == labels:
            return float(value)
    if default is not None:
        return default
    raise KeyError(f"no sample {name}{labels} in metrics")


# ---------------------------------------------------------------------------------------------
# A scripted artifact for the tool-call test
# ---------------------------------------------------------------------------------------------
TOOL_CALL_START, TOOL_CALL_END, IM_END = 248058, 248059, 248046
SCRIPT_TEXT = "<function=get_weather><parameter=city>Paris</parameter></function>"


def _distinct_tokenization(tokenizer, text: bytes, avoid: set[int]) -> list[int]:
    """A tokenization of `text` into vocabulary pieces with no id repeated (and none in `avoid`)."""
    pieces: dict[bytes, int] = {}
    for i in range(248044):
        pieces.setdefault(bytes(tokenizer.token_piece(i)), i)
    longest = max(map(len, pieces))

    def go(pos: int, used: set[int]) -> list[int] | None:
        if pos == len(text):
            return []
        for n in range(min(longest, len(text) - pos), 0, -1):
            t = pieces.get(text[pos:pos + n])
            if t is None or t in used:
                continue
            rest = go(pos + n, used | {t})
            if rest is not None:
                return [t] + rest
        return None

    out = go(0, set(avoid))
    if out is None:
        raise ValueError(f"no distinct tokenization of {text!r}")
    return out


def build_tool_script_artifact(path: Path, output_ids: list[int] | None = None) -> list[int]:
    """The demo weights, rewired so that after a chat prompt's last token ("\\n\\n" or "\\n") the
    model emits, with overwhelming probability at any temperature,
        <tool_call><function=get_weather><parameter=city>Paris</parameter></function></tool_call><|im_end|>
    (or `output_ids`, when given: any chain that repeats no token and holds neither 198 nor 271).
    Each chain token's embedding is a one-hot direction and the next token's lm_head row points
    along it: a bigram model, which works because the chain repeats no token. Every layer still
    runs (with its random weights, without the demo's context averaging, which would blend the
    prompt's one-hot tokens into the state) through the real Program. Stored bf16 (the scripted
    one-hot and 50.0 entries are exact in bf16; the CPU computes in fp32 all the same). Returns the
    scripted output ids.
    """
    from ninfer.artifact import write_artifact
    from ninfer.demo import DEMO_IDENTITY, demo_resources, demo_tensors
    from ninfer.targets.qwen3_6.frontend import Qwen36Frontend

    if output_ids is None:
        tok = Qwen36Frontend.builtin().tokenizer
        inner = _distinct_tokenization(tok, SCRIPT_TEXT.encode(), avoid={198, 271})
        output = [TOOL_CALL_START, *inner, TOOL_CALL_END, IM_END]
    else:
        output = list(output_ids)
        if len(set(output)) != len(output) or {198, 271} & set(output):
            raise ValueError("a scripted chain repeats no token and holds neither 198 nor 271")
    edges = [(271, output[0]), (198, output[0])] + list(zip(output[:-1], output[1:]))

    def tensors():
        for name, t in demo_tensors(context_mix=0.0):
            if name == "embed_tokens.weight":
                for k, (src, _) in enumerate(edges):
                    t[src] = 0.0
                    t[src, 1 + k] = 1.0
            elif name == "lm_head.weight":
                for k, (_, dst) in enumerate(edges):
                    t[dst] = 0.0
                for k, (_, dst) in enumerate(edges):
                    t[dst, 1 + k] = 50.0
            yield name, t

    assert len(edges) < 63
    write_artifact(path, DEMO_IDENTITY, tensors(), demo_resources(), dtype="bf16",
                   source={"kind": "test-tool-script"})
    return output


def ninfer(*args: str, input: str | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run the `ninfer` command line (`python -m ninfer ARGS`) from the repository root."""
    return subprocess.run([sys.executable, "-m", "ninfer", *args], input=input, capture_output=True, text=True,
                          env=cli_env(), cwd=REPO, timeout=timeout)


def ninfer_in_process(capsys, monkeypatch, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    """`ninfer ARGS` through the CLI's `main` in this process, with what a subprocess from `ninfer(...)`
    would see (the shared test cache dir, `input` on stdin, stdout/stderr captured): the same command
    code without a new interpreter's start (torch's import, the model load). Keep the entry point
    itself (`python -m ninfer`) covered by subprocess tests."""
    import io

    from ninfer.gateway.cli.main import main

    monkeypatch.setenv("NINFER_CACHE_DIR", str(shared_cache_dir()))
    monkeypatch.setattr(sys, "stdin", io.StringIO(input or ""))
    capsys.readouterr()
    code = main(list(args))
    cap = capsys.readouterr()
    return subprocess.CompletedProcess(["ninfer", *args], code, cap.out, cap.err)
