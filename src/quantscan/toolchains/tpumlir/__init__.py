"""Sophgo tpu-mlir: the driver script, the run, its logs (model_transform / calibration / model_deploy),
its dumps, its name rules and its quantize table.

`TOOLCHAIN` is this folder's line in `toolchains.TOOLCHAINS`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quantscan.toolchains.folder import DumpReader, LogReader, ToolchainFolder, VendorRequest
from quantscan.toolchains.tpumlir import dumps, export, kit, log

if TYPE_CHECKING:
    from quantscan.toolchains.result import VendorRun


def vendor(model: str | Path, calib: str | Path, request: VendorRequest) -> VendorRun:
    """`quantscan vendor tpu-mlir`: transform, calibrate, deploy int8 and run beside quantscan's scan (`run`)."""
    from quantscan.toolchains.tpumlir.run import run_tpumlir  # pandas, onnx, the scan: only when the toolkit runs

    return run_tpumlir(model, calib, target=request.target, out=request.out, scan=request.scan,
                       python=request.python, limit=request.limit, plan=request.plan, threads=request.threads,
                       progress=request.progress, calib_method=request.calib_method or "kl")


def bisect_judge(tool: str, python: str | Path | None, target: str | None, work: Path) -> object:
    """`bisect --evaluator/--verify tpu-mlir`: the toolchain it builds plans with (`judge.toolchain_factory`)."""
    from quantscan.toolchains.tpumlir.judge import toolchain_factory  # the driver and the scan: only when asked

    return toolchain_factory(tool, python, target, work)


TOOLCHAIN = ToolchainFolder(
    name=kit.NAME, label=kit.LABEL, renames=kit.RENAMES, python=kit.PYTHON, vendor=vendor, judge=bisect_judge,
    log=LogReader(log.looks_like_tpu_mlir, log.parse_tpu_mlir),
    dumps=DumpReader(dumps.read_folder), exports=export.EXPORTS,
)
