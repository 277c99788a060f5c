"""Streaming comparison of an FP32 reference tensor with its quantized counterpart.

Pure numpy. Every accumulator keeps float64 running sums only, so memory does not grow with the
number of samples, and feeding batches one at a time gives the same pooled numbers as feeding their
concatenation (up to float64 summation order).

Definitions (x = FP32 reference, y = quantized/test, d = x - y; "pooled" sums run over every element
of every sample):

=======================  ===========================================  ==================================
metric                   definition                                   better
=======================  ===========================================  ==================================
``cosine``               Σxy / √(Σx²·Σy²); 1 when both are all zero,  higher (1 = same direction)
                         0 when exactly one is
``sqnr_db``              10·log10(Σx² / Σd²); ``inf`` when x == y,    higher
                         ``-inf`` when x is all zero but y is not
``mse``                  Σd² / n                                      lower
``max_abs``              max |d|                                      lower
``rel_l2``               ‖d‖ / ‖x‖ (0 when equal, ``inf`` when x is   lower
                         all zero but y is not)
``worst_sample_cosine``  min over samples of the per-sample cosine    higher (NaN: one value per sample)
``mean_sample_cosine``   mean over samples of the per-sample cosine   higher
``worst_sample_sqnr_db`` min over samples of the per-sample SQNR      higher
=======================  ===========================================  ==================================

Axis 0 of every tensor is the sample (batch) axis; a rank-0 tensor is one sample.

Peers differ in spelling, not always in value: onnxruntime's ``compute_signal_to_quantization_noice_ratio``
is 20·log10(‖x‖/‖x−y‖), the same number as ours; Polygraphy divides means (also the same ratio, but
per output and not pooled across batches); PPQ's "snr" is the *linear* ratio Σd²/Σx² where lower is
better (ours = -10·log10 of it).

Non-finite values: an element where either side is NaN or ±Inf is counted (``nonfinite_ref`` /
``nonfinite_test``) and left out of every sum, so one overflowing element does not turn a whole
layer's metric into NaN while the count still reports it. A sample with no finite element is left out
of the per-sample statistics. An accumulator that has seen no finite element reports NaN.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
SQNR_CAP_DB = 120.0
"""Where an infinite SQNR (no error) is capped when figures are compared or subtracted (a drop in dB)."""

_BLOCK = 1 << 18
"""Elements per block when walking a batch: float64 temporaries of 2 MiB stay in cache."""


def channel_axis(rank: int, conv_like: bool) -> int:
    """The channel axis of a tensor, as CONTRACT.md fixes it.

    Axis 1 for rank >= 3 tensors produced by Conv-like ops (NCHW), the last axis otherwise
    ([B, T, C] sequences, [B, C] Gemm outputs).
    """
    if rank < 1:
        raise ValueError(f"a rank-{rank} tensor has no channel axis")
    if conv_like and rank >= 3:
        return 1
    return rank - 1


def cosine_from_sums(sxy: F64 | float, sxx: F64 | float, syy: F64 | float) -> F64:
    """Cosine from the three sums, with the contract's zero rules (vectorised over arrays of sums)."""
    sxy_a, sxx_a, syy_a = (np.asarray(v, dtype=np.float64) for v in (sxy, sxx, syy))
    with np.errstate(over="ignore", under="ignore"):
        prod = sxx_a * syy_a
    # √(Σx²·Σy²) is exact for identical inputs (cosine exactly 1); split the root only when the
    # product overflows or underflows float64.
    denom = np.where(np.isfinite(prod) & (prod > 0), np.sqrt(prod), np.sqrt(sxx_a) * np.sqrt(syy_a))
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = np.where(denom > 0, sxy_a / np.where(denom > 0, denom, 1.0), 0.0)
    both_zero = (sxx_a == 0) & (syy_a == 0)
    # Rounding can push |Σxy| a hair above √(Σx²Σy²); a cosine is never outside [-1, 1].
    return np.asarray(np.clip(np.where(both_zero, 1.0, cos), -1.0, 1.0), dtype=np.float64)


