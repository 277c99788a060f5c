"""How far a toolchain reaches outside its folder: the modules whose code names it (string values,
f-string pieces, imports of its folder; docstrings are prose and not counted). The issue-41 measure of
"adding a toolchain touches N modules".

    python benchmarks/toolchain_reach.py [SRC]     # SRC: a checkout's src/ (default: this one's)
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

TOOLS = {"tpumlir": re.compile(r"tpu[-_]?mlir", re.I), "rknn": re.compile(r"rknn", re.I),
         "horizon": re.compile(r"hb_mapper|horizon", re.I)}


def names_tool(tree: ast.Module, tool: str, pattern: re.Pattern[str]) -> bool:
    docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if pattern.search(node.value):
                return True
        if isinstance(node, ast.ImportFrom) and node.module and (
                f"toolchains.{tool}" in node.module
                or (node.module == "quantscan.toolchains" and any(a.name == tool for a in node.names))):
            return True
    return False


def main() -> int:
    root = (Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "src") / "quantscan"
    print("| toolchain | modules outside its folder naming it | packages | modules |\n|---|---|---|---|")
    for tool, pattern in TOOLS.items():
        hits = [p.relative_to(root).as_posix() for p in sorted(root.rglob("*.py"))
                if not p.relative_to(root).as_posix().startswith(f"toolchains/{tool}/")
                and names_tool(ast.parse(p.read_text(encoding="utf-8")), tool, pattern)]
        packages = {h.split("/")[0] if "/" in h else "(top)" for h in hits}
        print(f"| {tool} | {len(hits)} | {len(packages)} | {' '.join(hits)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
