"""`heatmap`: score maps with one peak per channel (keypoint heatmaps, text/score maps, centre maps), in
NCHW or NHWC.

Why not cosine alone: a map's cosine pools every pixel, and the value that decides the product is where
each channel peaks; a wide feature channel or a bright background hides a peak that moved. Per sample and
channel, the peak (argmax over H·W) of the FP32 map and of the int8 map: `peak_agreement` is the share at
the same pixel, `peak_within_1px` within one pixel (Chebyshev distance <= 1). The score channels are
measured apart too: `score_cosine` and `score_sqnr_db` pooled over the map, and per channel, the worst
channel's cosine and its index (`worst_channel_cosine`, `worst_channel`), so one starved channel of a split
head does not hide behind the others' energy.

Layout: `NCHW` or `NHWC` as given, or `auto`: of axes 1 and 3 of a rank-4 map the smaller is the channel
axis (NCHW on a tie); a rank-3 [N, H, W] map is one channel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from quantscan.errors import UsageError
from quantscan.taskmetrics.base import add_sums, group_figures, ratio

LAYOUTS = ("auto", "NCHW", "NHWC")


def heatmap_layout(shape: Sequence[int], layout: str = "auto") -> str:
    """`NCHW` or `NHWC` for a map of `shape` (see the module docstring); usage error for other ranks."""
    dims = [int(d) for d in shape]
    if len(dims) == 3:
        return "NCHW"
    if len(dims) != 4:
        raise UsageError(f"--task heatmap: expected an [N, C, H, W] or [N, H, W, C] output, found shape {dims}")
    if layout != "auto":
        return layout
    return "NHWC" if dims[3] < dims[1] else "NCHW"


def as_nchw(values: np.ndarray, layout: str) -> np.ndarray:
    """[N, C, H, W] float64 view of a map (a rank-3 map is one channel)."""
    a = np.asarray(values, dtype=np.float64)
    if a.ndim == 3:
        return a[:, None]
    return np.moveaxis(a, 3, 1) if layout == "NHWC" else a


@dataclass
class HeatmapAccumulator:
    """Peak agreement and per-channel figures of a heatmap output (see the module docstring)."""

    layout: str = "auto"
    kind: str = "heatmap"
    sample_metric: str = "peak_agreement"
    higher_is_worse: bool = False
    _s: dict[str, float] = field(default_factory=dict)
    _samples: list[float] = field(default_factory=list)

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        layout = heatmap_layout(np.shape(ref), self.layout)
        r, t = as_nchw(ref, layout), as_nchw(test, layout)
        n, c, _, w = r.shape
        rp = np.argmax(r.reshape(n, c, -1), axis=2)
        tp = np.argmax(t.reshape(n, c, -1), axis=2)
        distance = np.maximum(np.abs(rp // w - tp // w), np.abs(rp % w - tp % w))
        sums = {"peaks": float(rp.size), "peak_same": float(np.count_nonzero(distance == 0)),
                "peak_near": float(np.count_nonzero(distance <= 1))}
        d = r - t
        for k in range(c):
            rk, tk, dk = r[:, k], t[:, k], d[:, k]
            sums.update({f"ch{k}_sxx": float(np.sum(rk * rk)), f"ch{k}_syy": float(np.sum(tk * tk)),
                         f"ch{k}_sxy": float(np.sum(rk * tk)), f"ch{k}_sdd": float(np.sum(dk * dk))})
        add_sums(self._s, sums)
        self._samples.extend(float(v) for v in (distance == 0).mean(axis=1))

    def take_samples(self) -> list[float]:
        """Per sample of the batches fed since the last call: the share of its channels whose peak stayed."""
        out, self._samples = self._samples, []
        return out

    def merge(self, other: HeatmapAccumulator) -> None:
        add_sums(self._s, other._s)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        s = self._s
        channels = sum(1 for k in s if k.startswith("ch") and k.endswith("_sxx"))
        pooled = {k: sum(s.get(f"ch{c}_{k}", 0.0) for c in range(channels)) for k in ("sxx", "syy", "sxy", "sdd")}
        score = group_figures({f"score_{k}": v for k, v in pooled.items()}, "score")
        per_channel = [group_figures(s, f"ch{c}")["cosine"] for c in range(channels)]
        worst = int(np.argmin(per_channel)) if per_channel else -1
        return {
            "peak_agreement": ratio(s.get("peak_same", 0.0), s.get("peaks", 0.0)),
            "peak_within_1px": ratio(s.get("peak_near", 0.0), s.get("peaks", 0.0)),
            "score_cosine": score["cosine"],
            "score_sqnr_db": score["sqnr_db"],
            "worst_channel_cosine": per_channel[worst] if per_channel else math.nan,
            "worst_channel": float(worst),
            "channels": float(channels),
        }
