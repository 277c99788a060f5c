"""Real vendor toolchains: run out of process, their logs and dumps read, their layers lined up with quantscan's.

One folder per toolchain (`rknn`, `tpumlir`, `horizon`) holds what is particular to it: `kit` (its name,
its Python, its layer-name rules), the driver script run by the vendor's own Python (`driver.py`, never
imported here: standard library + numpy + the SDK, talking through JSON/.npy files), the in-process side
of a run (`run.py`), its log reader (`log.py`) and its dumps reader (`dumps.py`). Each folder's
`__init__` states its entry points as a `folder.ToolchainFolder`; `TOOLCHAINS` below lists them, and the
commands (`vendor`, `dumps`, `log`) reach a toolchain only through it. Shared across toolchains:
`interpreter` finds the vendor's Python, `driving` the steps every run takes (the driver run, the FP32
reference, the simulated outputs scored), `parsed` is the shape every log reader returns, `dumpset` the
shape every dumps reader returns, `renaming` names vendor layers back to ONNX, `findings` turns a log into
`check`'s findings, `logs` ties the readers together (`quantscan log`), `align` joins a vendor run with
quantscan's scan and check, `result` writes vendor.csv / vendor.json.
"""

from __future__ import annotations

from quantscan.toolchains import horizon, rknn, tpumlir
from quantscan.toolchains.folder import Rename, ToolchainFolder

TOOLCHAINS: dict[str, ToolchainFolder] = {t.name: t for t in (
    rknn.TOOLCHAIN,
    horizon.TOOLCHAIN,
    tpumlir.TOOLCHAIN,
)}
"""Every toolchain folder by its command-line name; adding a toolchain is its folder and a line here.
The order is the order logs are recognised in and the order the commands list the tools."""



def every_rename() -> tuple[Rename, ...]:
    """Every toolchain's renaming rules, in registry order: what a vendor name is mapped with when the
    tool that wrote it is not told (`dumps` in the npy format, `log` across tools)."""
    return tuple(rule for tool in TOOLCHAINS.values() for rule in tool.renames)
