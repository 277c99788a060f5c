"""Stand-in vendor interpreters for tests that drive a toolchain without installing it."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

FAKE_TPU_MLIR = Path(__file__).parent / "toolchains" / "fake_tpu_mlir.py"


def fake_tpu_mlir_python(tmp: Path) -> Path:
    """A `python` that imports a stand-in `tpu_mlir` and finds the fake scripts on PATH."""
    site = tmp / "fake_site" / "tpu_mlir"
    site.mkdir(parents=True, exist_ok=True)
    (site / "__init__.py").write_text("")
    bin_dir = tmp / "fake_bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("model_transform", "run_calibration", "model_deploy", "model_runner"):
        script = bin_dir / tool
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_TPU_MLIR}" {tool} "$@"\n')
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    wrapper = tmp / "python"
    wrapper.write_text(f'#!/bin/sh\nPATH="{bin_dir}:$PATH" PYTHONPATH="{tmp / "fake_site"}" '
                       f'exec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper
