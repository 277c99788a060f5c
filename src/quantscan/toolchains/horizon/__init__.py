"""Horizon hb_mapper: its checker and makertbin logs, its name rules and the plan keys it reads.

`TOOLCHAIN` is this folder's line in `toolchains.TOOLCHAINS`.
"""

from __future__ import annotations

from quantscan.toolchains.folder import LogReader, ToolchainFolder
from quantscan.toolchains.horizon import export, kit, log

TOOLCHAIN = ToolchainFolder(
    name=kit.NAME, label=kit.LABEL, renames=kit.RENAMES, exports=export.EXPORTS,
    log=LogReader(log.looks_like_hb_mapper, log.parse_hb_mapper),
)
