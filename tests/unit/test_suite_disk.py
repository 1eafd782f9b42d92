"""The suite's own disk use: a passing test's tmp_path and a passing run's base folder are removed, and the tiny
checkpoints (~140 MB each) are built once a run in one folder for every pytest-xdist worker."""
from __future__ import annotations

import os


def test_pytest_removes_what_passing_tests_leave(pytestconfig):
    assert pytestconfig.getini("tmp_path_retention_policy") == "failed"
    assert int(pytestconfig.getini("tmp_path_retention_count")) <= 1


def test_tiny_checkpoints_live_in_the_run_wide_shared_folder(tiny_checkpoint_dir, tmp_path_factory):
    path = tiny_checkpoint_dir("dense")
    base = tmp_path_factory.getbasetemp()
    run = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    assert path.parent == run / "shared"
    assert tiny_checkpoint_dir("dense") == path          # built once
