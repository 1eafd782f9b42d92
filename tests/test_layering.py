"""The layer boundaries of architecture.md are import boundaries (conventions.md).

Scans every module's imports statically (ast), so a violation fails even if the import is lazy.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "ninfer"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def _modules(sub: str) -> list[Path]:
    return sorted((ROOT / sub).rglob("*.py")) if (ROOT / sub).exists() else []


def _violations(sub: str, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for path in _modules(sub):
        for mod in _imports(path):
            if any(mod == f or mod.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT.parent)} imports {mod}")
    return bad


def test_ops_import_nothing_above_them():
    assert _violations("ops", ("ninfer.runtime", "ninfer.targets", "ninfer.engine", "ninfer.serve",
                               "ninfer.cli", "ninfer.artifact", "ninfer.convert", "ninfer.product")) == []


def test_program_never_imports_engine_or_frontend():
    forbidden = ("ninfer.runtime.engine", "ninfer.engine", "ninfer.serve", "ninfer.cli",
                 "ninfer.targets.qwen3_6.frontend", "ninfer.product")
    assert _violations("targets/qwen3_6/runtime", forbidden) == []
    assert _violations("core", forbidden) == []


def test_frontend_imports_nothing_from_engine_or_program():
    forbidden = ("ninfer.runtime", "ninfer.engine", "ninfer.targets.qwen3_6.runtime", "ninfer.core",
                 "ninfer.ops", "ninfer.serve", "ninfer.cli", "torch")
    assert _violations("targets/qwen3_6/frontend", forbidden) == []


def test_engine_never_imports_gateways_or_program_internals():
    forbidden = ("ninfer.serve", "ninfer.cli", "ninfer.targets.qwen3_6.runtime", "ninfer.core",
                 "ninfer.ops", "torch")
    assert _violations("runtime/engine", forbidden) == []


def test_artifact_does_not_interpret_targets_runtime():
    forbidden = ("ninfer.runtime", "ninfer.engine", "ninfer.serve", "ninfer.cli", "ninfer.ops",
                 "ninfer.targets.qwen3_6.runtime")
    assert _violations("artifact", forbidden) == []


def test_gateways_reach_the_model_only_through_the_engine():
    forbidden = ("ninfer.runtime.engine", "ninfer.targets.qwen3_6.runtime", "ninfer.core", "ninfer.ops")
    assert _violations("serve", forbidden) == []
    assert _violations("cli", forbidden) == []


def test_scan_sees_the_package():
    # Guards the test itself: if the paths moved, the checks above would pass vacuously.
    assert len(_modules("")) >= 10
    assert _imports(ROOT / "types.py")
