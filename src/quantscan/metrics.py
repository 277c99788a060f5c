"""Streaming comparison of an FP32 reference tensor with its quantized counterpart.

Pure numpy. Every accumulator keeps float64 running sums only, so memory does not grow with the
number of samples. Sums across batches and shards are compensated (sums.CompensatedSum), so feeding
batches one at a time, or merging shards of them in any split, gives the same float64 bytes.

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

from quantscan.sums import CompensatedSum

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
        self._sxy = CompensatedSum()
        self._sxx = CompensatedSum()
        self._syy = CompensatedSum()
        self._sdd = CompensatedSum()
        self._max_abs = 0.0
        self._worst_cos = math.inf
        self._sum_cos = CompensatedSum()
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
        self._add_pooled(sums[0], sums[1], sums[2], sums[3])
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
        self._add_pooled(a_xy[ok], a_xx[ok], a_yy[ok], a_dd[ok])
        self._max_abs = max(self._max_abs, float(a_max[ok].max()))
        self._update_samples(a_xy, a_xx, a_yy, a_dd, ok)

    def _add_pooled(self, sxy: F64, sxx: F64, syy: F64, sdd: F64) -> None:
        """Add a batch's per-sample sums to the pooled ones, one term per sample: the batch size and the
        shard split change with `--workers`, a sample's own sums do not, and the compensated sums make
        the order in which the terms arrive not matter."""
        for pooled, per_sample in ((self._sxy, sxy), (self._sxx, sxx), (self._syy, syy), (self._sdd, sdd)):
            pooled.add_all(per_sample)

    def _update_samples(self, sxy: F64, sxx: F64, syy: F64, sdd: F64, seen: NDArray[np.bool_]) -> None:
        """Per-sample cosine / SQNR; samples without a finite element do not count."""
        if not seen.any():
            return
        cos = cosine_from_sums(sxy[seen], sxx[seen], syy[seen])
        sqnr = sqnr_db_from_sums(sxx[seen], sdd[seen])
        self.samples += int(cos.size)
        self._sum_cos.add_all(cos)
        self._worst_cos = min(self._worst_cos, float(cos.min()))
        self._worst_sqnr = min(self._worst_sqnr, float(sqnr.min()))

    def merge(self, other: ErrorAccumulator) -> None:
        """Add another accumulator's samples (a disjoint shard, `--workers`): every figure is a sum,
        a count, a max or a min, and the sums are compensated, so the merge gives the bytes one pass over
        both gives, whatever the split."""
        self.count += other.count
        self.nonfinite_ref += other.nonfinite_ref
        self.nonfinite_test += other.nonfinite_test
        self.overflow += other.overflow
        self.samples += other.samples
        self.values_per_sample = max(self.values_per_sample, other.values_per_sample)
        for mine, theirs in ((self._sxy, other._sxy), (self._sxx, other._sxx), (self._syy, other._syy),
                             (self._sdd, other._sdd)):
            mine.merge(theirs)
        self._max_abs = max(self._max_abs, other._max_abs)
        self._worst_cos = min(self._worst_cos, other._worst_cos)
        self._sum_cos.merge(other._sum_cos)
        self._worst_sqnr = min(self._worst_sqnr, other._worst_sqnr)

    def _or_nan(self, value: float) -> float:
        return value if self.count > 0 else math.nan

    @property
    def cosine(self) -> float:
        return self._or_nan(float(cosine_from_sums(self._sxy.value, self._sxx.value, self._syy.value)))

    @property
    def sqnr_db(self) -> float:
        return self._or_nan(float(sqnr_db_from_sums(self._sxx.value, self._sdd.value)))

    @property
    def mse(self) -> float:
        return self._sdd.value / self.count if self.count else math.nan

    @property
    def max_abs(self) -> float:
        return self._or_nan(self._max_abs)

    @property
    def rel_l2(self) -> float:
        sdd, sxx = self._sdd.value, self._sxx.value
        if sdd == 0:
            return self._or_nan(0.0)
        if sxx == 0:
            return math.inf
        return math.sqrt(sdd) / math.sqrt(sxx)

    def _per_sample_cosines(self) -> bool:
        return bool(self.samples) and self.values_per_sample != 1

    @property
    def worst_sample_cosine(self) -> float:
        return self._worst_cos if self._per_sample_cosines() else math.nan

    @property
    def mean_sample_cosine(self) -> float:
        return self._sum_cos.value / self.samples if self._per_sample_cosines() else math.nan

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
        self._sums: tuple[CompensatedSum, CompensatedSum] | None = None
        """Σx² and Σd² per channel, compensated so that shards merge to the same bytes in any split."""

    @property
    def channels(self) -> int:
        return 0 if self._sums is None else int(self._sums[0].hi.size)

    def update(self, ref: np.ndarray, test: np.ndarray) -> None:
        """Add one batch; non-finite pairs are skipped as in :class:`ErrorAccumulator`."""
        if np.shape(ref) != np.shape(test):
            raise ValueError(f"reference shape {np.shape(ref)} != test shape {np.shape(test)}")
        x, y, _, _, _ = _finite_pair(_as_float64(ref), _as_float64(test))
        axis = _normalize_axis(self.axis, x.ndim)
        d = x - y
        if axis == 0 or x.ndim < 2:  # the channels are the samples: one term for the batch
            others = tuple(i for i in range(x.ndim) if i != axis)
            self._add(np.sum(x * x, axis=others)[None], np.sum(d * d, axis=others)[None])
            return
        others = tuple(i for i in range(1, x.ndim) if i != axis)  # one row of channel sums per sample
        self._add(np.sum(x * x, axis=others), np.sum(d * d, axis=others))

    def update_sums(self, sxx: np.ndarray, sdd: np.ndarray) -> None:
        """Add per-channel Σx² and Σ(x−y)² computed elsewhere (reductions inside the graph): [C] for the
        batch, or [N, C], one row per sample (then the batching does not change the bytes)."""
        a_xx = np.asarray(sxx, dtype=np.float64)
        a_dd = np.asarray(sdd, dtype=np.float64)
        rows = a_xx.shape[0] if a_xx.ndim == 2 else 1
        a_xx, a_dd = a_xx.reshape(rows, -1), a_dd.reshape(rows, -1)
        ok = np.isfinite(a_xx) & np.isfinite(a_dd)
        self._add(np.where(ok, a_xx, 0.0), np.where(ok, a_dd, 0.0))

    def _add(self, sxx: F64, sdd: F64) -> None:
        """Add [terms, C] rows of per-channel sums."""
        if self._sums is None:
            self._sums = (CompensatedSum(np.zeros(sxx.shape[1])), CompensatedSum(np.zeros(sdd.shape[1])))
        if sxx.shape[1:] != self._sums[0].hi.shape:
            raise ValueError(f"channel count changed from {self._sums[0].hi.size} to {sxx.shape[1]}")
        self._sums[0].add_all(sxx)
        self._sums[1].add_all(sdd)

    def merge(self, other: ChannelErrorAccumulator) -> None:
        """Add another shard's per-channel sums (`--workers`), exactly as its batches would have added."""
        if other._sums is None:
            return
        if self._sums is None:
            self._sums = (CompensatedSum(other._sums[0].hi.copy()), CompensatedSum(other._sums[1].hi.copy()))
            self._sums[0].lo, self._sums[1].lo = other._sums[0].lo.copy(), other._sums[1].lo.copy()
            return
        self._sums[0].merge(other._sums[0])
        self._sums[1].merge(other._sums[1])

    def per_channel_sqnr_db(self) -> F64:
        """SQNR per channel (inf for error-free channels, -inf for all-zero reference with error)."""
        if self._sums is None:
            return np.zeros(0, dtype=np.float64)
        return sqnr_db_from_sums(self._sums[0].value, self._sums[1].value)

    @property
    def worst_channel_sqnr_db(self) -> float:
        """Minimum SQNR over channels that carry signal (Σx² > 0); NaN when none does."""
        if self._sums is None:
            return math.nan
        live = self._sums[0].value > 0
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

def pooled_cosine(sums: list[float]) -> float:
    """The cosine of the pooled sums (xy, xx, yy): 1 when both are all zeros, 0 when one is."""
    sxy, sxx, syy = sums[0], sums[1], sums[2]
    if sxx > 0 and syy > 0:
        return sxy / math.sqrt(sxx * syy)
    return 1.0 if sxx == syy == 0 else 0.0


def subset_cosine(sums: dict[str, list[list[float]]], samples: list[int]) -> float:
    """The worst output's pooled cosine over `samples` only (indices into each output's rows): the
    contract's metric on the samples a claim was measured on. NaN when no output or no sample is left."""
    values = []
    for rows in sums.values():
        picked = [rows[i] for i in samples if 0 <= i < len(rows)]
        if picked and len(picked) == len(samples):
            values.append(pooled_cosine(list(np.sum(np.asarray(picked, dtype=np.float64), axis=0))))
    return min(values) if values else math.nan
