"""Finding the vendor's Python: the interpreter that can import the toolkit, never ours.

Vendor SDKs pin old numpy/torch/onnx (rknn-toolkit2 2.5.0: numpy<2, torch 2.4; tpu_mlir: Python 3.10
only), so they live in their own venv and quantscan only ever runs them as a subprocess.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from quantscan.errors import UsageError

TOOL_MODULES = {"rknn": "rknn.api", "tpu-mlir": "tpu_mlir"}
"""Vendor tool -> the module its Python must import."""
ENV_VARS = {"rknn": "QUANTSCAN_RKNN_PYTHON", "tpu-mlir": "QUANTSCAN_TPU_MLIR_PYTHON"}
"""Vendor tool -> environment variable naming its Python (checked before the usual places)."""
USUAL_VENVS = ("venv-{tool}", ".venv-{tool}", "venvs/{tool}")
"""Relative to the working directory, the home directory and the working directory's parent."""


IMPORTED = "quantscan-imported"
"""What the import probe prints once the module is imported: exit 0 alone proves nothing (a wrapper
script, or anything that is not Python, can exit 0 without running a line)."""


def imports(python: Path, module: str, timeout: float = 120.0) -> bool:
    """Whether `python` imports `module` and says so (the toolkit's import can take several seconds)."""
    try:
        done = subprocess.run([str(python), "-c", f"import {module}; print({IMPORTED!r} + '-' + {module!r})"],
                              capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    said = f"{IMPORTED}-{module}".encode()
    return done.returncode == 0 and said in done.stdout.splitlines()


def candidates(tool: str) -> list[Path]:
    """Where a vendor Python is looked for, in order: $QUANTSCAN_<TOOL>_PYTHON, venvs named after the
    tool beside the working directory or in home, then python3 on PATH."""
    found: list[Path] = []
    env = os.environ.get(ENV_VARS.get(tool, ""), "")
    if env:
        found.append(Path(env))
    roots = [Path.cwd(), Path.cwd().parent, Path.home()]
    for root in roots:
        for pattern in USUAL_VENVS:
            found.append(root / pattern.format(tool=tool) / "bin" / "python")
    on_path = shutil.which("python3")
    if on_path:
        found.append(Path(on_path))
    return list(dict.fromkeys(found))


def find_python(tool: str, given: str | Path | None = None, places: Sequence[Path] | None = None) -> Path:
    """`given` when it imports the tool's module, else the first candidate that does.

    Raises UsageError naming what was tried: with no toolkit there is nothing to compare against.
    """
    module = TOOL_MODULES[tool]
    if given is not None:
        path = Path(os.path.abspath(given))  # the driver runs in another folder; not resolve(): a venv's
        # python is a symlink whose target does not know the venv
        if not path.exists():
            raise UsageError(f"--python: expected a Python interpreter, found no file at {path}")
        if not imports(path, module):
            raise UsageError(f"--python: expected a Python that imports {module}, found {path} cannot")
        return path
    tried = [p for p in (places if places is not None else candidates(tool)) if p.exists()]
    for path in tried:
        if imports(path, module):
            return path
    raise UsageError(
        f"vendor {tool}: expected a Python that imports {module} (--python PATH or ${ENV_VARS[tool]}), "
        f"found none among {', '.join(map(str, tried)) or 'the usual places'}"
    )
