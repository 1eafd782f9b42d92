"""Speculative decoding through the commands: the refusal of an artifact without MTP weights (a tiny
checkpoint converted without its mtp.* tensors), `generate --json` usage, and what `bench decode` and
`bench serve --in-process` report (K, L, the acceptance length, TPOT per token). The model behind the
generate and bench runs is a FakeProgram running speculative rounds with a scripted acceptance under
the real Qwen3.6 Frontend, so the figures checked are exact; the Program's own rounds are tested apart."""
from __future__ import annotations

import functools
import json
import shutil

import pytest

from ninfer.config import EngineConfig
from ninfer.gateway.cli.main import main
from support.fakes import FakeProgram
from support.scratch import scratch_dir
from support.serve_util import ninfer_in_process

SPEC = ("--speculative-method", "mtp", "--num-speculative-tokens")


@pytest.fixture(scope="module")
def artifact_without_mtp(tmp_path_factory):
    from ninfer.artifact import open_artifact
    from ninfer.convert import convert
    from ninfer.targets.qwen3_6.frontend.vocab import write_tokenizer_files
    from ninfer.testing.tiny_hf import write_tiny_checkpoint

    with scratch_dir(tmp_path_factory, "dense-no-mtp") as d:
        src = write_tiny_checkpoint(d / "hf", "dense", "text", mtp=False)
        write_tokenizer_files(src)
        path = convert(src, d / "tiny-dense-no-mtp.ninfer", dtype="bf16")
        shutil.rmtree(src)                      # only the artifact is used
        with open_artifact(path) as art:
            assert not art.has_group("mtp") and art.dims.mtp_num_hidden_layers >= 1
        yield path


def test_engine_refuses_an_artifact_without_mtp_weights_before_loading(artifact_without_mtp):
    from ninfer.engine.facade import Engine

    cfg = EngineConfig(device="cpu", speculative={"method": "mtp", "num_speculative_tokens": 2})
    with pytest.raises(ValueError) as e:
        Engine(artifact_without_mtp, cfg)
    assert "needs the checkpoint's MTP weights" in str(e.value) and "stores none" in str(e.value)
    assert str(artifact_without_mtp) in str(e.value)


@pytest.mark.parametrize("cmd", ["generate", "serve"])
def test_cli_refusal_is_one_line(artifact_without_mtp, cmd, capsys):
    extra = ("-p", "x") if cmd == "generate" else ("--port", "0")
    rc = main([cmd, str(artifact_without_mtp), *extra, *SPEC, "2"])
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc != 0 and "Traceback" not in err
    assert lines[-1].startswith(f"ninfer {cmd}: error: ") and "needs the checkpoint's MTP weights" in lines[-1]
    assert len([ln for ln in lines if "error" in ln]) == 1


# ---- a speculative fake behind the real Frontend ------------------------------------------------------
def _fake_engine(config: EngineConfig, accepted: int, trace=None, round_s: float = 0.0):
    """An Engine over FakeProgram(speculative=K) whose rounds accept `accepted` drafts each and take
    `round_s` seconds (so that requests submitted one after another decode together)."""
    import time

    from ninfer.engine.facade import Engine
    from ninfer.targets.qwen3_6.frontend import Qwen36Frontend

    k = config.speculative.num_speculative_tokens if config.speculative is not None else 0
    prog = FakeProgram(speculative=k, spec_accept=lambda sid, rnd: accepted, num_pages=4096, page_size=16,
                       max_model_len=config.max_model_len or 8192, vocab=5000)     # 0: auto (the CLI's default)
    if round_s:
        prog.on_call = lambda name: time.sleep(round_s) if name == "decode" else None
    eng = Engine.from_program(prog, Qwen36Frontend.builtin(), config, trace=trace)
    assert eng.wait_ready(10).ready
    return eng


def test_generate_json_usage_reports_rounds_and_acceptance_length(capsys, monkeypatch):
    import ninfer.gateway.cli.cmd_generate as cmd

    monkeypatch.setattr(cmd, "resolve_model", lambda model, quiet=False, config=None: (None, "fake", False))
    monkeypatch.setattr(cmd, "open_engine", lambda path, config: _fake_engine(config, accepted=1))
    ninfer = functools.partial(ninfer_in_process, capsys, monkeypatch)
    r = ninfer("generate", "-p", "Hello", "--max-tokens", "9", "--json", "--temperature", "0", *SPEC, "3")
    assert r.returncode == 0, r.stderr
    usage = json.loads(r.stdout)["usage"]
    # the prefill gives the first token, then rounds of 2 (one accepted draft + the target's token)
    assert usage["output_tokens"] == 9 and usage["num_spec_rounds"] == 4
    assert usage["num_spec_accepted_tokens"] == 4 and usage["mean_acceptance_length"] == 2.0
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("[usage]")][0]
    assert line.endswith("spec_rounds=4 mean_acceptance_length=2.00")


