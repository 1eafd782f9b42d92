"""What a new user meets before the model is loaded (issue 51: items 1, 6, 9).

1. The memory check: a model that does not fit refuses at once, in one line naming both figures and what to
   change (`ninfer serve`, `ninfer bench`, the Engine), with a fake small budget (NINFER_MEMORY_BUDGET);
   while the weights load, `/health` (503, status "loading") and the CLI show the progress.
6. What can be refused without the model is refused before it loads: an empty prompt, `--device cuda`
   without CUDA ("this PyTorch build has no CUDA"), --think without --chat, a --num-pages pool shorter
   than --max-model-len.
9. max_model_len defaults to the model's native length when the KV pool holds one sequence of it, else
   to the longest it holds; the figure and the reason are printed at start; an explicit value is kept.
"""
from __future__ import annotations

import functools
import io
import threading

import pytest

from ninfer.config import EngineConfig
from ninfer.engine import facade
from ninfer.engine.facade import Engine, InsufficientMemoryError, check_model
from ninfer.gateway.cli.main import main
from support.serve_util import ninfer_in_process

NATIVE = 262144


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("note:")]
    assert len(lines) == 1, err
    return lines[0]


def test_a_model_too_large_for_the_memory_is_refused_at_once(capsys, monkeypatch):
    monkeypatch.setenv("NINFER_MEMORY_BUDGET", "24G")
    # serve: before the server starts (it would otherwise load in the background, /health saying "loading")
    rc = main(["serve", "--load-format", "dummy", "--identity", "qwen3_6-27b", "--device", "cpu", "--port", "0"])
    line = _one_error_line(capsys.readouterr().err)
    assert rc == 2 and "not enough memory for qwen3_6-27b on cpu" in line
    assert "101.9 GiB in fp32" in line and "24.0 GiB (NINFER_MEMORY_BUDGET)" in line and "--dtype bf16" in line
    # the benchmarks' default identities (the real sizes) on the CPU
    rc = main(["bench", "decode", "--device", "cpu"])
    line = _one_error_line(capsys.readouterr().err)
    assert rc == 2 and "not enough memory for qwen3_6-27b" in line and "--identity qwen3_6-tiny-dense" in line
    # the Engine itself, before its worker starts
    with pytest.raises(InsufficientMemoryError, match=r"51\.0 GiB in bf16.*24\.0 GiB"):
        Engine.from_config(EngineConfig(load_format="dummy", identity="qwen3_6-27b", device="cpu", dtype="bf16"))


def test_max_model_len_is_native_when_the_pool_holds_it_else_the_longest_that_fits(tiny_artifact_path,
                                                                                    monkeypatch):
    path = tiny_artifact_path("dense")
    monkeypatch.setenv("NINFER_MEMORY_BUDGET", "16G")
    plan = check_model(path, EngineConfig(device="cpu"))
    assert plan.config.max_model_len == NATIVE and "the model's native length" in plan.note()
    assert plan.program_config.num_pages * 16 == 4 * NATIVE          # max_concurrency sequences of it
    # a budget whose KV share holds less than one native sequence: the longest that fits, said so
    monkeypatch.setenv("NINFER_MEMORY_BUDGET", "600M")
    plan = check_model(path, EngineConfig(device="cpu"))
    small = plan.config.max_model_len
    assert 16 <= small < NATIVE and small == plan.pool_tokens and small % 16 == 0
    assert f"max_model_len {small}: the longest sequence that fits in 600 MiB" in plan.note()
    assert "native length is 262144" in plan.note()
    # an explicit value is kept when it fits, and refused in one line when it does not
    assert check_model(path, EngineConfig(device="cpu", max_model_len=4096)).config.max_model_len == 4096
    with pytest.raises(InsufficientMemoryError, match=rf"lower --max-model-len \(at most {small} fits\)"):
        check_model(path, EngineConfig(device="cpu", max_model_len=NATIVE))
    with pytest.raises(ValueError, match="num_pages 8 .128 tokens of page_size 16. cannot hold one sequence of "
                                         "max_model_len 1024"):
        check_model(path, EngineConfig(device="cpu", num_pages=8, max_model_len=1024))
    assert check_model(path, EngineConfig(device="cpu", num_pages=8)).config.max_model_len == 128
    monkeypatch.setenv("NINFER_MEMORY_BUDGET", "100M")
    with pytest.raises(InsufficientMemoryError, match="before any KV cache, and there are 100 MiB"):
        check_model(path, EngineConfig(device="cpu"))


