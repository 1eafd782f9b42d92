"""The bench/ tools that need CUDA, end to end on the GPU (their CPU runs: tests/integration/test_bench_scripts.py)."""
from __future__ import annotations

import pytest
import torch

from support.bench_scripts import json_line, load_bench_script as load

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_read_bw_cuda(capsys):
    rc = load("read_bw").main(["--mb", "50"])
    out = capsys.readouterr().out
    assert rc == 0, out
    [row] = json_line(out)["rows"]
    assert row["triton stream"] > 0 and row["F.linear M=1"] > 0 and row["gemv M=1"] > 0


def test_load_peak_cuda(capsys):
    rc = load("load_peak").main(["--identity", "qwen3_6-tiny-moe"])
    out = capsys.readouterr().out
    assert rc == 0, out
    [row] = json_line(out)["rows"]
    assert row["peak_reserved_gib"] >= row["allocated_gib"] > 0 and row["pool_sizing_sees_gib"] > 0
