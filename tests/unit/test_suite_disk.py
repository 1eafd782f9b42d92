"""The suite's own disk use (under 1 GB at its peak): a passing test's tmp_path and a passing run's base folder
are removed; the tiny checkpoints (~65 MB each: BF16 like the official checkpoints, most of it the 248k-row
embedding and LM head) and the tiny artifacts (bf16 by default, ~75 MB each) are built once a run in one folder
for every pytest-xdist worker, the tokenizer files hard-linked into each checkpoint rather than copied."""
from __future__ import annotations

import os

import torch
from safetensors import safe_open


def test_pytest_removes_what_passing_tests_leave(pytestconfig):
    assert pytestconfig.getini("tmp_path_retention_policy") == "failed"
    assert int(pytestconfig.getini("tmp_path_retention_count")) <= 1


def test_tiny_checkpoints_live_in_the_run_wide_shared_folder(tiny_checkpoint_dir, tmp_path_factory):
    path = tiny_checkpoint_dir("dense")
    base = tmp_path_factory.getbasetemp()
    run = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    assert path.parent == run / "shared"
    assert tiny_checkpoint_dir("dense") == path          # built once
    assert tiny_checkpoint_dir("dense", "vl") == path    # the dense "official" layout writes the same tensors


def test_tiny_checkpoints_and_artifacts_are_bf16_and_small(tiny_checkpoint_dir, tiny_artifact_path):
    from ninfer.artifact import open_artifact

    path = tiny_checkpoint_dir("dense", "text")
    weights = path / "model.safetensors"
    with safe_open(str(weights), "pt") as f:
        dtypes = {name: f.get_slice(name).get_dtype() for name in f.keys()}
    assert dtypes["model.embed_tokens.weight"] == dtypes["lm_head.weight"] == "BF16"
    assert {d for n, d in dtypes.items() if not n.endswith(("linear_attn.A_log", "linear_attn.norm.weight"))} == {"BF16"}
    assert weights.stat().st_size < 70 << 20
    assert (path / "tokenizer.json").stat().st_nlink > 1                 # hard-linked, one copy a run
    with open_artifact(tiny_artifact_path("dense")) as art:
        assert art.tensor("embed_tokens.weight").dtype == torch.bfloat16
    assert tiny_artifact_path("dense").stat().st_size < 80 << 20


def test_temporary_files_go_under_the_runs_folder(tmp_path_factory):
    """tempfile here and TMPDIR for subprocesses point into the run's base folder (removed after a passing
    run); the test cache stays outside it, reused by the next run."""
    import tempfile
    from pathlib import Path

    from support.serve_util import shared_cache_dir

    base = tmp_path_factory.getbasetemp()
    run = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    assert Path(tempfile.gettempdir()).is_relative_to(run) and os.environ["TMPDIR"] == tempfile.gettempdir()
    assert not shared_cache_dir().is_relative_to(run)
