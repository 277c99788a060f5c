"""`--channel-groups`: an output's channels measured in named groups (split heads).

Why: a head that pools channels of different kinds in one output (a YOLOv8-style [N, 4+C, A] head: box
coordinates in pixels beside class scores; a U-Net-style map whose last channel is the score) has a pooled
cosine the large channels decide: 0.99945 overall while the scores alone were at 14.5 dB (issue 26). Per
group, pooled over samples and every other axis: `GROUP_cosine`, `GROUP_sqnr_db` (task.csv, summary.md).

Spec: `OUTPUT[@AXIS]=LABEL:A-B[,LABEL:A-B...]`, channel indices inclusive (`LABEL:K` for one channel),
AXIS default 1 (the channel axis of [N, C, ...]; -1 for NHWC/[N, T, C]).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from quantscan.errors import UsageError
from quantscan.taskmetrics.base import add_sums, group_figures

_GROUP = re.compile(r"^(?P<label>[A-Za-z_][\w.-]*):(?P<start>\d+)(?:-(?P<stop>\d+))?$")


@dataclass(frozen=True)
class ChannelGroups:
    """One parsed `--channel-groups` spec."""

    output: str
    axis: int
    groups: tuple[tuple[str, int, int], ...]
    """(label, first channel, last channel), inclusive."""


def parse_channel_groups(spec: str) -> ChannelGroups:
    """`OUTPUT[@AXIS]=LABEL:A-B,...` -> ChannelGroups; usage error naming what was expected."""
    head, sep, body = spec.partition("=")
    output, _, axis_text = head.partition("@")
    expected = "--channel-groups: expected OUTPUT[@AXIS]=LABEL:A-B[,LABEL:A-B...]"
    if not sep or not output or not body or (axis_text and not re.fullmatch(r"-?\d+", axis_text)):
        raise UsageError(f"{expected}, found {spec!r}")
    groups = []
    for part in body.split(","):
        m = _GROUP.match(part.strip())
        if m is None:
            raise UsageError(f"{expected}, found group {part!r} in {spec!r}")
        start = int(m["start"])
        stop = int(m["stop"]) if m["stop"] is not None else start
        if stop < start:
            raise UsageError(f"{expected} with A <= B, found {part!r}")
        groups.append((m["label"], start, stop))
    return ChannelGroups(output, int(axis_text) if axis_text else 1, tuple(groups))


@dataclass
class ChannelGroupAccumulator:
    """Σx², Σy², Σxy, Σ(x−y)² per channel group of one output (see the module docstring)."""

    spec: ChannelGroups
    kind: str = "groups"
    _s: dict[str, float] = field(default_factory=dict)

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        r, t = np.asarray(ref, np.float64), np.asarray(test, np.float64)
        axis = self.spec.axis % r.ndim if r.ndim else 0
        channels = r.shape[axis] if r.ndim else 1
        sums: dict[str, float] = {}
        for label, start, stop in self.spec.groups:
            if stop >= channels:
                raise UsageError(f"--channel-groups {self.spec.output}: expected channels up to {channels - 1} "
                                 f"on axis {self.spec.axis}, found group {label}:{start}-{stop}")
            rg = np.take(r, range(start, stop + 1), axis=axis)
            tg = np.take(t, range(start, stop + 1), axis=axis)
            d = rg - tg
            sums.update({f"{label}_sxx": float(np.sum(rg * rg)), f"{label}_syy": float(np.sum(tg * tg)),
                         f"{label}_sxy": float(np.sum(rg * tg)), f"{label}_sdd": float(np.sum(d * d))})
        add_sums(self._s, sums)

    def merge(self, other: ChannelGroupAccumulator) -> None:
        add_sums(self._s, other._s)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for label, _, _ in self.spec.groups:
            figures = group_figures(self._s, label)
            out[f"{label}_cosine"], out[f"{label}_sqnr_db"] = figures["cosine"], figures["sqnr_db"]
        return out
