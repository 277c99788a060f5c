"""Finding the vendor's Python: the interpreter that can import the toolkit, never ours.

Vendor SDKs pin old numpy/torch/onnx (rknn-toolkit2 2.5.0: numpy<2, torch 2.4; tpu_mlir: Python 3.10
only), so they live in their own venv and quantscan only ever runs them as a subprocess.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from quantscan.errors import UsageError


@dataclass(frozen=True)
class VendorPython:
    """What a toolchain's Python is known by; each toolchain folder states its own (`<tool>/kit.py`)."""

    tool: str
    """As the command line spells the tool (`rknn`, `tpu-mlir`): also the usual venvs' name."""
    module: str
    """The module that Python must import (`rknn.api`)."""
    env_var: str
    """The environment variable naming that Python, checked before the usual places."""

    def __post_init__(self) -> None:
        _BY_TOOL[self.tool] = self


_BY_TOOL: dict[str, VendorPython] = {}
"""Tool name -> its VendorPython, for callers that name the tool (`find_python("rknn")`): every folder's
`kit` is imported with the `toolchains` package, so each is here before any run asks."""


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


def candidates(kit: VendorPython) -> list[Path]:
    """Where a vendor Python is looked for, in order: $QUANTSCAN_<TOOL>_PYTHON, venvs named after the
    tool beside the working directory or in home, then python3 on PATH."""
    found: list[Path] = []
    env = os.environ.get(kit.env_var, "")
    if env:
        found.append(Path(env))
    roots = [Path.cwd(), Path.cwd().parent, Path.home()]
    for root in roots:
        for pattern in USUAL_VENVS:
            found.append(root / pattern.format(tool=kit.tool) / "bin" / "python")
    on_path = shutil.which("python3")
    if on_path:
        found.append(Path(on_path))
    return list(dict.fromkeys(found))


def find_python(kit: VendorPython | str, given: str | Path | None = None, places: Sequence[Path] | None = None,
                ) -> Path:
    """`given` when it imports the tool's module, else the first candidate that does (`kit`: the folder's
    VendorPython, or the tool's name).

    Raises UsageError naming what was tried: with no toolkit there is nothing to compare against.
    """
    kit = kit if isinstance(kit, VendorPython) else _BY_TOOL[kit]
    module = kit.module
    if given is not None:
        path = Path(os.path.abspath(given))  # the driver runs in another folder; not resolve(): a venv's
        # python is a symlink whose target does not know the venv
        if not path.exists():
            raise UsageError(f"--python: expected a Python interpreter, found no file at {path}")
        if not imports(path, module):
            raise UsageError(f"--python: expected a Python that imports {module}, found {path} cannot")
        return path
    tried = [p for p in (places if places is not None else candidates(kit)) if p.exists()]
    for path in tried:
        if imports(path, module):
            return path
    raise UsageError(
        f"vendor {kit.tool}: expected a Python that imports {module} (--python PATH or ${kit.env_var}), "
        f"found none among {', '.join(map(str, tried)) or 'the usual places'}"
    )