def sqnr_db_from_sums(sxx: F64 | float, sdd: F64 | float) -> F64:
    """SQNR in dB from Σx² and Σ(x−y)²: inf when the error is zero, -inf when only the signal is."""
    sxx_a = np.asarray(sxx, dtype=np.float64)
    sdd_a = np.asarray(sdd, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(sdd_a > 0, sxx_a / np.where(sdd_a > 0, sdd_a, 1.0), np.inf)
        return np.asarray(10.0 * np.log10(ratio), dtype=np.float64)


def leave_one_out_cosine(sxy: F64, sxx: F64, syy: F64) -> F64:
    """Pooled cosine of the set with sample i left out, for every i: the jackknife replicates.

    Arguments are per-sample sums (one value per sample). Replicate i is
    (Σxy − sxy_i) / √((Σx² − sxx_i)(Σy² − syy_i)), with `cosine_from_sums`' zero rules; NaN everywhere
    when any sum is not finite (a sample the accumulator would leave out makes the replicates of the
    others describe a different set).
    """
    sxy_a, sxx_a, syy_a = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (sxy, sxx, syy))
    if not (np.isfinite(sxy_a).all() and np.isfinite(sxx_a).all() and np.isfinite(syy_a).all()):
        return np.full(sxy_a.shape, np.nan)
    return cosine_from_sums(sxy_a.sum() - sxy_a, sxx_a.sum() - sxx_a, syy_a.sum() - syy_a)


def jackknife_stderr(replicates: F64) -> float:
    """Jackknife standard error of a statistic from its leave-one-out replicates θ₋ᵢ (n of them).

    SE = √((n−1)/n · Σ(θ₋ᵢ − θ̄)²), θ̄ the replicates' mean (Efron & Tibshirani, ch. 11). It works for
    statistics that are not means of per-sample terms, like a pooled cosine, and for a difference of two
    statistics on the same samples when fed the differences of their replicates (paired). NaN for fewer
    than two samples or non-finite replicates. Smaller is a more settled figure.
    """
    r = np.asarray(replicates, dtype=np.float64).reshape(-1)
    n = r.size
    if n < 2 or not np.isfinite(r).all():
        return math.nan
    return float(math.sqrt((n - 1) / n * float(np.sum((r - r.mean()) ** 2))))


def _as_float64(a: np.ndarray) -> F64:
    """Integer and half tensors are compared in float64 (int64 token ids do not fit float32)."""
    return np.asarray(a, dtype=np.float64)


def _per_sample(a: np.ndarray) -> np.ndarray:
    """View with samples on axis 0 and every other element flattened on axis 1."""
    n = a.shape[0] if a.ndim >= 1 else 1
    return a.reshape(n, -1)


def _finite_pair(ref: F64, test: F64) -> tuple[F64, F64, int, int, NDArray[np.bool_] | None]:
    """Zero out elements where either side is non-finite; return the mask only when one exists."""
    ref_ok = np.isfinite(ref)
    test_ok = np.isfinite(test)
    bad_ref = int(ref.size - np.count_nonzero(ref_ok))
    bad_test = int(test.size - np.count_nonzero(test_ok))
    if bad_ref == 0 and bad_test == 0:
        return ref, test, 0, 0, None
    ok = ref_ok & test_ok
    return np.where(ok, ref, 0.0), np.where(ok, test, 0.0), bad_ref, bad_test, ok


