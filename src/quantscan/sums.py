"""Float64 sums whose merge does not depend on how the samples were split.

Why: `--workers` and `--executor` split the samples into shards of whole batches, each shard sums its
batches, and the shards merge. Plain float64 `+=` rounds at every step, so (a + b) + c and a + (b + c)
can differ in the last bit, and layers.csv would change bytes with the worker count. A
:class:`CompensatedSum` keeps the running sum and the rounding error it dropped (Neumaier's
compensated summation, one TwoSum per addition), so its value is the true sum of its terms to about
2⁻¹⁰⁶ relative: rounded to float64 that is the same number whatever the order of additions and merges,
except when the true sum lies within that distance of a rounding boundary.

Works on Python floats and on numpy arrays (per-channel sums) alike. Pure numpy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _two_sum_error(hi: Any, x: Any, total: Any) -> Any:
    """The rounding error of `total = hi + x` (Knuth's TwoSum: exact for finite operands); 0 where the
    sum is not finite (inf − inf would make the error NaN and poison a sum that is rightly ±inf)."""
    if not isinstance(total, np.ndarray):  # Python floats: no numpy call per term (one per batch and site)
        if not math.isfinite(total):
            return 0.0
        back = total - hi
        return (hi - (total - back)) + (x - back)
    with np.errstate(invalid="ignore", over="ignore"):
        back = total - hi
        error = (hi - (total - back)) + (x - back)
    return np.where(np.isfinite(total), error, 0.0)


class CompensatedSum:
    """A float64 running sum (scalar or array) plus the rounding error its additions dropped."""

    __slots__ = ("hi", "lo")

    def __init__(self, start: Any = 0.0) -> None:
        self.hi: Any = start
        self.lo: Any = np.zeros_like(start) if isinstance(start, np.ndarray) else 0.0

    def add(self, x: Any) -> None:
        """Add a term (a float, or an array of the running sum's shape)."""
        total = self.hi + x
        self.lo = self.lo + _two_sum_error(self.hi, x, total)
        self.hi = total

    def add_all(self, terms: np.ndarray) -> None:
        """Add every value of a 1-D array (a scalar sum), or every row of a 2-D one (an array sum): one
        term per sample, so how the samples were batched does not matter either."""
        if isinstance(self.hi, np.ndarray) or not np.isfinite(terms).all() or not math.isfinite(self.hi):
            for term in terms:
                self.add(term if isinstance(self.hi, np.ndarray) else float(term))
            return
        parts = [self.hi, self.lo, *terms.tolist()]
        total = math.fsum(parts)  # the exact sum, rounded once
        parts.append(-total)
        self.hi, self.lo = total, math.fsum(parts)  # and what that rounding dropped

    def merge(self, other: CompensatedSum) -> None:
        """Add another sum (a disjoint shard's): its rounded value, then its dropped error."""
        self.add(other.hi)
        self.lo = self.lo + other.lo

    @property
    def value(self) -> Any:
        """The sum rounded once to float64 (a float, or an array)."""
        with np.errstate(invalid="ignore"):
            total = self.hi + self.lo
        if isinstance(total, np.ndarray):
            return np.where(np.isfinite(self.hi), total, self.hi)
        return float(total) if math.isfinite(self.hi) else float(self.hi)
