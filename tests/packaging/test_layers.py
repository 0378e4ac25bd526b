"""The package's layers stay visible: the protocol model is pure, and the only import circle
is the one around the ``Table`` facade (its lazy imports of maintenance and scan)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def modules() -> dict[str, Path]:
    """Dotted name -> file, for txntable and txntable_spark (the spark/ directory)."""
    out: dict[str, Path] = {}
    for base, name in (("txntable", "txntable"), ("spark", "txntable_spark")):
        for path in (REPO / base).rglob("*.py"):
            parts = list(path.relative_to(REPO / base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([name, *parts])] = path
    return out


def runtime_imports(path: Path) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements at any level, except those under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imported_modules(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``module`` imports (a package's own submodules count)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in runtime_imports(path):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                head = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(head + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != module:
                out.add(target)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_protocol_model_imports_no_io_and_no_client() -> None:
    known = modules()
    allowed = {"txntable.errors", "txntable.structs"}
    for module, path in known.items():
        if not module.startswith("txntable.protocol"):
            continue
        outside = {
            m
            for m in imported_modules(module, path, known)
            if m not in allowed and not m.startswith("txntable.protocol")
        }
        assert not outside, f"{module} imports {sorted(outside)}"
        third_party = {
            (a.name if isinstance(node, ast.Import) else node.module or "").split(".")[0]
            for node in runtime_imports(path)
            for a in node.names
        }
        assert not third_party & {"boto3", "botocore", "fsspec", "pyspark", "threading"}, module


def test_only_the_table_facade_is_an_import_circle() -> None:
    known = modules()
    graph = {m: imported_modules(m, p, known) for m, p in known.items()}
    found = circles(graph)
    assert len(found) <= 1, found
    for component in found:
        assert "txntable.table" in component, component
