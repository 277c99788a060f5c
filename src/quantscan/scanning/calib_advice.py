"""Is the calibration set big enough, and which samples decide the scales: pure numpy over per-sample ranges.

Why per-sample ranges: a min/max scale is a function of the calibrated range alone, and the range of any
subset of samples is the min/max of its samples' own ranges. Pass 1 keeps one (min, max) per sample
and calibrated tensor (`SampleRanges`, filled by scanning.calibrate for minmax calibration only: the
histogram methods' ranges are not a min/max of per-sample figures), so every subset below (bootstrap
draws, leave-one-out, the `--pick` greedy) costs no network pass.

The statistic (calib_advice.csv): for a subset size n, `draws` bootstrap draws of n samples (with
replacement, seeded) give each site that many scales; the site's relative spread is
(p95 - p5) / median of them; the set's spread at n is the 90th percentile over sites. Scales come from
`quant.activation_qparams` with the run's scheme, the function the plan uses (in its array form,
`quant.activation_scales`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quantscan import quant
from quantscan.errors import UsageError

COSINE_MARGIN = 0.001
"""How close to the full set's all-int8 cosine a subset size's mean cosine must come to count as enough."""
SPREAD_TOLERANCE = 0.05
"""The spread (p90 over sites) under which scales count as settled: 5% of a scale is ~6 of 127 codes."""


@dataclass
class SampleRanges:
    """Per sample (rows, file order) and calibrated tensor (columns): the finite min and max it reached.

    NaN where the sample had no finite value, or where a batch of several samples could not be split
    per sample (a tensor whose axis 0 is not the sample axis); such tensors are left out of the advice."""

    tensors: list[str]
    mins: np.ndarray
    maxs: np.ndarray

    @property
    def n_samples(self) -> int:
        return int(self.mins.shape[0])

    @staticmethod
    def concat(shards: Sequence[SampleRanges]) -> SampleRanges:
        """Disjoint consecutive shards (`--workers`, in shard order) as one set: the rows stack, exact."""
        return SampleRanges(list(shards[0].tensors), np.concatenate([s.mins for s in shards]),
                            np.concatenate([s.maxs for s in shards]))

    def usable(self) -> SampleRanges:
        """Only the tensors with a finite range on every sample (see the class docstring)."""
        keep = np.isfinite(self.mins).all(axis=0) & np.isfinite(self.maxs).all(axis=0)
        return SampleRanges([t for t, k in zip(self.tensors, keep, strict=True) if k],
                            self.mins[:, keep], self.maxs[:, keep])


def per_sample_extremes(lo: np.ndarray, hi: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """One batch's in-graph partial min/max ([samples, ...]) -> (min, max) per sample over finite values;
    NaN rows when axis 0 is not `count` samples long (not attributable) or nothing was finite."""
    if lo.ndim == 0 or lo.shape[0] != count:
        if count == 1:
            lo, hi = lo.reshape(1, -1), hi.reshape(1, -1)
        else:
            return np.full(count, np.nan, np.float32), np.full(count, np.nan, np.float32)
    lo2 = np.where(np.isfinite(lo), lo, np.inf).reshape(count, -1).min(axis=1)
    hi2 = np.where(np.isfinite(hi), hi, -np.inf).reshape(count, -1).max(axis=1)
    bad = ~(np.isfinite(lo2) & np.isfinite(hi2))
    return (np.where(bad, np.nan, lo2).astype(np.float32), np.where(bad, np.nan, hi2).astype(np.float32))


def scale_function(scheme: str) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Elementwise scale of ranges (lo, hi) under `scheme`: quant.activation_scales, the array form of
    quant.activation_qparams (the plan's function, tested equal), in float64 for the ratios below."""

    def scales(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        return quant.activation_scales(lo, hi, scheme).astype(np.float64)

    return scales


def relative_spread(scales: np.ndarray) -> np.ndarray:
    """Per site (columns), over draws (rows): (p95 - p5) / median of the scale."""
    p5, p50, p95 = np.percentile(scales, [5, 50, 95], axis=0)
    return np.asarray((p95 - p5) / p50)


def subset_scales(ranges: SampleRanges, subsets: np.ndarray, scheme: str) -> np.ndarray:
    """[draws, n] sample indices -> [draws, tensors] scales of each subset's range."""
    lo = ranges.mins[subsets].min(axis=1)
    hi = ranges.maxs[subsets].max(axis=1)
    return scale_function(scheme)(lo, hi)


def full_scales(ranges: SampleRanges, scheme: str) -> np.ndarray:
    """The scales the plan uses: each tensor's range over every sample."""
    return scale_function(scheme)(ranges.mins.min(axis=0), ranges.maxs.max(axis=0))


def default_sizes(n_samples: int) -> list[int]:
    """8, 16, 32, ... below the set's size, and the size itself."""
    sizes = []
    n = 8
    while n < n_samples:
        sizes.append(n)
        n *= 2
    return [*sizes, n_samples]


@dataclass(frozen=True)
class SpreadRow:
    """How much the scales move between bootstrap subsets of n samples (one calib_advice.csv row)."""

    n: int
    draws: int
    spread_p90: float
    """90th percentile over sites of the relative spread (p95 - p5) / median of the site's scale."""
    spread_median: float
    error_p90: float
    """90th percentile over sites of the median |scale(subset) - scale(full set)| / scale(full set)."""
    worst_site: str
    worst_spread: float
    cosine_draws: int = 0
    """Bootstrap subsets of n whose all-int8 output cosine was measured (one evaluation pass each)."""
    cosine_mean: float | None = None
    cosine_min: float | None = None


def stability(ranges: SampleRanges, scheme: str, sizes: Sequence[int] | None = None, draws: int = 200,
              seed: int = 0) -> list[SpreadRow]:
    """Bootstrap spread of the scales at each subset size (draws with replacement, seeded)."""
    rng = np.random.default_rng(seed)
    full = full_scales(ranges, scheme)
    rows = []
    for n in sizes or default_sizes(ranges.n_samples):
        scales = subset_scales(ranges, rng.integers(0, ranges.n_samples, size=(draws, n)), scheme)
        spread = relative_spread(scales)
        error = np.median(np.abs(scales - full) / full, axis=0)
        worst = int(np.argmax(spread))
        rows.append(SpreadRow(n, draws, float(np.percentile(spread, 90)), float(np.median(spread)),
                              float(np.percentile(error, 90)), ranges.tensors[worst], float(spread[worst])))
    return rows


def verdict(rows: Sequence[SpreadRow], tolerance: float = SPREAD_TOLERANCE) -> str:
    """"scales settle within X% at n samples; more buy nothing", or "still moving at N: add data"."""
    settled = None
    for row in reversed(rows):
        if row.spread_p90 > tolerance:
            break
        settled = row
    last = rows[-1]
    if settled is None:
        return (f"scales still moving at {last.n} samples (spread {last.spread_p90:.1%} > {tolerance:.0%}, "
                f"worst {last.worst_site}): add data")
    if settled is last and len(rows) > 1:
        return f"scales settle within {settled.spread_p90:.1%} only at the full {last.n} samples: keep them all"
    return f"scales settle within {settled.spread_p90:.1%} at {settled.n} samples; more buy nothing"


@dataclass(frozen=True)
class Decider:
    """A sample that alone sets the extreme range of `k` sites (leaving it out shrinks their scales)."""

    sample: int
    name: str
    sites: tuple[str, ...]
    max_drop: float
    """The largest relative scale drop over those sites when the sample is left out."""
    cosine_without: float | None = None
    """All-int8 output cosine on the evaluation set when calibrated without this sample (None: not measured)."""

    @property
    def k(self) -> int:
        return len(self.sites)

    def advice(self, cosine_full: float | None) -> str:
        """droppable (an outlier: the cosine does not fall without it) or keep (data that needs its range)."""
        if cosine_full is None or self.cosine_without is None:
            return ""
        return ("droppable: the cosine does not fall without it" if self.cosine_without >= cosine_full
                else "keep: the cosine falls without it")


def deciders(ranges: SampleRanges, scheme: str, names: Sequence[str]) -> list[Decider]:
    """Leave-one-out per sample, from each tensor's two smallest minima and two largest maxima; most
    sites first. A tie for the extreme decides nothing (either sample alone still sets it)."""
    if ranges.n_samples < 2:
        return []
    order_lo = np.argsort(ranges.mins, axis=0, kind="stable")
    order_hi = np.argsort(-ranges.maxs, axis=0, kind="stable")
    cols = np.arange(len(ranges.tensors))
    lo1, lo2 = ranges.mins[order_lo[0], cols], ranges.mins[order_lo[1], cols]
    hi1, hi2 = ranges.maxs[order_hi[0], cols], ranges.maxs[order_hi[1], cols]
    rows = np.arange(ranges.n_samples)[:, None]
    lo_wo = np.where(rows == order_lo[0], lo2, lo1)
    hi_wo = np.where(rows == order_hi[0], hi2, hi1)
    full = full_scales(ranges, scheme)
    drop = 1.0 - scale_function(scheme)(lo_wo, hi_wo) / full
    found = []
    for i in range(ranges.n_samples):
        hit = np.flatnonzero(drop[i] > 0)
        if hit.size:
            sites = tuple(ranges.tensors[j] for j in hit[np.argsort(-drop[i, hit], kind="stable")])
            found.append(Decider(i, names[i], sites, float(drop[i, hit].max())))
    return sorted(found, key=lambda d: (-d.k, -d.max_drop, d.sample))


def pick(ranges: SampleRanges, scheme: str, n: int) -> list[int]:
    """The n samples whose scales best reproduce the full set's: greedy, each step adding the sample
    that most reduces the worst relative scale error over sites (the mean error breaks ties)."""
    full = full_scales(ranges, scheme)
    scales_of = scale_function(scheme)
    lo = np.full(len(ranges.tensors), np.inf, np.float32)
    hi = np.full(len(ranges.tensors), -np.inf, np.float32)
    chosen: list[int] = []
    for _ in range(min(n, ranges.n_samples)):
        cand_lo, cand_hi = np.minimum(lo, ranges.mins), np.maximum(hi, ranges.maxs)
        err = np.abs(scales_of(cand_lo, cand_hi) - full) / full
        worst, mean = err.max(axis=1), err.mean(axis=1)
        worst[chosen] = np.inf
        best = int(np.lexsort((np.arange(len(worst)), mean, worst))[0])
        chosen.append(best)
        lo, hi = cand_lo[best], cand_hi[best]
    return sorted(chosen)


def worst_error(ranges: SampleRanges, scheme: str, subset: Sequence[int]) -> float:
    """The worst relative scale error over sites of a subset against the full set."""
    scales = subset_scales(ranges, np.asarray([list(subset)]), scheme)[0]
    full = full_scales(ranges, scheme)
    return float(np.max(np.abs(scales - full) / full))


@dataclass
class CalibAdvice:
    """calib-advice's answer: spread against n, the deciding samples, the verdict, the `--pick` subset."""

    n_samples: int
    scheme: str
    tensors: int
    """Calibrated tensors the advice covers."""
    left_out: int
    """Calibrated tensors left out (a batch of several samples could not be split per sample)."""
    rows: list[SpreadRow]
    deciders: list[Decider]
    verdict: str
    picked: list[int]
    picked_names: list[str]
    picked_error: float | None
    """The picked subset's worst relative scale error over sites against the full set."""
    cosine_full: float | None = None
    """All-int8 output cosine on the evaluation set, calibrated on every sample (with the deciders' cosines)."""
    coverage: list[CoverageRow] | None = None
    """With a separate evaluation set: where its samples reach past the calibrated ranges."""

    def cosine_settles_at(self) -> int | None:
        """The smallest measured n from which every subset size's mean cosine is within COSINE_MARGIN of
        the full set's (None when not measured)."""
        if self.cosine_full is None or not self.rows or self.rows[0].cosine_mean is None:
            return None
        settled = None
        for row in reversed(self.rows):
            if row.cosine_mean is None or row.cosine_mean < self.cosine_full - COSINE_MARGIN:
                break
            settled = row.n
        return settled

    def summary_line(self) -> str:
        """One line: the verdict, the sample deciding most sites, the picked subset's fit."""
        line = f"calib-advice ({self.n_samples} samples, {self.tensors} calibrated tensors): {self.verdict}"
        enough = self.cosine_settles_at()
        if enough is not None:
            line += (f"; the all-int8 output cosine is within {COSINE_MARGIN} of the full set's from {enough} "
                     f"samples on (mean of {self.rows[0].cosine_draws} bootstrap subsets)")
        if self.deciders:
            top = self.deciders[0]
            line += f"; {top.name} alone sets the range of {top.k} site(s) (scale -{top.max_drop:.1%} without it"
            if top.cosine_without is not None and self.cosine_full is not None:
                line += (f", int8 cosine {self.cosine_full:.5f} -> {top.cosine_without:.5f}: "
                         f"{top.advice(self.cosine_full)}")
            line += ")"
        if self.coverage is not None:
            spots = [c for c in self.coverage if c.group == "all"]
            line += (f"; evaluation data past the calibrated range on {len(spots)} tensor(s)"
                     + (f", farthest {spots[0].reach:.0%} of the range on {spots[0].site}" if spots else ""))
        if self.picked_error is not None:
            line += f"; picked {len(self.picked)} reproduce the scales within {self.picked_error:.2%}"
        return line


def advise_run(ranges: SampleRanges | None, scheme: str, files: Sequence[Path], n_samples: int, method: str,
               pick_n: int | None = None, seed: int = 0) -> CalibAdvice:
    """`advise` for a scan's pass 1: samples named by their files (when one file each), bad requests refused."""
    if ranges is None:
        raise UsageError(f"calib-advice: expected --calib-method minmax (per-sample ranges), found {method}")
    if pick_n is not None and pick_n > n_samples:
        raise UsageError(f"--pick: expected at most the {n_samples} calibration samples, found {pick_n}")
    names = [f.name for f in files] if len(files) == n_samples else [f"sample {i}" for i in range(n_samples)]
    return advise(ranges, scheme, names, pick_n, seed=seed)


def advise(ranges: SampleRanges, scheme: str, names: Sequence[str], pick_n: int | None = None,
           sizes: Sequence[int] | None = None, draws: int = 200, seed: int = 0) -> CalibAdvice:
    """Everything calib_advice.csv says, from per-sample ranges alone (no network pass)."""
    usable = ranges.usable()
    if usable.n_samples == 0 or not usable.tensors:
        raise ValueError("no calibrated tensor has per-sample ranges to advise on")
    rows = stability(usable, scheme, sizes, draws, seed)
    chosen = pick(usable, scheme, pick_n) if pick_n else []
    return CalibAdvice(
        usable.n_samples, scheme, len(usable.tensors), len(ranges.tensors) - len(usable.tensors), rows,
        deciders(usable, scheme, names), verdict(rows), chosen, [names[i] for i in chosen],
        worst_error(usable, scheme, chosen) if chosen else None,
    )


ADVICE_COLUMNS = ("kind", "n", "draws", "spread_p90", "spread_median", "error_p90", "worst_site", "worst_spread",
                  "tolerance", "cosine_draws", "cosine_mean", "cosine_min",
                  "sample", "k", "max_drop", "cosine_with", "cosine_without", "advice", "sites",
                  "group", "samples", "samples_past", "reach")
"""calib_advice.csv: `kind` spread (one row per n), decider (one row per sample that alone sets a range) or
coverage (with `--eval`: per tensor in `sites` and label `group`, the evaluation samples past the range)."""


def advice_records(advice: CalibAdvice) -> list[dict[str, object]]:
    """calib_advice.csv's rows (ADVICE_COLUMNS), spread rows first, then the deciding samples."""
    records: list[dict[str, object]] = [
        {"kind": "spread", "n": r.n, "draws": r.draws, "spread_p90": r.spread_p90, "spread_median": r.spread_median,
         "error_p90": r.error_p90, "worst_site": r.worst_site, "worst_spread": r.worst_spread,
         "tolerance": SPREAD_TOLERANCE, "cosine_draws": r.cosine_draws, "cosine_mean": r.cosine_mean,
         "cosine_min": r.cosine_min} for r in advice.rows]
    records += [{"kind": "decider", "sample": d.name, "k": d.k, "max_drop": d.max_drop,
                 "cosine_with": advice.cosine_full if d.cosine_without is not None else None,
                 "cosine_without": d.cosine_without, "advice": d.advice(advice.cosine_full),
                 "sites": " ".join(d.sites)} for d in advice.deciders]
    records += [{"kind": "coverage", "sites": c.site, "group": c.group, "samples": c.samples,
                 "samples_past": c.samples_past, "reach": c.reach} for c in advice.coverage or []]
    return [{c: rec.get(c) for c in ADVICE_COLUMNS} for rec in records]


def advice_markdown(advice: CalibAdvice, deciders_shown: int = 5) -> str:
    """summary.md's calibration-set section (`scan --calib-advice`): the recommendation line first."""
    lines = ["", "## Calibration set (calib_advice.csv)", "", f"**{advice.verdict}.**", "",
             f"Scale spread = 90th percentile over the {advice.tensors} calibrated tensors of (p95 - p5) / median "
             f"of the tensor's scale over {advice.rows[0].draws} bootstrap draws of n samples"
             + (f"; {advice.left_out} tensor(s) left out (not split per sample)." if advice.left_out else "."),
             "", "| n | spread p90 | spread median | error vs full set p90 | most moving tensor | all-int8 cosine |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r.n} | {r.spread_p90:.1%} | {r.spread_median:.1%} | {r.error_p90:.1%} | `{r.worst_site}` "
              f"({r.worst_spread:.1%}) |" + (f" {r.cosine_mean:.5f} (min {r.cosine_min:.5f}, {r.cosine_draws} draws) |"
                                           if r.cosine_mean is not None and r.cosine_min is not None else " – |")
              for r in advice.rows]
    if advice.deciders:
        lines += ["", "Samples that alone set a tensor's range (leaving one out shrinks those scales):", ""]
        lines += [_decider_line(d, advice.cosine_full) for d in advice.deciders[:deciders_shown]]
    if advice.coverage is not None:
        lines += ["", "Evaluation data past the calibrated quantizer range (reach: the farthest value past it, "
                  "as a fraction of the range's width):", ""]
        lines += [f"- `{c.site}` ({c.group}): {c.samples_past} of {c.samples} evaluation samples, reach {c.reach:.1%}"
                  for c in advice.coverage[:deciders_shown]] or ["- none: every evaluation value is inside"]
    return "\n".join(lines) + "\n"


def _decider_line(d: Decider, cosine_full: float | None) -> str:
    line = f"- `{d.name}`: {d.k} tensor(s), scale -{d.max_drop:.1%} at most without it"
    if d.cosine_without is not None and cosine_full is not None:
        line += f"; int8 cosine {cosine_full:.5f} with it, {d.cosine_without:.5f} without: {d.advice(cosine_full)}"
    return line


UNLABELLED = "(unlabelled)"
"""The coverage group of evaluation samples without a label, in a set where others have one."""


@dataclass(frozen=True)
class CoverageRow:
    """How far one group of evaluation samples reaches past one tensor's quantizer range."""

    site: str
    group: str
    """A class name from the evaluation set's labels, UNLABELLED, or "all"."""
    samples: int
    samples_past: int
    """Evaluation samples of the group with a value outside the tensor's quantizer range."""
    reach: float
    """The farthest such value past the range, as a fraction of the range's width."""


def grid_ranges(lo: np.ndarray, hi: np.ndarray, scheme: str) -> tuple[np.ndarray, np.ndarray]:
    """The ranges the quantizer represents: widened to 0, and ±absmax under a symmetric scheme."""
    lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    if scheme in ("int8", "int16"):
        hi = np.maximum(-lo, hi)
        lo = -hi
    return lo, hi


def coverage(calib: SampleRanges, evals: SampleRanges, scheme: str,
             groups: Sequence[str | None] | None = None) -> list[CoverageRow]:
    """Per tensor and group (all, then each label), the evaluation samples past the calibrated quantizer
    range and how far; only rows where some sample goes past. Tensors need ranges in both sets."""
    usable = calib.usable()
    index = {t: j for j, t in enumerate(evals.tensors)}
    tensors = [t for t in usable.tensors if t in index and np.isfinite(evals.mins[:, index[t]]).all()
               and np.isfinite(evals.maxs[:, index[t]]).all()]
    cols_c = [usable.tensors.index(t) for t in tensors]
    cols_e = [index[t] for t in tensors]
    lo, hi = grid_ranges(usable.mins[:, cols_c].min(axis=0), usable.maxs[:, cols_c].max(axis=0), scheme)
    width = np.maximum(hi - lo, np.finfo(np.float32).tiny)
    past = np.maximum(np.maximum(evals.maxs[:, cols_e] - hi, lo - evals.mins[:, cols_e]), 0.0) / width
    labels = [UNLABELLED if g is None else g for g in groups] if groups is not None else [None] * evals.n_samples
    names = ["all", *sorted({g for g in labels if g is not None})]
    rows = []
    for j, tensor in enumerate(tensors):
        for name in names:
            mask = np.array([name == "all" or g == name for g in labels])
            hits = past[mask, j] > 0
            if hits.any():
                rows.append(CoverageRow(tensor, name, int(mask.sum()), int(hits.sum()), float(past[mask, j].max())))
    return sorted(rows, key=lambda r: (r.group != "all", -r.reach, r.site, r.group))