class ErrorAccumulator:
    """Pooled and per-sample error statistics for one (reference, test) tensor pair, fed in batches."""

    def __init__(self) -> None:
        self.count = 0
        self.nonfinite_ref = 0
        self.nonfinite_test = 0
        self.overflow = 0
        """Elements of samples left out because their float32 sums overflowed although every value was
        finite (|x| > ~1.8e19, e.g. a float-min mask): not NaN/Inf in the data (see update_sums)."""
        self.samples = 0
        self._sxy = 0.0
        self._sxx = 0.0
        self._syy = 0.0
        self._sdd = 0.0
        self._max_abs = 0.0
        self._worst_cos = math.inf
        self._sum_cos = 0.0
        self._worst_sqnr = math.inf
        self.values_per_sample = 0
        """The most values one sample holds: at 1 (an [N, 1] score) a per-sample cosine is the sign
        agreement of two numbers (1 or 0), no figure, so the per-sample cosines are NaN."""

    def update(self, ref: np.ndarray, test: np.ndarray) -> None:
        """Add one batch; axis 0 is the sample axis. Shapes must match exactly.

        The batch is walked in column blocks of about ``_BLOCK`` elements so the float64 temporaries
        stay cache-sized whatever the tensor size (allocating them whole costs more than the math).
        """
        if np.shape(ref) != np.shape(test):
            raise ValueError(f"reference shape {np.shape(ref)} != test shape {np.shape(test)}")
        xs, ys = _per_sample(np.asarray(ref)), _per_sample(np.asarray(test))
        if xs.size == 0:
            return
        n, m = xs.shape
        self.values_per_sample = max(self.values_per_sample, m)
        sums = np.zeros((4, n), dtype=np.float64)  # Σxy, Σx², Σy², Σd² per sample
        counts = np.zeros(n, dtype=np.int64)
        step = max(1, _BLOCK // n)
        for start in range(0, m, step):
            self._add_block(xs[:, start : start + step], ys[:, start : start + step], sums, counts)
        self.count += int(counts.sum())
        self._sxy += float(sums[0].sum())
        self._sxx += float(sums[1].sum())
        self._syy += float(sums[2].sum())
        self._sdd += float(sums[3].sum())
        self._update_samples(sums[0], sums[1], sums[2], sums[3], counts > 0)

    def _add_block(self, ref: np.ndarray, test: np.ndarray, sums: F64, counts: NDArray[np.int64]) -> None:
        """Accumulate one [n, k] column block into the per-sample sums (in place)."""
        x, y, bad_ref, bad_test, ok = _finite_pair(_as_float64(ref), _as_float64(test))
        self.nonfinite_ref += bad_ref
        self.nonfinite_test += bad_test
        d = x - y
        sums[0] += np.einsum("ij,ij->i", x, y)
        sums[1] += np.einsum("ij,ij->i", x, x)
        sums[2] += np.einsum("ij,ij->i", y, y)
        sums[3] += np.einsum("ij,ij->i", d, d)
        counts += x.shape[1] if ok is None else np.count_nonzero(ok, axis=1)
        if d.size:
            self._max_abs = max(self._max_abs, float(np.abs(d).max()))

    def update_sums(
        self,
        sxy: np.ndarray,
        sxx: np.ndarray,
        syy: np.ndarray,
        sdd: np.ndarray,
        max_abs: np.ndarray,
        elements_per_sample: int,
    ) -> None:
        """Add per-sample sums computed elsewhere (e.g. reductions inside the onnxruntime graph).

        Each argument holds one value per sample. The element-wise NaN exclusion of `update` is not
        possible from sums: a sample whose sums are not all finite is left out whole. When none of Σx²,
        Σy², Σd² is NaN and max|x−y| is finite, every value was finite and only a float32 sum of squares overflowed
        (NaN or ±Inf in x or y would make x−y or a sum NaN/Inf): those elements count as `overflow`.
        Otherwise they count as non-finite (reference side when Σx² is non-finite, else the test side).
        """
        self.values_per_sample = max(self.values_per_sample, int(elements_per_sample))
        arrays = [np.asarray(a, dtype=np.float64).reshape(-1) for a in (sxy, sxx, syy, sdd, max_abs)]
        a_xy, a_xx, a_yy, a_dd, a_max = arrays
        ok = np.isfinite(a_xy) & np.isfinite(a_xx) & np.isfinite(a_yy) & np.isfinite(a_dd) & np.isfinite(a_max)
        no_nan = ~(np.isnan(a_xx) | np.isnan(a_yy) | np.isnan(a_dd))  # Σxy is derived: inf − inf is no proof
        overflow = ~ok & no_nan & np.isfinite(a_max)
        self.overflow += int(overflow.sum()) * elements_per_sample
        bad = ~ok & ~overflow
        if bad.any():
            ref_bad = bad & ~np.isfinite(a_xx)
            self.nonfinite_ref += int(ref_bad.sum()) * elements_per_sample
            self.nonfinite_test += int((bad & ~ref_bad).sum()) * elements_per_sample
        if not ok.any():
            return
        self.count += int(ok.sum()) * elements_per_sample
        self._sxy += float(a_xy[ok].sum())
        self._sxx += float(a_xx[ok].sum())
        self._syy += float(a_yy[ok].sum())
        self._sdd += float(a_dd[ok].sum())
        self._max_abs = max(self._max_abs, float(a_max[ok].max()))
        self._update_samples(a_xy, a_xx, a_yy, a_dd, ok)

    def _update_samples(self, sxy: F64, sxx: F64, syy: F64, sdd: F64, seen: NDArray[np.bool_]) -> None:
        """Per-sample cosine / SQNR; samples without a finite element do not count."""
        if not seen.any():
            return
        cos = cosine_from_sums(sxy[seen], sxx[seen], syy[seen])
        sqnr = sqnr_db_from_sums(sxx[seen], sdd[seen])
        self.samples += int(cos.size)
        self._sum_cos += float(cos.sum())
        self._worst_cos = min(self._worst_cos, float(cos.min()))
        self._worst_sqnr = min(self._worst_sqnr, float(sqnr.min()))

    def merge(self, other: ErrorAccumulator) -> None:
        """Add another accumulator's samples (a disjoint shard, `--workers`): every figure is a sum,
        a count, a max or a min, so the merge equals one pass over both up to float64 rounding."""
        self.count += other.count
        self.nonfinite_ref += other.nonfinite_ref
        self.nonfinite_test += other.nonfinite_test
        self.overflow += other.overflow
        self.samples += other.samples
        self.values_per_sample = max(self.values_per_sample, other.values_per_sample)
        self._sxy += other._sxy
        self._sxx += other._sxx
        self._syy += other._syy
        self._sdd += other._sdd
        self._max_abs = max(self._max_abs, other._max_abs)
        self._worst_cos = min(self._worst_cos, other._worst_cos)
        self._sum_cos += other._sum_cos
        self._worst_sqnr = min(self._worst_sqnr, other._worst_sqnr)

    def _or_nan(self, value: float) -> float:
        return value if self.count > 0 else math.nan

    @property
    def cosine(self) -> float:
        return self._or_nan(float(cosine_from_sums(self._sxy, self._sxx, self._syy)))

    @property
    def sqnr_db(self) -> float:
        return self._or_nan(float(sqnr_db_from_sums(self._sxx, self._sdd)))

    @property
    def mse(self) -> float:
        return self._sdd / self.count if self.count else math.nan

    @property
    def max_abs(self) -> float:
        return self._or_nan(self._max_abs)

    @property
    def rel_l2(self) -> float:
        if self._sdd == 0:
            return self._or_nan(0.0)
        if self._sxx == 0:
            return math.inf
        return math.sqrt(self._sdd) / math.sqrt(self._sxx)

    def _per_sample_cosines(self) -> bool:
        return bool(self.samples) and self.values_per_sample != 1

    @property
    def worst_sample_cosine(self) -> float:
        return self._worst_cos if self._per_sample_cosines() else math.nan

    @property
    def mean_sample_cosine(self) -> float:
        return self._sum_cos / self.samples if self._per_sample_cosines() else math.nan

    @property
    def worst_sample_sqnr_db(self) -> float:
        return self._worst_sqnr if self.samples else math.nan

    def as_dict(self, prefix: str = "") -> dict[str, float]:
        """Every metric under its CSV column name (``prefix`` + name, e.g. ``cumulative_cosine``)."""
        values = {
            "cosine": self.cosine,
            "sqnr_db": self.sqnr_db,
            "mse": self.mse,
            "max_abs": self.max_abs,
            "rel_l2": self.rel_l2,
            "worst_sample_cosine": self.worst_sample_cosine,
            "mean_sample_cosine": self.mean_sample_cosine,
            "worst_sample_sqnr_db": self.worst_sample_sqnr_db,
            "count": float(self.count),
            "nonfinite_ref": float(self.nonfinite_ref),
            "nonfinite_test": float(self.nonfinite_test),
        }
        return {prefix + k: v for k, v in values.items()}


def _normalize_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"channel axis {axis} out of range for a rank-{ndim} tensor")
    return axis % ndim


