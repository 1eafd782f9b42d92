"""`ninfer bench decode|prefill|serve` on the CPU with the tiny identities and tiny sizes: the wiring
(each completes, prints its table and one JSON line, writes --out); no timing is asserted."""
from __future__ import annotations

import json

import pytest

from ninfer.gateway.cli.main import main


def _json_line(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if ln.startswith("JSON ")]
    assert len(lines) == 1, out
    return json.loads(lines[0][5:])


def test_bench_decode_cpu(capsys, tmp_path):
    rc = main(["bench", "decode", "--identity", "qwen3_6-tiny-dense", "--device", "cpu", "--ctx", "16",
               "--batches", "1", "2", "--reps", "1", "--no-ref", "--hf-baseline", "--hf-batches", "1",
               "--max-model-len", "200", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = _json_line(out)
    assert data["bench"] == "decode" and not data["errors"] and not data["partial"]
    assert data["max_model_len"] == 200 and "max_model_len 200" in out
    kinds = [(r["kind"], r.get("batch")) for r in data["results"]]
    assert ("decode", 1) in kinds and ("decode", 2) in kinds and ("hf_decode", 1) in kinds and ("prefill", None) in kinds
    assert all(r["floor_ms"] > 0 for r in data["results"] if r["kind"] != "prefill")
    for key in ("commit", "torch", "triton", "machine"):
        assert key in data["env"]
    assert "floor_ms" in out and json.loads((tmp_path / "decode.json").read_text())["partial"] is False
    assert data["path"] == "engine"
    assert all(r["ops"] == "engine" and r["rounds"] == 1 and r["tpot_ms"] == r["step_ms"]
               for r in data["results"] if r["kind"] == "decode")


def test_round_intervals_count_only_consecutive_full_decode_units():
    """A round is timed between the commits of two decode units that both held all B rows."""
    from ninfer.bench.engine_clock import Unit, round_intervals

    units = [Unit("prefill", 1, 0.0), Unit("decode", 1, 1.0), Unit("prefill", 1, 2.0), Unit("decode", 2, 3.0),
             Unit("decode", 2, 3.5), Unit("control", 1, 4.0), Unit("decode", 2, 5.0), Unit("decode", 2, 5.25),
             Unit("decode", 2, None), Unit("decode", 1, 7.0)]
    assert round_intervals(units, 2) == [0.5, 0.25]
    assert round_intervals(units, 1) == []


def test_bench_prefill_cpu(capsys):
    rc = main(["bench", "prefill", "--identity", "qwen3_6-tiny-moe", "--device", "cpu", "--lengths", "16", "40",
               "--reps", "2", "--chunk", "16"])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = _json_line(out)
    assert data["hf_baseline"] is False               # off by default on the CPU
    assert [r["prompt"] for r in data["results"]] == [16, 40]
    assert all(r["ttft_ms"] > 0 and r["floor_ms"] > 0 and r["chunk"] == 16 and r["impl"] == "ninfer"
               for r in data["results"])
    assert "floor_ms" in out and "prefill_tok/s" in out
    assert data["path"] == "engine"


@pytest.mark.parametrize("identity", ["qwen3_6-tiny-dense"])   # the MoE model: test_bench_prefill_cpu
def test_bench_prefill_with_the_transformers_baseline_cpu(capsys, identity):
    rc = main(["bench", "prefill", "--identity", identity, "--device", "cpu", "--lengths", "16", "40",
               "--reps", "2", "--hf-baseline"])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = _json_line(out)
    assert not data["errors"] and data["hf_baseline"] is True
    rows = {(r["kind"], r["prompt"]): r for r in data["results"]}
    assert set(rows) == {("prefill", 16), ("prefill", 40), ("hf_prefill", 16), ("hf_prefill", 40)}
    for L in (16, 40):
        hf = rows[("hf_prefill", L)]
        assert hf["impl"].startswith("transformers ") and hf["chunk"] == L and hf["reps"] == 2
        assert hf["ttft_ms"] > 0 and hf["floor_ms"] == rows[("prefill", L)]["floor_ms"]
    assert "transformers_ttft_ms" in out and "speedup" in out


def test_bench_serve_cpu(capsys, tmp_path):
    """Both clients (raw HTTP and the openai SDK) against one server: each level once per client."""
    rc = main(["bench", "serve", "--identity", "qwen3_6-tiny-dense", "--device", "cpu", "--concurrency", "1", "2",
               "--prompt-len", "16", "--output-len", "5", "--requests-per-client", "1", "--step-timeout", "60",
               "--startup-timeout", "60", "--out", str(tmp_path), "--client", "http", "openai"])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = _json_line(out)
    assert not data["errors"] and data["path"] == "http+openai-sdk"
    startup = [r for r in data["results"] if r["kind"] == "startup"]
    assert len(startup) == 1 and startup[0]["models_synthetic"] is True
    rows = [r for r in data["results"] if r["kind"] == "serve"]
    assert [(r["concurrency"], r["path"]) for r in rows] == [(1, "http"), (1, "openai-sdk"), (2, "http"),
                                                             (2, "openai-sdk")]
    for r in rows:
        assert r["all_outputs_full"] and r["synthetic_fingerprint"]
        assert r["output_tokens"] == 5 * r["concurrency"]
        assert r["ttft_mean_ms"] > 0 and r["tpot_mean_ms"] > 0 and r["output_tokens_per_s"] > 0
    assert (tmp_path / "serve.json").exists() and (tmp_path / "serve-qwen3_6-tiny-dense.log").exists()


def test_bench_serve_in_process_cpu(capsys):
    """The same levels through the public Engine in this process: every output full, queueing
    (admit) recorded, and the Engine closed afterwards (no worker thread left)."""
    import threading

    before = {t.ident for t in threading.enumerate()}
    rc = main(["bench", "serve", "--in-process", "--identity", "qwen3_6-tiny-dense", "--device", "cpu",
               "--concurrency", "1", "3", "--prompt-len", "16", "--output-len", "5", "--requests-per-client", "2",
               "--step-timeout", "60", "--startup-timeout", "60", "--max-model-len", "300"])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = _json_line(out)
    assert not data["errors"] and data["path"] == "engine" and data["max_model_len"] == 300
    rows = [r for r in data["results"] if r["kind"] == "serve"]
    assert [r["concurrency"] for r in rows] == [1, 3]
    for r in rows:
        assert r["path"] == "engine" and r["all_outputs_full"] and r["synthetic_fingerprint"]
        assert r["output_tokens"] == 5 * 2 * r["concurrency"]
        assert 0 <= r["admit_mean_ms"] <= r["ttft_mean_ms"] and r["tpot_mean_ms"] > 0
    assert {t.ident for t in threading.enumerate() if t.is_alive()} <= before


def test_bench_unknown_identity(capsys):
    assert main(["bench", "decode", "--identity", "nope"]) == 2
    assert "unknown model identity 'nope'" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["prefill", "--lengths", "1024", "0"], "argument --lengths: must be an integer >= 1, got 0"),
    (["prefill", "--chunk", "70000"], "argument --chunk: must be an integer in 0..65536, got 70000"),
    (["prefill", "--reps", "0"], "argument --reps: must be an integer >= 1, got 0"),
    (["decode", "--batches", "1", "9"], "argument --batches: must be an integer in 1..8, got 9"),
    (["decode", "--ctx", "-5"], "argument --ctx: must be an integer >= 1, got -5"),
    (["decode", "--ctx", "1k"], "argument --ctx: must be an integer >= 1, got '1k'"),
    (["decode", "--step-timeout", "-1"], "argument --step-timeout: must be a number >= 0, got -1"),
    (["serve", "--concurrency", "0"], "argument --concurrency: must be an integer in 1..8, got 0"),
    (["serve", "--prompt-len", "0"], "argument --prompt-len: must be an integer >= 1, got 0"),
    (["serve", "--top-p", "0"], "argument --top-p: must be a number > 0 and <= 1, got 0"),
    (["serve", "--top-p", "1.5"], "argument --top-p: must be a number > 0 and <= 1, got 1.5"),
    (["serve", "--temperature", "nan"], "argument --temperature: must be a number >= 0, got nan"),
    (["serve", "--startup-timeout", "0"], "argument --startup-timeout: must be a number > 0, got 0"),
    (["serve", "--client", "http", "openai", "http"], "argument --client: http given more than once"),
])
def test_bench_rejects_bad_numbers_before_running(capsys, argv, message):
    """A bad number is a usage error naming the flag (exit 2, one line), before any model is built."""
    with pytest.raises(SystemExit) as e:
        main(["bench", *argv, "--identity", "qwen3_6-tiny-dense", "--device", "cpu"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("error:") == 1


def test_env_record_commit_names_the_tree(monkeypatch):
    import subprocess

    from ninfer.bench.common import env_record
    monkeypatch.setenv("NINFER_COMMIT", "1234abc")
    assert env_record()["commit"] == "1234abc"          # set: it wins over a (possibly stale) .git
    monkeypatch.delenv("NINFER_COMMIT")
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except OSError:
        head = "unknown"
    assert env_record()["commit"].removesuffix("+dirty") == head      # unset: the checkout's HEAD
