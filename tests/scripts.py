"""Scripts the tests load from their files, as their own interpreter would: not quantscan imports.

Why one helper: the vendor drivers run in the toolkit's Python (quantscan is not importable there) and
the benchmarks' and examples' scripts are not a package, so a test reaches their functions by loading the
file; six tests each wrote those five lines out.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from quantscan.toolchains.tpumlir import run as tpurun

REPO = Path(__file__).resolve().parents[1]


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """The file at `path` executed as module `name` (default: its stem), registered in sys.modules first
    (dataclasses look their module up while the file executes)."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def tpu_mlir_driver() -> ModuleType:
    """tpu-mlir's driver.py as the vendor's Python loads it (a script, not a quantscan import)."""
    return load_script(Path(tpurun.DRIVER), "tpumlir_driver")