def test_generate_json_without_speculation_has_no_spec_fields(capsys, monkeypatch):
    import ninfer.gateway.cli.cmd_generate as cmd
    from ninfer.engine.facade import Engine
    from ninfer.targets.qwen3_6.frontend import Qwen36Frontend

    monkeypatch.setattr(cmd, "resolve_model", lambda model, quiet=False, config=None: (None, "fake", False))
    monkeypatch.setattr(cmd, "open_engine", lambda path, config: Engine.from_program(
        FakeProgram(num_pages=1024, page_size=16, max_model_len=config.max_model_len or 8192, vocab=5000),
        Qwen36Frontend.builtin(), config))
    r = ninfer_in_process(capsys, monkeypatch, "generate", "-p", "Hello", "--max-tokens", "4", "--json")
    assert r.returncode == 0, r.stderr
    assert not any(k.startswith(("num_spec", "mean_acc")) for k in json.loads(r.stdout)["usage"])


def _json_line(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if ln.startswith("JSON ")]
    assert len(lines) == 1, out
    return json.loads(lines[0][5:])


def test_bench_decode_reports_k_l_acceptance_and_tpot(capsys, monkeypatch):
    import ninfer.bench.decode as decode

    def start_engine(identity, device, clock, *, max_concurrency, max_model_len, speculative=None, **config):
        cfg = EngineConfig(max_concurrency=max_concurrency, max_model_len=max_model_len, speculative=speculative)
        accepted = speculative.force_accept_len - 1 if speculative is not None else 0
        return _fake_engine(cfg, accepted, trace=clock, round_s=0.005), 0.0

    monkeypatch.setattr(decode, "start_engine", start_engine)
    rc = main(["bench", "decode", "--identity", "qwen3_6-tiny-dense", "--device", "cpu", "--ctx", "16",
               "--batches", "1", "2", "--reps", "2", "--no-hf-baseline", *SPEC, "3", "--force-accept-len", "2", "4",
               "--with-plain"])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = _json_line(out)
    assert not data["errors"]
    assert (data["speculative_method"], data["num_speculative_tokens"], data["force_accept_lens"],
            data["with_plain"]) == ("mtp", 3, [2, 4], True)
    rows = [r for r in data["results"] if r["kind"] == "decode"]
    assert [(r["force_accept_len"], r["batch"]) for r in rows] == [(0, 1), (0, 2), (2, 1), (2, 2), (4, 1), (4, 2)]
    for r in rows:
        assert r["rounds"] == 2
        if r["force_accept_len"] == 0:               # plain decoding, in the same run
            assert r["num_speculative_tokens"] == 0 and r["mean_acceptance_length"] is None
            assert r["tpot_ms"] == r["step_ms"]
        else:
            assert r["num_speculative_tokens"] == 3
            L = r["force_accept_len"]
            assert r["mean_acceptance_length"] == L and r["tpot_ms"] == pytest.approx(r["step_ms"] / L)
    assert "accept_len" in out and "acceptance length 2.00" in out and "acceptance length 4.00" in out


def test_bench_serve_in_process_reports_the_acceptance_length(capsys, monkeypatch):
    import ninfer.bench.serve as serve
    from ninfer.bench.common import measure_ceilings
    from ninfer.engine.facade import Engine

    # NOTE: the ceilings in this process, not a spawned one (~1.5 s of interpreter and torch start):
    #       the engine here is a fake; test_bench_cli.py's in-process run covers measure_ceilings_apart
    monkeypatch.setattr(serve, "measure_ceilings_apart", measure_ceilings)
    monkeypatch.setattr(Engine, "from_config", classmethod(
        lambda cls, config, trace=None: _fake_engine(config, config.speculative.force_accept_len - 1)))
    # NOTE: one forced length here; several run one Engine each, as in bench decode
    rc = main(["bench", "serve", "--in-process", "--identity", "qwen3_6-tiny-dense", "--device", "cpu",
               "--concurrency", "1", "2", "--prompt-len", "16", "--output-len", "9", "--requests-per-client", "1",
               "--step-timeout", "60", "--startup-timeout", "60", *SPEC, "2", "--force-accept-len", "3"])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = _json_line(out)
    assert not data["errors"] and data["max_model_len"] == 16 + 9 + 16 + 2
    rows = [r for r in data["results"] if r["kind"] == "serve"]
    assert [r["concurrency"] for r in rows] == [1, 2]
    for r in rows:
        assert r["all_outputs_full"] and r["num_speculative_tokens"] == 2 and r["force_accept_len"] == 3
        assert r["mean_acceptance_length"] == 3.0
    assert "accept_len" in out
