"""The source's shape rules (conventions.md; issue 47): no module in ninfer/ over 600 lines, no class over 400,
and no comment that tells history ("session 3", "pass 7") instead of the code as it is."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "ninfer"
MAX_FILE_LINES = 600
MAX_CLASS_LINES = 400
HISTORY = re.compile(r"session [0-9]|pass [0-9]", re.IGNORECASE)


def _sources() -> list[Path]:
    return sorted(ROOT.rglob("*.py"))


def test_no_module_or_class_is_too_long():
    long_files, long_classes = [], []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        n = text.count("\n") + (not text.endswith("\n") and bool(text))
        if n > MAX_FILE_LINES:
            long_files.append(f"{path.relative_to(ROOT.parent)}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                long_classes.append(f"{path.relative_to(ROOT.parent)}: class {node.name}, "
                                    f"{node.end_lineno - node.lineno + 1} lines")
    assert not long_files, f"modules over {MAX_FILE_LINES} lines: {long_files}"
    assert not long_classes, f"classes over {MAX_CLASS_LINES} lines: {long_classes}"


def test_no_source_line_tells_history():
    hits = [f"{p.relative_to(ROOT.parent)}:{i}: {line.strip()}" for p in _sources()
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if HISTORY.search(line)]
    assert not hits, hits


def test_the_rules_see_the_package():
    assert len(_sources()) > 100 and (ROOT / "engine" / "facade.py") in _sources()
