"""`presence`: one-number outputs (a face/pose presence score, a binary classifier's logit) as decisions.

Why: the cosine of one number per sample is its sign agreement (a "worst-sample cosine 0" says only that
one sample's score crossed zero), and what the application reads is whether the score clears its
threshold. Per value, the decision `value > threshold` of FP32 and of int8: `presence_flip_rate` (the
share of decisions that flipped), `presence_flips` (their count), `presence_fp32_positive` (the share
FP32 calls present) and `presence_mean_abs_change` (of the score itself).

Threshold: 0.5 when the graph's last op on the output is a Sigmoid (a probability), else 0.0 (a logit,
where sigmoid(0) = 0.5: the same decision); `presence:output=NAME,threshold=T` sets it.
Auto-detection gives this task to an [N, 1] (or [N], [N, 1, 1, 1]) output whose producer is a Sigmoid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from quantscan.taskmetrics.base import add_sums, ratio

PROBABILITY_THRESHOLD = 0.5
LOGIT_THRESHOLD = 0.0


def one_value_per_sample(shape: Sequence[int]) -> bool:
    """[N], [N, 1], [N, 1, 1, 1]: a scalar score per sample."""
    return len(shape) >= 1 and all(int(d) == 1 for d in shape[1:])


@dataclass
class PresenceAccumulator:
    """Decision flips of a score output at `threshold` (module docstring)."""

    threshold: float = PROBABILITY_THRESHOLD
    kind: str = "presence"
    sample_metric: str = "presence_flip"
    higher_is_worse: bool = True
    _s: dict[str, float] = field(default_factory=dict)
    _samples: list[float] = field(default_factory=list)

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        r = np.asarray(ref, np.float64).reshape(np.shape(ref)[0] if np.ndim(ref) else 1, -1)
        t = np.asarray(test, np.float64).reshape(r.shape)
        flips = (r > self.threshold) != (t > self.threshold)
        add_sums(self._s, {"decisions": float(r.size), "flips": float(np.count_nonzero(flips)),
                           "fp32_positive": float(np.count_nonzero(r > self.threshold)),
                           "abs_change": float(np.abs(r - t).sum())})
        self._samples.extend(float(v) for v in flips.mean(axis=1))

    def take_samples(self) -> list[float]:
        """Per sample of the batches fed since the last call: the share of its decisions that flipped."""
        out, self._samples = self._samples, []
        return out

    def merge(self, other: PresenceAccumulator) -> None:
        add_sums(self._s, other._s)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        s = self._s
        n = s.get("decisions", 0.0)
        return {"presence_flip_rate": ratio(s.get("flips", 0.0), n), "presence_flips": s.get("flips", 0.0),
                "presence_fp32_positive": ratio(s.get("fp32_positive", 0.0), n),
                "presence_mean_abs_change": ratio(s.get("abs_change", 0.0), n),
                "presence_threshold": self.threshold}
