"""bench/program_step.py (the Program-level step timer) on the CPU with the tiny identities: the wiring
(each subcommand completes, prints its table and one JSON line, writes --out); no timing is asserted."""
from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str], tmp_path: Path) -> tuple[str, dict]:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "program_step.py"), *argv, "--device", "cpu",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("JSON ")]
    assert len(lines) == 1, proc.stdout
    return proc.stdout, json.loads(lines[0][5:])


def test_program_step_decode_cpu(tmp_path):
    out, data = _run(["decode", "--identity", "qwen3_6-tiny-dense", "--lengths", "16", "--batch", "1", "2",
                      "--reps", "1", "--max-model-len", "200"], tmp_path)
    assert data["bench"] == "program_step_decode" and not data["errors"] and not data["partial"]
    assert data["max_model_len"] == 200 and "max_model_len 200" in out
    rows = {(r["kind"], r.get("batch")): r for r in data["results"]}
    assert set(rows) == {("prefill", None), ("decode", 1), ("decode", 2)}
    assert all(r["step_ms"] > 0 and r["floor_ms"] > 0 and r["ops"] == "reference" and r["graphs"] is False
               for k, r in rows.items() if k[0] == "decode")
    assert rows[("prefill", None)]["median_ms"] > 0
    for key in ("commit", "torch", "machine"):
        assert key in data["env"]
    assert "step_ms" in out and json.loads((tmp_path / "program_step_decode.json").read_text())["partial"] is False


def test_program_step_prefill_cpu(tmp_path):
    # a 16-token stage: the 16-token prompt is one whole stage, the 40-token one three
    chunk = "16"
    out, data = _run(["prefill", "--identity", "qwen3_6-tiny-dense", "--lengths", "16", "40", "--reps", "2",
                      "--chunk", chunk], tmp_path)
    assert data["bench"] == "program_step_prefill" and not data["errors"]
    assert [r["prompt"] for r in data["results"]] == [16, 40]
    for r in data["results"]:
        assert r["ttft_ms"] > 0 and r["floor_ms"] > 0 and r["reps"] == 2
        assert r["chunk"] == min(int(chunk), r["prompt"])
    assert "ttft_ms" in out and "prefill_tok/s" in out


def test_program_step_rejects_an_unknown_identity(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["program_step.py", "decode", "--identity", "nope", "--device", "cpu"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_path(str(ROOT / "bench" / "program_step.py"), run_name="__main__")
    assert exc.value.code not in (0, None) and "unknown model identity 'nope'" in capsys.readouterr().err
