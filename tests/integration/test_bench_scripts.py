"""The maintained profiling tools of bench/ run end to end: each on the CPU with a tiny identity and tiny
sizes where it can (the wiring: it completes and prints its JSON line; no timing is asserted), the ones
that need CUDA are in tests/gpu/test_bench_scripts_gpu.py. The tuning scripts (bench/gemv.py, bench/moe_decode.py) are
tested beside the ops they tune."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support.bench_scripts import BENCH, json_line, load_bench_script as load

def test_profile_step_decode_and_prefill_cpu(capsys):
    rc = load("profile_step").main(["--device", "cpu", "--decode", "qwen3_6-tiny-dense", "--batches", "1",
                                    "--ctx", "8", "--rounds", "1", "--top", "3", "--prefill", "qwen3_6-tiny-moe:16"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = json_line(out)["rows"]
    assert [(r["kind"], r.get("batch")) for r in rows] == [("decode", 1), ("prefill", None)]
    assert all(r["kernels"] > 0 and r["busy_ms"] > 0 and len(r["top"]) == 3 for r in rows)
    assert "per step:" in out


def test_load_peak_cpu(capsys):
    rc = load("load_peak").main(["--identity", "qwen3_6-tiny-dense", "qwen3_6-tiny-moe", "--device", "cpu"])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = json_line(out)["rows"]
    assert [r["identity"] for r in rows] == ["qwen3_6-tiny-dense", "qwen3_6-tiny-moe"]
    # NOTE: the tiny identities keep the real 248,320-row vocabulary: embed + lm_head alone are > 60 MB in fp32.
    assert all(r["view_gib"] * 2 ** 30 > 60e6 for r in rows)


def test_score_memory_cpu(capsys):
    rc = load("score_memory").main(["--tokens", "100", "--window", "64"])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads(out.strip().splitlines()[-1])
    assert data["bench"] == "score_memory" and data["window"] == 64
    [run] = data["runs"]
    assert run["tokens"] == 100 and 0 < run["scored_tokens"] < 100 and run["peak_rss_mib"] >= run["rss_before_mib"]


def test_convert_memory_tiny(tmp_path):
    # NOTE: a subprocess, as the tool converts in a child process whose peak RSS it reads.
    r = subprocess.run([sys.executable, str(BENCH / "convert_memory.py"), "--tiny", "--dir", str(tmp_path / "w")],
                       capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "PYTHONPATH": str(BENCH.parent)})
    assert r.returncode == 0, r.stderr[-2000:]
    row = json.loads(r.stdout.strip().splitlines()[-1])
    assert row["bench"] == "convert_memory" and row["artifact_bytes"] > 0 and row["peak_rss_bytes"] > 0
    assert not (tmp_path / "w").exists()           # the work folder is removed without --keep


def test_prefix_cache_cpu(capsys, tiny_artifact_path):
    rc = load("prefix_cache").main([str(tiny_artifact_path("dense")), "--device", "cpu", "--sessions", "2",
                                    "--turns", "2", "--max-tokens", "2", "--max-model-len", "1024"])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json_line(out)
    assert data["identical"] is True and data["on_reused_tokens"] > 0 == data["off_reused_tokens"]


@pytest.mark.parametrize("script", ["fetch_device_wheels.sh", "_device_env.sh"])
def test_shell_tools_parse(script):
    r = subprocess.run(["bash", "-n", str(BENCH / script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