class ChannelErrorAccumulator:
    """Per-channel Σx² and Σ(x−y)², giving a per-channel SQNR (the worst channel hides in a pooled one)."""

    def __init__(self, axis: int) -> None:
        self.axis = axis
        self._sxx: F64 | None = None
        self._sdd: F64 | None = None

    @property
    def channels(self) -> int:
        return 0 if self._sxx is None else int(self._sxx.size)

    def update(self, ref: np.ndarray, test: np.ndarray) -> None:
        """Add one batch; non-finite pairs are skipped as in :class:`ErrorAccumulator`."""
        if np.shape(ref) != np.shape(test):
            raise ValueError(f"reference shape {np.shape(ref)} != test shape {np.shape(test)}")
        x, y, _, _, _ = _finite_pair(_as_float64(ref), _as_float64(test))
        axis = _normalize_axis(self.axis, x.ndim)
        others = tuple(i for i in range(x.ndim) if i != axis)
        d = x - y
        sxx = np.sum(x * x, axis=others)
        sdd = np.sum(d * d, axis=others)
        if self._sxx is None or self._sdd is None:
            self._sxx, self._sdd = sxx, sdd
            return
        if sxx.shape != self._sxx.shape:
            raise ValueError(f"channel count changed from {self._sxx.size} to {sxx.size}")
        self._sxx += sxx
        self._sdd += sdd

    def update_sums(self, sxx: np.ndarray, sdd: np.ndarray) -> None:
        """Add per-channel Σx² and Σ(x−y)² computed elsewhere (reductions inside the graph)."""
        a_xx = np.asarray(sxx, dtype=np.float64).reshape(-1)
        a_dd = np.asarray(sdd, dtype=np.float64).reshape(-1)
        ok = np.isfinite(a_xx) & np.isfinite(a_dd)
        a_xx, a_dd = np.where(ok, a_xx, 0.0), np.where(ok, a_dd, 0.0)
        if self._sxx is None or self._sdd is None:
            self._sxx, self._sdd = a_xx.copy(), a_dd.copy()
            return
        if a_xx.shape != self._sxx.shape:
            raise ValueError(f"channel count changed from {self._sxx.size} to {a_xx.size}")
        self._sxx += a_xx
        self._sdd += a_dd

    def merge(self, other: ChannelErrorAccumulator) -> None:
        """Add another shard's per-channel sums (`--workers`)."""
        if other._sxx is None or other._sdd is None:
            return
        self.update_sums(other._sxx, other._sdd)

    def per_channel_sqnr_db(self) -> F64:
        """SQNR per channel (inf for error-free channels, -inf for all-zero reference with error)."""
        if self._sxx is None or self._sdd is None:
            return np.zeros(0, dtype=np.float64)
        return sqnr_db_from_sums(self._sxx, self._sdd)

    @property
    def worst_channel_sqnr_db(self) -> float:
        """Minimum SQNR over channels that carry signal (Σx² > 0); NaN when none does."""
        if self._sxx is None:
            return math.nan
        live = self._sxx > 0
        if not live.any():
            return math.nan
        return float(self.per_channel_sqnr_db()[live].min())


