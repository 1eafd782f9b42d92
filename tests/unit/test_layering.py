"""The layer boundaries of architecture.md are import boundaries (conventions.md).

Scans every module's imports statically (ast), so a violation fails even if the import is lazy
(inside a function). Each rule names the folder it guards and the packages it may not reach.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "ninfer"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_nodes(path: Path, *, runtime_only: bool = False) -> list[tuple[str, tuple[str, ...]]]:
    """(module, names) of every import in the file, relative ones resolved; `runtime_only` leaves out
    the imports under `if TYPE_CHECKING:` (annotations only: they run no code at import)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skipped: set[int] = set()
    if runtime_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    out = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out.extend((a.name, ()) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                head = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(head + ([node.module] if node.module else []))
            out.append((base, tuple(a.name for a in node.names)))
    return out


def _imports(path: Path) -> set[str]:
    """Every module (or module.attribute) this file names in an import, at any depth."""
    out: set[str] = set()
    for base, names in _import_nodes(path):
        out.add(base)
        out.update(f"{base}.{n}" for n in names)
    return out


def _modules(sub: str = "") -> list[Path]:
    return sorted((ROOT / sub).rglob("*.py")) if (ROOT / sub).exists() else []


def _violations(sub: str, forbidden: tuple[str, ...], *, skip: tuple[str, ...] = ()) -> list[str]:
    bad = []
    for path in _modules(sub):
        if path.name in skip:
            continue
        for mod in _imports(path):
            if any(mod == f or mod.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT.parent)} imports {mod}")
    return sorted(bad)


ABOVE_OPS = ("ninfer.engine", "ninfer.gateway", "ninfer.program", "ninfer.targets", "ninfer.contract",
             "ninfer.artifact", "ninfer.convert", "ninfer.config", "ninfer.demo", "ninfer.bench")


def test_ops_import_nothing_above_them():
    assert _violations("ops", ABOVE_OPS) == []


def test_reference_ops_import_nothing_of_the_fast_ones():
    assert _violations("ops/reference", ("ninfer.ops.triton", "ninfer.ops.opset", "triton")) == []


def test_contracts_are_package_neutral():
    allowed = "ninfer.contract"
    bad = [f"{p.relative_to(ROOT.parent)} imports {m}" for p in _modules("contract") for m in _imports(p)
           if m.startswith("ninfer") and not (m == allowed or m.startswith(allowed + "."))]
    assert bad == []
    assert _violations("contract", ("torch",)) == []


def test_public_types_import_only_the_contracts_and_the_registry():
    bad = [m for m in _imports(ROOT / "config.py") if m.startswith("ninfer")
           and not m.startswith(("ninfer.contract", "ninfer.targets.registry"))]
    assert bad == []


def test_generic_program_machinery_knows_no_family_engine_or_gateway():
    forbidden = ("ninfer.engine", "ninfer.gateway", "ninfer.targets", "ninfer.config", "ninfer.demo",
                 "ninfer.contract.frontend")
    assert _violations("program", forbidden) == []


def test_family_program_never_imports_engine_or_frontend():
    forbidden = ("ninfer.engine", "ninfer.gateway", "ninfer.targets.qwen3_6.frontend", "ninfer.demo",
                 "ninfer.contract.frontend", "ninfer.config")
    assert _violations("targets/qwen3_6/program", forbidden) == []
    assert _violations("targets/qwen3_6/layers", forbidden) == []


def test_frontend_imports_nothing_from_engine_or_program():
    forbidden = ("ninfer.engine", "ninfer.targets.qwen3_6.program", "ninfer.targets.qwen3_6.layers",
                 "ninfer.program", "ninfer.contract.program", "ninfer.ops", "ninfer.gateway", "torch")
    assert _violations("targets/qwen3_6/frontend", forbidden) == []


def test_engine_core_is_package_neutral():
    """The worker, scheduler, resources and records reach a family only through `ninfer.contract`;
    the facade (`engine/facade.py`) is the composition root that picks the package and loads it."""
    forbidden = ("ninfer.gateway", "ninfer.targets", "ninfer.program", "ninfer.ops", "ninfer.artifact",
                 "ninfer.demo", "torch")
    assert _violations("engine", forbidden, skip=("facade.py",)) == []
    assert _violations("engine", ("ninfer.gateway", "ninfer.program", "ninfer.ops")) == []


def test_artifact_does_not_interpret_the_program():
    forbidden = ("ninfer.engine", "ninfer.gateway", "ninfer.ops", "ninfer.targets.qwen3_6.program",
                 "ninfer.targets.qwen3_6.layers", "ninfer.program")
    assert _violations("artifact", forbidden) == []


def test_gateways_reach_the_model_only_through_the_engine():
    forbidden = ("ninfer.engine.engine_core", "ninfer.engine.resource_manager", "ninfer.engine.scheduler",
                 "ninfer.targets.qwen3_6.program", "ninfer.targets.qwen3_6.layers", "ninfer.program",
                 "ninfer.ops", "ninfer.contract.program")
    assert _violations("gateway/http", forbidden) == []
    assert _violations("gateway/cli", forbidden) == []


def _graph() -> dict[str, set[str]]:
    """module -> the package modules it imports when it runs: `from pkg import sub` is an edge to the
    submodule, `from pkg import name` to the package."""
    paths = {_module_name(p): p for p in _modules()}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        edges: set[str] = set()
        for base, names in _import_nodes(path, runtime_only=True):
            subs = [f"{base}.{n}" for n in names if f"{base}.{n}" in paths]
            edges.update(subs)
            if len(subs) < len(names) or not names:
                edges.add(base)
        graph[name] = {m for m in edges if m in paths and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_package_has_no_import_cycle():
    assert _cycles(_graph()) == []


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set(), "c": {"b"}}, []),
])
def test_the_cycle_finder_finds_cycles(graph, expected):
    assert _cycles(graph) == expected


def test_scan_sees_the_package():
    # Guards the test itself: if the paths moved, the checks above would pass vacuously.
    for sub in ("ops/reference", "ops/triton", "contract", "program", "targets/qwen3_6/program",
                "targets/qwen3_6/frontend", "engine", "gateway/http", "gateway/cli", "artifact"):
        assert len(_modules(sub)) >= 2, sub
    assert "ninfer.contract.frontend" in _imports(ROOT / "engine" / "request_record.py")
    assert len(_graph()) >= 90
