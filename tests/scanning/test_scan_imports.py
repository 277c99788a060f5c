"""The scan, report and run-folder modules import each other in one direction only.

analyze.py and report.py used to import each other; this checks every import statement (also the
ones inside functions, which still tie modules together; `if TYPE_CHECKING:` blocks excepted) of
quantscan.scanning.*, quantscan.report.*, runfolder and records, and fails on any cycle among them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import quantscan

SRC = Path(quantscan.__file__).resolve().parent
OWN = ("quantscan.scanning", "quantscan.report", "quantscan.runfolder", "quantscan.records")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _imports(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    own = {m: p for m, p in modules.items() if m.startswith(OWN)}
    return {m: {i for i in _imports(ast.parse(p.read_text())) if i in own and i != m} for m, p in own.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_scan_report_and_runfolder_have_no_import_cycle() -> None:
    graph = _graph()
    assert "quantscan.scanning.run" in graph and "quantscan.report.html" in graph
    assert _cycle(graph) == []


def test_package_init_is_not_counted_as_a_cycle_through_its_submodules() -> None:
    """`quantscan.scanning/__init__` re-exports run.py; no submodule may import the package back."""
    graph = _graph()
    importers = [m for m, deps in graph.items() if "quantscan.scanning" in deps and m != "quantscan.scanning"]
    assert importers == []


def test_runfolder_top_level_imports_the_standard_library_only() -> None:
    """The pure modules (the bisection state machine) use the atomic writers: no pandas for them."""
    tree = ast.parse((SRC / "runfolder.py").read_text())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            top.add(node.module.split(".")[0])
    assert not top & {"numpy", "pandas", "onnx", "onnxruntime", "matplotlib"}
