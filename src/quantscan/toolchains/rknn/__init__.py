"""Rockchip RKNN-Toolkit2: the driver script, the run, its files, its log, its dumps, its name rules and the
plan files Rockchip's toolkits read (the hybrid cfg, the RKLLM build).

`TOOLCHAIN` is this folder's line in `toolchains.TOOLCHAINS`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quantscan.errors import UsageError
from quantscan.toolchains.folder import DumpReader, LogReader, ToolchainFolder, VendorRequest
from quantscan.toolchains.rknn import dumps, export, kit, log

if TYPE_CHECKING:
    from quantscan.toolchains.result import VendorRun


def vendor(model: str | Path, calib: str | Path, request: VendorRequest) -> VendorRun:
    """`quantscan vendor rknn`: build, simulator and accuracy_analysis beside quantscan's scan (`run`)."""
    if request.calib_method is not None:
        raise UsageError(f"vendor rknn: expected no --calib-method (tpu-mlir only), found {request.calib_method}")
    from quantscan.toolchains.rknn.run import run_rknn  # pandas, onnx, the scan: only when the toolkit runs

    return run_rknn(model, calib, target=request.target, out=request.out, scan=request.scan,
                    python=request.python, limit=request.limit, analysis_samples=request.analysis_samples,
                    plan=request.plan, threads=request.threads, progress=request.progress)


def bisect_judge(tool: str, python: str | Path | None, target: str | None, work: Path) -> object:
    """`bisect --evaluator/--verify rknn`: the toolchain it builds plans with (`hybrid.toolchain_factory`)."""
    from quantscan.toolchains.rknn.hybrid import toolchain_factory  # the driver and the scan: only when asked

    return toolchain_factory(tool, python, target, work)


TOOLCHAIN = ToolchainFolder(
    name=kit.NAME, label=kit.LABEL, renames=kit.RENAMES, python=kit.PYTHON, vendor=vendor, judge=bisect_judge,
    log=LogReader(log.looks_like_rknn, log.parse_rknn),
    dumps=DumpReader(dumps.read_folder, dumps.looks_like, dumps.LOOKS), exports=export.EXPORTS,
)
