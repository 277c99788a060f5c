"""What every task accumulator is (mergeable sums, figures as ratios) and the task names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

TASKS = ("auto", "classify", "ctc", "decoder", "mask", "heatmap", "box", "lm", "none")
LABEL_FILE = "labels.json"
"""YOLOX heads (and their [1, N, 5+C] exports without decode) predict on these three grids."""
"""obj·cls score a box needs to count as a detection (YOLOX demo: 0.3 for display)."""
"""Class-wise NMS overlap, as YOLOX's multiclass_nms and ddddocr use."""
"""An int8 box agrees with an FP32 box of the same class when their IoU reaches this."""


class TaskAccumulator(Protocol):
    """What evaluate feeds per batch and reads at the end; `merge` adds another's sums exactly."""

    kind: str

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None: ...
    def merge(self, other: Any) -> None: ...
    def sums(self) -> dict[str, float]: ...
    def results(self) -> dict[str, float]: ...


def feed(acc: TaskAccumulator, output: str, values: Mapping[str, np.ndarray], suffix: str,
         labels: Sequence[int | None] | None) -> list[float]:
    """One batch into `acc`: FP32 `values[output]` against int8 `values[output + suffix]` (and the other
    outputs an accumulator `reads`, an anchor head's scores). Returns the per-sample task figures of the
    batch when the accumulator keeps them (`take_samples`), else [] (worst samples by the task metric)."""
    reads = tuple(getattr(acc, "reads", ()))
    if reads:
        names = (output, *reads)
        acc.update_outputs({n: values[n] for n in names}, {n: values[n + suffix] for n in names},  # type: ignore[attr-defined]
                           output, labels)
    else:
        acc.update(values[output], values[output + suffix], labels)
    take = getattr(acc, "take_samples", None)
    return list(take()) if take is not None else []


def group_figures(s: Mapping[str, float], group: str) -> dict[str, float]:
    """SQNR (dB) and cosine of one channel group from its sums (`BoxAccumulator._group_sums`)."""
    sxx, sdd, sxy, syy = (s.get(f"{group}_{k}", 0.0) for k in ("sxx", "sdd", "sxy", "syy"))
    sqnr = math.inf if sdd == 0 else (10 * math.log10(sxx / sdd) if sxx > 0 else -math.inf)
    cosine = sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float(sxx == syy == 0)
    return {"sqnr_db": sqnr, "cosine": cosine}


def ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def add_sums(into: dict[str, float], other: Mapping[str, float]) -> None:
    for key, value in other.items():
        into[key] = into.get(key, 0.0) + float(value)
