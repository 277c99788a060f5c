"""`classify`: top-1 / top-5 agreement of the int8 classes with FP32's, accuracy when labels exist.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from quantscan.taskmetrics.base import add_sums, ratio

# --- classification ----------------------------------------------------------------------------------


def class_scores(a: np.ndarray) -> np.ndarray:
    """[N, C] from [N, C] or [N, C, 1, 1]: the layout classifiers emit."""
    arr = np.asarray(a)
    return arr.reshape(arr.shape[0], -1) if arr.ndim > 1 else arr.reshape(1, -1)


def _topk(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest scores per row (order within the k does not matter here)."""
    k = min(k, scores.shape[1])
    return np.argpartition(-scores, k - 1, axis=1)[:, :k]


@dataclass
class ClassifyAccumulator:
    """Top-1 / top-5 agreement (FP32's top-1 among int8's top-k) and accuracy against labels."""

    kind: str = "classify"
    _s: dict[str, float] = field(default_factory=dict)

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        r, t = class_scores(ref).astype(np.float64), class_scores(test).astype(np.float64)
        r1, t1 = np.argmax(r, axis=1), np.argmax(t, axis=1)
        t5 = _topk(t, 5)
        r5 = _topk(r, 5)
        sums = {"samples": r1.size, "top1_agree": np.count_nonzero(r1 == t1),
                "top5_agree": np.count_nonzero((t5 == r1[:, None]).any(axis=1))}
        if labels is not None:
            known = np.array([lab is not None for lab in labels], dtype=bool)
            truth = np.array([-1 if lab is None else int(lab) for lab in labels], dtype=np.int64)
            sums.update({
                "labelled": np.count_nonzero(known),
                "top1_correct": np.count_nonzero(known & (t1 == truth)),
                "fp32_top1_correct": np.count_nonzero(known & (r1 == truth)),
                "top5_correct": np.count_nonzero(known & (t5 == truth[:, None]).any(axis=1)),
                "fp32_top5_correct": np.count_nonzero(known & (r5 == truth[:, None]).any(axis=1)),
            })
        add_sums(self._s, {k: float(v) for k, v in sums.items()})

    def merge(self, other: ClassifyAccumulator) -> None:
        add_sums(self._s, other._s)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        s = self._s
        out = {"top1_agreement": ratio(s.get("top1_agree", 0), s.get("samples", 0)),
               "top5_agreement": ratio(s.get("top5_agree", 0), s.get("samples", 0))}
        if s.get("labelled"):
            for key in ("top1", "top5"):
                out[f"{key}_accuracy"] = ratio(s[f"{key}_correct"], s["labelled"])
                out[f"fp32_{key}_accuracy"] = ratio(s[f"fp32_{key}_correct"], s["labelled"])
        return out
