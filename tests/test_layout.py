"""The house rules, checked on the source: no import cycles, one onnxruntime user, one CLI, one spelling.

These are what keep the layout from growing sideways again (issue "One house"): a module-level
import cycle makes the import order matter, onnxruntime outside `runner.py` spreads session
knowledge, and printing or exiting outside `cli/` makes the API unusable from a notebook.
The import graph is read with `ast` (module-level imports only, `if TYPE_CHECKING:` blocks
skipped); the lazy-import promise is checked by importing in a child interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "quantscan"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute module an ImportFrom names (relative imports resolved against `module`)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports executed when the module is imported: module body, try/if bodies, not functions."""
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            yield stmt
        elif isinstance(stmt, ast.If):
            if not _is_type_checking(stmt.test):
                stack.extend(stmt.body)
            stack.extend(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            stack.extend(stmt.body + stmt.orelse + stmt.finalbody)
            for handler in stmt.handlers:
                stack.extend(handler.body)


def _all_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def _targets(module: str, node: ast.Import | ast.ImportFrom, is_package: bool, known: set[str]) -> set[str]:
    """Project modules an import statement loads (a `from pkg import sub` counts `pkg.sub` too)."""
    if isinstance(node, ast.Import):
        names = {a.name for a in node.names}
    else:
        base = _resolve(module, node, is_package)
        names = {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {n for n in names if n in known}


def _import_graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _top_level_imports(tree):
            edges |= _targets(name, node, is_package, known)
        edges.discard(name)
        graph[name] = edges
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle in the graph (as a path that returns to its start), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycles_in_the_package() -> None:
    cycle = _find_cycle(_import_graph())
    assert cycle is None, "module-level import cycle: " + " -> ".join(cycle or [])


def _runtime_import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports, function-level imports included (`_runtime_imports`)."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        edges: set[str] = set()
        for node in _runtime_imports(tree):
            edges |= _targets(name, node, path.name == "__init__.py", known)
        edges.discard(name)
        graph[name] = edges
    return graph


def test_no_module_cycle_counting_imports_inside_functions() -> None:
    """An import inside a function hides a cycle from the module-level check but not from the reader:
    two modules that import each other, even lazily, are one (issue 41 closed fix_dim/freeze_input,
    rknn hybrid/run and the dump readers). A lazy import for speed stays fine where it forms no cycle."""
    cycle = _find_cycle(_runtime_import_graph())
    assert cycle is None, "module cycle through an import inside a function: " + " -> ".join(cycle or [])


def test_the_runtime_graph_sees_imports_inside_functions() -> None:
    """The check above is not vacuous: the CLI imports the commands' modules inside its functions."""
    graph = _runtime_import_graph()
    lazy = {m for m in graph if m.startswith("quantscan.cli")}
    assert any(graph[m] - _import_graph()[m] for m in lazy)


def _importers_of(top: str) -> set[str]:
    found = set()
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _all_imports(tree):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(m == top or m.startswith(top + ".") for m in mods if not getattr(node, "level", 0)):
                found.add(name)
    return found


def test_onnxruntime_is_imported_only_by_the_runner() -> None:
    assert _importers_of("onnxruntime") == {"quantscan.runner"}


def _in_cli(module: str) -> bool:
    """The command line: `quantscan.cli` and, once it is a package, its modules (one per command)."""
    return module == "quantscan.cli" or module.startswith("quantscan.cli.")


def test_argparse_only_in_the_cli() -> None:
    assert {m for m in _importers_of("argparse") if not _in_cli(m)} == set()


def _calls(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                yield func.id
            elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                yield f"{func.value.id}.{func.attr}"


def test_print_and_exit_only_in_the_cli() -> None:
    offenders = []
    for name, path in _modules().items():
        if _in_cli(name) or name == "quantscan.__main__":
            continue
        calls = set(_calls(ast.parse(path.read_text(encoding="utf-8"))))
        bad = calls & {"print", "exit", "quit", "sys.exit", "os._exit"}
        if bad:
            offenders.append(f"{name}: {sorted(bad)}")
    assert not offenders, offenders


HEAVY = ("onnxruntime", "pandas")


@pytest.mark.parametrize("argv", [["--help"], ["profiles"]])
def test_help_and_profiles_do_not_load_onnxruntime_or_pandas(argv: list[str]) -> None:
    code = (
        "import contextlib, io, sys\n"
        "from quantscan.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        f"        main({argv!r})\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"`quantscan {' '.join(argv)}` loaded: {done.stdout.strip()}"


# --- the measurement core (issue "One measurement core") -------------------------------------------------


def _runtime_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import that can run: module level and inside functions, `if TYPE_CHECKING:` blocks skipped."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _package_of(module: str) -> str:
    """`quantscan.scanning.gain` -> `quantscan.scanning`; a top-level module is its own unit."""
    return ".".join(module.split(".")[:2])


def _package_graph() -> dict[str, dict[str, set[str]]]:
    """unit -> {imported unit: the modules importing it}, over every runtime import (function-level too).

    The root facade (`quantscan/__init__`) is left out: it names the API lazily, by string, so importing
    it loads nothing, and every submodule's import loads it anyway."""
    modules = _modules()
    known = set(modules)
    graph: dict[str, dict[str, set[str]]] = {}
    for name, path in modules.items():
        if name == "quantscan":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in _runtime_imports(tree):
            for target in _targets(name, node, path.name == "__init__.py", known) - {"quantscan"}:
                if _package_of(target) != _package_of(name):
                    graph.setdefault(_package_of(name), {}).setdefault(_package_of(target), set()).add(name)
    return graph


def test_no_package_cycle_counting_function_level_imports() -> None:
    """A function-level import is still a dependency: two packages that import each other, even lazily,
    are one knot (the gain module and scanning/impact were one)."""
    graph = _package_graph()
    cycle = _find_cycle({unit: set(targets) for unit, targets in graph.items()})
    assert cycle is None, "package cycle: " + " -> ".join(
        f"{a} ({', '.join(sorted(graph[a][b]))})" for a, b in zip(cycle or [], (cycle or [])[1:], strict=False))


def test_the_package_graph_sees_function_level_imports() -> None:
    """The check above is not vacuous: bisect's driver imports scanning inside functions as well."""
    graph = _package_graph()
    assert "quantscan.scanning" in graph["quantscan.bisect"]
    assert "quantscan.report" in graph["quantscan.api"]


def test_analysis_never_imports_report_or_cli() -> None:
    graph = _package_graph()
    offenders = {
        f"{unit} -> {target}: {sorted(graph[unit][target])}"
        for unit in ("quantscan.scanning", "quantscan.graph", "quantscan.bisect")
        for target in ("quantscan.report", "quantscan.cli")
        if target in graph.get(unit, {})
    }
    assert not offenders, offenders


HOMONYMS = {
    "kernel": ("quantscan.compat",),  # a Conv's kernel size among a chip profile's parameters
    "rank": ("quantscan.compat",),  # a tensor's rank among a chip profile's parameters
    # the model's input contract in run.json and extract.json, the vendor job's inputs
    "inputs": ("quantscan.records", "quantscan.runfolder", "quantscan.report.html", "quantscan.toolchains",
               "quantscan.extract", "quantscan.cut", "quantscan.repro", "quantscan.shrink",
               "quantscan.prefixes"),  # prefixes.json: the model's input names
    "output": ("quantscan.taskmetrics.spec",),  # the `output=NAME` key of a --task spec
}
"""Column names that also name a different field elsewhere: those modules may spell the other field."""


def _string_literals(tree: ast.Module) -> Iterator[str]:
    """String constants that are values (docstrings and f-string pieces are text, not names)."""
    text_ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            text_ids.add(id(node.value))
        elif isinstance(node, ast.JoinedStr):
            text_ids.update(id(v) for v in node.values)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in text_ids:
            yield node.value


def test_each_layers_column_is_spelled_in_one_module() -> None:
    from quantscan.columns import LAYERS_COLUMNS

    columns = set(LAYERS_COLUMNS)
    spelled: dict[str, set[str]] = {}
    for name, path in _modules().items():
        if name == "quantscan.columns" or name.endswith("toolchains.rknn.driver"):  # runs in the vendor's Python
            continue
        for value in set(_string_literals(ast.parse(path.read_text(encoding="utf-8")))) & columns:
            if not name.startswith(HOMONYMS.get(value, ("\0",))):
                spelled.setdefault(value, set()).add(name)
    assert not spelled, {c: sorted(m) for c, m in sorted(spelled.items())}


def test_the_column_check_sees_a_planted_literal() -> None:
    tree = ast.parse('x = row["isolated_sqnr_db"]\n"""isolated_sqnr_db in a docstring is text"""\ny = f"{a}node"\n')
    assert list(_string_literals(tree)) == ["isolated_sqnr_db"]


MAX_FUNCTION_LINES = 80


def test_no_function_over_80_lines() -> None:
    long = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert not long, long


# --- issue 42: every file a user (or a vendor toolkit) wrote is read through quantscan.readers ----------------

RAW_READS = {
    ("np", "load"), ("np", "fromfile"), ("np", "loadtxt"), ("np", "genfromtxt"), ("np", "memmap"),
    ("numpy", "load"), ("json", "load"), ("json", "loads"), ("pickle", "load"), ("pickle", "loads"),
}
"""Module functions that parse a file or a text without the readers' checks (sizes, depth, pickle)."""

READ_ALLOWED: dict[str, dict[str, str]] = {
    "quantscan.machine": {".read_text": "/proc/meminfo and cgroup limits: the kernel's files, not user data"},
    "quantscan.runfolder": {
        ".read_text": "/proc/self/status for the umask: the kernel's file",
        "zipfile.ZipFile": "is_quantscan_zip reads only a size-capped MANIFEST.json to tell our bundle from a "
                           "user's zip before overwriting it; anything unreadable is 'not ours'",
    },
    "quantscan.model": {".open": "the ONNX model: the model half of issue 42 (model.py's own checks, then onnx)"},
    "quantscan.cases": {".read_bytes": "sha256 of a model file a case names (a regular file: is_file first); "
                                       "hashed, never parsed"},
    "quantscan.repro": {".read_bytes": "sha256 of the model extract already loaded; hashed, never parsed"},
    "quantscan.toolchains.tpumlir.judge": {".read_bytes": "sha256 of the model copy and samples it just wrote "
                                                          "itself (reuse of the prepared files); hashed, never parsed"},
    "quantscan.report.html": {".read_text": "the package's own report assets (importlib.resources)"},
    "quantscan.runner": {k: "the trace onnxruntime's own profiler just wrote into our temp folder (cost --profile "
                            "onnxruntime)" for k in (".read_text", "json.loads")},
    "quantscan.executors": {".read_text": "Ray's own log, redirected to our temp file while it starts; its last "
                                          "line is quoted in the refusal"},
    "quantscan.toolchains.rknn.driver": {
        k: "runs in the vendor's Python, where quantscan is not importable; reads the job quantscan wrote and the "
           "toolkit's own dumps; quantscan reads what it leaves through toolchains.driverfiles"
        for k in (".read_text", "json.loads", "np.load")},
    "quantscan.toolchains.tpumlir.driver": {
        k: "runs in the vendor's Python, where quantscan is not importable; reads the job quantscan wrote and the "
           "toolkit's own dumps; quantscan reads what it leaves through toolchains.driverfiles"
        for k in (".read_text", "json.loads", "np.load")},
}
"""Modules outside quantscan.readers that may read a file directly, each call kind with its reason."""


def _module_aliases(tree: ast.Module) -> set[str]:
    """Names bound to imported modules of ours (`from quantscan import runfolder`): `runfolder.read_text(...)`
    is the guarded reader of that module, not `Path.read_text`."""
    names, known = set(), set(_modules())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("quantscan"):
            names |= {a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in known}
    return names


def _read_mode(node: ast.Call, position: int) -> bool:
    """An open()-like call that reads: no mode given, or a literal mode with 'r'."""
    mode = node.args[position] if len(node.args) > position else next(
        (k.value for k in node.keywords if k.arg == "mode"), None)
    return mode is None or (isinstance(mode, ast.Constant) and "r" in str(mode.value))


def raw_reads(tree: ast.Module) -> set[str]:
    """The kinds of direct file reads a module makes: `np.load`, `json.loads`, `.read_text`, `.read_bytes`,
    `.open`/`open` in a read mode, `zipfile.ZipFile` for reading."""
    ours = _module_aliases(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id == "open" and _read_mode(node, 1):
            found.add("open")
        if not isinstance(func, ast.Attribute):
            continue
        base = func.value.id if isinstance(func.value, ast.Name) else None
        if (base, func.attr) in RAW_READS:
            found.add(f"{base}.{func.attr}")
        elif base == "zipfile" and func.attr == "ZipFile" and _read_mode(node, 1):
            found.add("zipfile.ZipFile")
        elif func.attr in ("read_text", "read_bytes") and base not in ours:
            found.add(f".{func.attr}")
        elif func.attr == "open" and node.args and _read_mode(node, 0) and base not in ("os", "zf"):
            found.add(".open")
    return found


def test_files_are_read_only_through_the_readers() -> None:
    offenders = []
    for name, path in _modules().items():
        if name == "quantscan.readers" or name.startswith("quantscan.readers."):
            continue
        extra = raw_reads(ast.parse(path.read_text(encoding="utf-8"))) - set(READ_ALLOWED.get(name, {}))
        if extra:
            offenders.append(f"{name}: {sorted(extra)}")
    assert not offenders, "read these through quantscan.readers (or allow-list them with a reason): " + "; ".join(
        offenders)


def test_the_read_check_sees_planted_reads_and_not_guarded_ones() -> None:
    planted = ast.parse("import numpy as np\nfrom quantscan import runfolder\n"
                        "a = np.load(p)\nb = json.loads(t)\nc = Path(p).read_text()\nd = p.open('rb')\n"
                        "e = open(p)\nf = zipfile.ZipFile(p)\ng = runfolder.read_text(p)\n"
                        "h = zipfile.ZipFile(buf, 'w')\ni = p.open('w')\n")
    assert raw_reads(planted) == {"np.load", "json.loads", ".read_text", ".open", "open", "zipfile.ZipFile"}


def test_every_allowed_read_is_still_made() -> None:
    """An allow-list entry whose read is gone is stale: it would let a new raw read through unnoticed."""
    modules = _modules()
    stale = [f"{name}: {kind}" for name, kinds in READ_ALLOWED.items() for kind in kinds
             if kind not in raw_reads(ast.parse(modules[name].read_text(encoding="utf-8")))]
    assert not stale, stale
