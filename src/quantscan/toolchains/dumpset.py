"""The shape every dump reader returns: sample keys, and per sample {dump name: float array}.

Why its own module, here: the readers (`device/npy`, `toolchains/rknn/dumps`, `toolchains/tpumlir/dumps`)
build it and `device/dumps` picks a reader, so it sits below both; in `dumps` it made the readers and their
picker import each other, and in `device/` it made each toolchain folder import `device`, which imports
the toolchains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class DumpSet:
    """The dumps of one run: `keys[i]` names sample i (a file stem or an index such as `000`)."""

    format: str
    source: Path
    keys: list[str]
    load: Callable[[int], dict[str, np.ndarray]]
    """Sample i's tensors: dump name -> float32 array, in the dump's own layout."""
    order: Callable[[], list[str]] | None = None
    """The dump names in the runtime's execution order, when the format records it."""
