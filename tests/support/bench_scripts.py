"""Loading the repository's bench/ scripts in a test (bench/ is not a package: its tools run as files)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_bench_script(name: str):
    """bench/<name>.py as a module, so a test calls its `main(argv)` in this process."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def json_line(out: str, prefix: str = "JSON ") -> dict:
    """The one `JSON {...}` line a bench prints."""
    lines = [ln for ln in out.splitlines() if ln.startswith(prefix)]
    assert len(lines) == 1, out
    return json.loads(lines[0][len(prefix):])
