"""`mask`: IoU of the thresholded score map (segmentation, DB-style text detectors).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from quantscan.taskmetrics.base import add_sums, ratio

DEFAULT_MASK_THRESHOLD = 0.5


# --- masks / score maps ------------------------------------------------------------------------------


@dataclass
class MaskIouAccumulator:
    """IoU of `ref > threshold` and `test > threshold`: mean per sample (empty/empty counts 1), pooled, and
    the worst sample's (`mask_iou_worst`: a mean of 0.947 hid a 0.79 image, issue 40)."""

    threshold: float = DEFAULT_MASK_THRESHOLD
    kind: str = "mask"
    sample_metric: str = "mask_iou"
    higher_is_worse: bool = False
    _s: dict[str, float] = field(default_factory=dict)
    _samples: list[float] = field(default_factory=list)
    _worst: float = math.inf
    """The lowest per-sample IoU (a min merges exactly, like the sums)."""

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        r = np.asarray(ref).reshape(np.shape(ref)[0], -1) > self.threshold
        t = np.asarray(test).reshape(np.shape(test)[0], -1) > self.threshold
        inter = np.count_nonzero(r & t, axis=1).astype(np.float64)
        union = np.count_nonzero(r | t, axis=1).astype(np.float64)
        per_sample = np.where(union > 0, inter / np.maximum(union, 1), 1.0)
        add_sums(self._s, {"samples": float(r.shape[0]), "iou_sum": float(per_sample.sum()),
                            "intersection": float(inter.sum()), "union": float(union.sum())})
        self._samples.extend(float(v) for v in per_sample)
        if per_sample.size:
            self._worst = min(self._worst, float(per_sample.min()))

    def take_samples(self) -> list[float]:
        """Per sample of the batches fed since the last call: its mask IoU (worst samples by IoU)."""
        out, self._samples = self._samples, []
        return out

    def merge(self, other: MaskIouAccumulator) -> None:
        add_sums(self._s, other._s)
        self._worst = min(self._worst, other._worst)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        s = self._s
        pooled = ratio(s.get("intersection", 0), s.get("union", 0)) if s.get("union") else 1.0
        return {"mask_iou": ratio(s.get("iou_sum", 0), s.get("samples", 0)), "mask_iou_pooled": pooled,
                "mask_iou_worst": self._worst if s.get("samples") else math.nan,
                "mask_threshold": self.threshold}