def test_loading_progress_on_health_and_the_cli_then_the_native_length(tiny_artifact_path, monkeypatch):
    """The load is held halfway through the weights: the Engine, `/health` and the CLI report how far it is."""
    from fastapi.testclient import TestClient

    import ninfer.targets.qwen3_6_tiny_dense as package
    from ninfer.engine.startup import progress_line
    from ninfer.gateway.cli.common import wait_ready_reporting
    from ninfer.gateway.http.app import create_app
    from ninfer.gateway.http.state import GatewayState

    monkeypatch.setenv("NINFER_MEMORY_BUDGET", "16G")
    halfway, release = threading.Event(), threading.Event()
    original = package.create_program

    def held(weights, config):
        for name in weights.tensor_names()[:20]:
            weights.tensor(name)
        halfway.set()
        release.wait(30)
        return original(weights, config)

    monkeypatch.setattr(package, "create_program", held)
    engine = Engine(tiny_artifact_path("dense"), EngineConfig(device="cpu"))
    try:
        assert halfway.wait(30)
        p = engine.progress()
        assert p["phase"] == "loading" and p["unit"] == "bytes" and 0 < p["done"] < p["total"]
        assert p["total"] == engine.start_plan.estimate.weights and 0 < p["fraction"] < 1
        state = GatewayState(model_name="m")
        state.attach(engine)
        with TestClient(create_app(state)) as c:
            r = c.get("/health")
        body = r.json()
        assert r.status_code == 503 and body["status"] == "loading" and body["reason"]
        assert body["progress"]["phase"] == "loading" and body["progress"]["done"] == p["done"]
        assert progress_line(body["progress"]).startswith("loading the weights: ")
        class Stderr(io.StringIO):                 # the load goes on once the CLI has shown its progress
            def write(self, text: str) -> int:
                n = super().write(text)
                release.set()
                return n

        out = Stderr()
        assert wait_ready_reporting(engine, out, after_s=0.0).ready
        assert "loading the weights: " in out.getvalue() and " MiB of " in out.getvalue()
        assert engine.progress() is None
        assert engine.max_model_len == NATIVE and engine.config.max_model_len == NATIVE
        assert engine.max_model_len_note.startswith(f"max_model_len {NATIVE}: the model's native length")
    finally:
        release.set()
        engine.close()


def test_the_warmup_counts_its_prompts():
    from ninfer.engine.startup import StartProgress, progress_line

    t = iter(range(100))
    p = StartProgress(1000, clock=lambda: float(next(t)))
    p.add(400)
    assert p.snapshot()["phase"] == "loading" and p.snapshot()["eta_s"] > 0
    p.add(600)
    assert p.snapshot()["phase"] == "initializing"
    p.warming(4)
    p.add(1)
    snap = p.snapshot()
    assert (snap["phase"], snap["done"], snap["total"], snap["unit"]) == ("warming_up", 1, 4, "prompts")
    assert progress_line(snap).startswith("warming up: 1 of 4 prompts (25%)")


def test_generate_refuses_what_it_can_before_loading(capsys, monkeypatch):
    import torch

    from ninfer.gateway.cli import cmd_generate

    def never(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(cmd_generate, "open_engine", never)
    monkeypatch.setattr(cmd_generate, "resolve_model", never)
    ninfer = functools.partial(ninfer_in_process, capsys, monkeypatch)
    r = ninfer("generate", "-p", "")
    assert r.returncode == 2 and "the prompt is empty" in _one_error_line(r.stderr)
    r = ninfer("generate", "-p", "-", input="")
    assert r.returncode == 2 and "the prompt is empty (stdin gave no text)" in _one_error_line(r.stderr)
    r = ninfer("generate", "-p", "Hi", "--think", "off")
    assert r.returncode == 2 and "--think needs --chat" in _one_error_line(r.stderr)
    # a CPU-only PyTorch build (this one, or made to look like one)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    r = ninfer("generate", "-p", "Hi", "--device", "cuda")
    line = _one_error_line(r.stderr)
    assert r.returncode == 2 and "--device cuda: this PyTorch build has no CUDA" in line and "--device cpu" in line
    assert "AssertionError" not in line and "loading the model failed" not in line
    with pytest.raises(facade.DeviceUnavailableError, match="this PyTorch build has no CUDA"):
        Engine.from_config(EngineConfig(load_format="dummy", identity="qwen3_6-tiny-dense", device="cuda"))


def test_generate_prints_the_max_model_len_and_why(tiny_artifact_path, capsys, monkeypatch):
    monkeypatch.setenv("NINFER_MEMORY_BUDGET", "16G")
    ninfer = functools.partial(ninfer_in_process, capsys, monkeypatch)
    path = str(tiny_artifact_path("dense"))
    r = ninfer("generate", path, "-p", "Hello", "--max-tokens", "1", "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert f"max_model_len {NATIVE}: the model's native length; the KV pool holds 4 sequences of it" in r.stderr


def test_the_program_lowers_an_automatic_max_model_len_to_the_pool_it_got():
    """On CUDA the Program sizes the pool again once the weights are loaded; with the automatic max_model_len it
    then lowers max_model_len to what the pool holds instead of refusing (ProgramConfig.fit_max_model_len)."""
    from ninfer.targets.qwen3_6.program import sizing
    from ninfer.targets.qwen3_6.program.config import ProgramConfig
    from ninfer.targets.registry import lookup

    d27 = lookup("qwen3_6-27b").dims
    base = dict(device="cpu", dtype="bf16", num_pages=4 * NATIVE // 16, num_slots=8, max_model_len=NATIVE,
                max_batch=4, max_steps=2, kv_memory_fraction=0.5)
    mem = lambda dev: (30 << 30, 80 << 30)         # noqa: E731
    with pytest.raises(ValueError, match=f"fewer than max_model_len {NATIVE}"):
        sizing.pool_pages(d27, ProgramConfig(**base), 8, mem_get_info=mem)
    fit = ProgramConfig(**base, fit_max_model_len=True)
    pages = sizing.pool_pages(d27, fit, 8, mem_get_info=mem)
    assert 0 < pages * 16 < NATIVE and sizing.fitted_max_model_len(fit, pages) == pages * 16
    assert sizing.fitted_max_model_len(ProgramConfig(**base), pages) == NATIVE
