"""Faults planted into dumps: how quantscan (and a user, on their own dumps) checks that a departure is
found where it starts.

Three bugs a board shows: a tensor scaled by 2 (a requantization shift off by one bit), offset by its
RMS (a wrong zero point), its strongest channel zeroed (a wrong per-channel scale or weight layout). A
fault "from site K on" is applied to the dump of K and of every later site, as a bug at K would reach
them; the same channel on every sample (the strongest of sample 0), as a bug would be.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from quantscan.device.dumps import DumpSet

KINDS = ("scale", "offset", "channel")


def _axis(a: np.ndarray) -> int:
    return 1 if a.ndim == 4 else a.ndim - 1


def strongest_channel(a: np.ndarray) -> int:
    """The channel (axis 1 of a 4-D tensor, else the last axis) with the most energy."""
    axes = tuple(i for i in range(a.ndim) if i != _axis(a))
    return int(np.argmax(np.square(a, dtype=np.float64).sum(axis=axes)))


def fault(kind: str, a: np.ndarray, channel: int = 0) -> np.ndarray:
    """`a` with one fault of `kind` (module docstring)."""
    if kind == "scale":
        return a * np.float32(2.0)
    if kind == "offset":
        return a + np.float32(np.sqrt(np.mean(np.square(a, dtype=np.float64))))
    if kind != "channel":
        raise ValueError(f"fault kind must be one of {KINDS}, not {kind!r}")
    out = a.copy()
    index: list[slice | int] = [slice(None)] * a.ndim
    index[_axis(a)] = channel
    out[tuple(index)] = 0.0
    return out


def planted(dumps: DumpSet, layers: Iterable[str], kind: str) -> DumpSet:
    """`dumps` with a fault of `kind` in every one of `layers` (dump names), on every sample, and in the
    runtime's copies of them (a name that extends one of them: RKNN's `X__float16`, `X_int8` convert X
    and hold its values, so a bug in X reaches them too)."""
    names = list(dumps.load(0))
    roots = tuple(set(layers))
    chosen = {n for n in names if n.startswith(roots)} if roots else set()
    channels = {k: strongest_channel(v) for k, v in dumps.load(0).items() if k in chosen and v.ndim}

    def load(i: int) -> dict[str, np.ndarray]:
        return {k: fault(kind, v, channels.get(k, 0)) if k in chosen else v for k, v in dumps.load(i).items()}

    return replace(dumps, load=load)