def _class_scores(a: np.ndarray) -> np.ndarray:
    """[N, classes] or [N, classes, 1, 1] -> [N, classes]; a rank-1 tensor is one sample."""
    arr = np.asarray(a)
    if arr.ndim == 1:
        return arr.reshape(1, -1)
    if arr.ndim >= 2 and all(s == 1 for s in arr.shape[2:]):
        return arr.reshape(arr.shape[0], arr.shape[1])
    raise ValueError(f"expected classifier scores [N, classes] or [N, classes, 1, 1], got {arr.shape}")


def looks_like_classifier(shape: Sequence[int | str | None]) -> bool:
    """True for [N, C] or [N, C, 1, 1] with C > 1 fixed: the shapes top-1 agreement applies to."""
    if len(shape) < 2 or not all(s == 1 for s in shape[2:]):
        return False
    classes = shape[1]
    return isinstance(classes, int) and classes > 1


class Top1Accumulator:
    """Argmax agreement between reference and test scores, and accuracy against labels when known."""

    def __init__(self) -> None:
        self.samples = 0
        self._agree = 0
        self.labelled = 0
        self._correct = 0
        self._ref_correct = 0

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None = None) -> None:
        """Add one batch; ``labels`` (one per sample, None = unknown) feed the accuracy figures."""
        if np.shape(ref) != np.shape(test):
            raise ValueError(f"reference shape {np.shape(ref)} != test shape {np.shape(test)}")
        ref_top = np.argmax(_class_scores(ref), axis=1)
        test_top = np.argmax(_class_scores(test), axis=1)
        self.samples += int(ref_top.size)
        self._agree += int(np.count_nonzero(ref_top == test_top))
        if labels is None:
            return
        if len(labels) != ref_top.size:
            raise ValueError(f"{len(labels)} labels for {ref_top.size} samples")
        known = np.array([lab is not None for lab in labels], dtype=bool)
        truth = np.array([-1 if lab is None else int(lab) for lab in labels], dtype=np.int64)
        self.labelled += int(known.sum())
        self._correct += int(np.count_nonzero(known & (test_top == truth)))
        self._ref_correct += int(np.count_nonzero(known & (ref_top == truth)))

    def merge(self, other: Top1Accumulator) -> None:
        """Add another shard's counts (`--workers`)."""
        self.samples += other.samples
        self._agree += other._agree
        self.labelled += other.labelled
        self._correct += other._correct
        self._ref_correct += other._ref_correct

    @property
    def agreement(self) -> float:
        return self._agree / self.samples if self.samples else math.nan

    @property
    def accuracy(self) -> float | None:
        """Top-1 accuracy of the test (quantized) model over labelled samples; None without labels."""
        return self._correct / self.labelled if self.labelled else None

    @property
    def ref_accuracy(self) -> float | None:
        """Top-1 accuracy of the FP32 reference over the same labelled samples."""
        return self._ref_correct / self.labelled if self.labelled else None


def summarize(ref: np.ndarray, test: np.ndarray) -> dict[str, float]:
    """One-shot metrics for a single batch (same keys as :meth:`ErrorAccumulator.as_dict`)."""
    acc = ErrorAccumulator()
    acc.update(ref, test)
    return acc.as_dict()
