"""What one toolchain folder offers the commands: `ToolchainFolder`, listed in `toolchains.TOOLCHAINS`.

Why a registry: `vendor`, `dumps` and `log` each used to name every tool (a choices list, a dispatch, a
format table, a parser order), so adding a toolchain touched 13 modules in 4 packages. A folder now
states its entry points once, in its `__init__.py`, and the commands walk the registry: adding a
toolchain is one folder and one line there. Entry points that load heavy modules (the vendor run:
pandas, onnx, the scan) are imported when called, so listing the tools for `--help` stays light.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantscan.plans import PlanExport
from quantscan.toolchains.dumpset import DumpSet
from quantscan.toolchains.interpreter import VendorPython
from quantscan.toolchains.parsed import ParsedLog

if TYPE_CHECKING:
    from quantscan.toolchains.result import VendorRun


@dataclass(frozen=True)
class Rename:
    """One way a toolchain derives a layer name from an ONNX tensor or node name: `pattern` (a regex) is
    what it appends, or prepends when `prefix`; `why` is said in log_layers.csv's `mapped_by`."""

    pattern: str
    why: str
    prefix: bool = False


@dataclass(frozen=True)
class LogReader:
    """`quantscan log`: whether a text is this tool's conversion log, and its parse."""

    looks_like: Callable[[str], bool]
    parse: Callable[[str], ParsedLog]


@dataclass(frozen=True)
class DumpReader:
    """`quantscan dumps --format NAME`: the tool's per-layer dumps read into the common shape."""

    read: Callable[[Path], DumpSet]
    looks_like: Callable[[Path], bool] | None = None
    """Whether a folder holds this format; None when it cannot be told from the folder alone (tpu-mlir's
    .npz files look like the npy format's): the user says `--format`."""
    looks: str = ""
    """What `looks_like` recognises, for the refusal of a folder no format recognises."""


ScanSide = Callable[..., Any]
"""quantscan's scan writing its run folder (`quantscan.api.scan` with `out=`), run by `vendor TOOL` beside the
toolkit on the same samples. Handed in by the command, not imported: the scan's writer (`api`, `report`)
sits above bisect, and bisect reaches the toolchains' plan exports through `toolchains.TOOLCHAINS`."""


@dataclass(frozen=True)
class VendorRequest:
    """`quantscan vendor TOOL` options beyond the model and the samples (each tool reads what applies)."""

    target: str
    out: Path
    scan: ScanSide
    python: str | None = None
    limit: int | None = None
    analysis_samples: int | None = None
    plan: str | None = None
    threads: int | None = None
    progress: Callable[[str], None] | None = None
    calib_method: str | None = None


JudgeFactory = Callable[[str, "str | Path | None", "str | None", Path], object]
"""`bisect --evaluator/--verify TOOL`: (tool, vendor python, chip, work folder) -> the toolchain the
bisect judge builds with (`bisect.external.ToolchainFactory`), its Python checked before any long work."""

VendorRunner = Callable[[str | Path, str | Path, VendorRequest], "VendorRun"]
"""`quantscan vendor TOOL`: run the toolkit out of process on quantscan's samples, lined up with the scan."""


@dataclass(frozen=True)
class ToolchainFolder:
    """One `toolchains/<tool>/` folder's entry points (None: the tool does not offer that command)."""

    name: str
    """As the command line spells it (`vendor rknn`, `--format tpu-mlir`)."""
    label: str
    """As its logs and messages name it (RKNN-Toolkit2, hb_mapper, tpu-mlir)."""
    renames: tuple[Rename, ...] = ()
    log: LogReader | None = None
    dumps: DumpReader | None = None
    vendor: VendorRunner | None = None
    python: VendorPython | None = None
    """The vendor Python the toolkit runs in (`vendor` runs need one)."""
    judge: JudgeFactory | None = None
    """The toolchain a bisect judges plans in (None: the tool judges no plan)."""
    exports: tuple[PlanExport, ...] = ()
    """The plan files the tool reads (`bisect --export NAME`), written by bisect through the registry."""
