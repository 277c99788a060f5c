"""Pass 2 of the scan: every error figure from one onnxruntime session per batch.

The analysis model (FP32 + cumulative QDQ copy + one isolated twin per site, see graph.py) returns
in-graph partial sums, per-channel sums and, for the first samples, the integer codes behind
hist.npz; the saved QDQ model runs beside it under ORT_ENABLE_ALL (the deployed-kernel check,
reported beside the fake-quant figures, never mixed in). All sums stream into float64
accumulators, so memory does not grow with the sample count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import onnx

from quantscan import graph as qgraph
from quantscan import metrics as qm
from quantscan import quant
from quantscan.calib import CalibSet
from quantscan.columns import Col
from quantscan.errors import ModelError
from quantscan.graph.schedule import interleave
from quantscan.graph.segments import balanced_cuts, split
from quantscan.model import PreparedModel
from quantscan.records import Headline, OutputMetrics
from quantscan.runner import Runner, SegmentedSession, Session
from quantscan.scanning.calibrate import channel_axis_for
from quantscan.scanning.options import EVERY_SAMPLE, ProgressFactory, ScanOptions, n_batches
from quantscan.scanning.probe import Probe, classifier_outputs, headline_outputs
from quantscan.scanning.sweep import Feeds, GraphHandoff, Values, open_session, sweep
from quantscan.scanning.tasks import task_accumulators, task_results
from quantscan.sites import Site
from quantscan.taskmetrics import TaskAccumulator, feed

WORST_SAMPLES = 5
"""How many evaluation samples summary.md and run.json list by output error (worst first)."""
HIST_BINS = 64
HIST_SAMPLES = 16
"""Value histograms (hist.npz) count the integer codes of the first samples only: a shape, not a sum."""


@dataclass
class Evaluation:
    """The accumulators of pass 2 (by tensor, by site index) and the per-output figures."""

    cumulative: dict[str, qm.ErrorAccumulator]
    isolated: dict[int, qm.ErrorAccumulator]
    act_channel: dict[int, qm.ChannelErrorAccumulator]
    hist: dict[str, np.ndarray]
    output_metrics: dict[str, OutputMetrics]
    deployed_metrics: dict[str, OutputMetrics]
    headline_outputs: list[str]
    warnings: list[str]
    n_samples: int
    task: dict[str, list[TaskAccumulator]] = field(default_factory=dict)
    """Task metric accumulators per headline output (FP32 vs the cumulative int8 output)."""
    clip_fraction: dict[str, float] = field(default_factory=dict)
    """Per quantized site output: the fraction of evaluation values outside its calibrated range."""
    worst_samples: list[dict[str, Any]] = field(default_factory=list)
    """The evaluation samples with the lowest headline-output cosine: index, file, cosine, output."""
    sample_order: list[int] = field(default_factory=list)
    """Every evaluation sample with finite headline outputs, largest share of the pooled output error
    first (ties by index, see `largest_error_share_first`): the output gain is measured on the first
    few, the samples that decide the whole set's output cosine."""
    deployed_samples: int = 0
    """Samples the deployed check ran on (the first ones, `ScanOptions.deployed_samples`)."""
    deployed_basis: dict[str, OutputMetrics] = field(default_factory=dict)
    """Fake-quant figures per headline output on those samples, when they are fewer than all."""
    isolated_split: dict[tuple[int, str], qm.ErrorAccumulator] = field(default_factory=dict)
    """(site index, WEIGHT_ONLY | ACT_ONLY) -> the site's weight-only / activation-only twin against FP32."""


@dataclass
class EvalSums:
    """Everything pass 2 adds up over samples, before any ratio is taken: two of these (disjoint sample
    shards, `--workers`) merge into exactly what one pass over both shards would have summed."""

    headline: list[str]
    cumulative: dict[str, qm.ErrorAccumulator]
    isolated: dict[int, qm.ErrorAccumulator]
    act_channel: dict[int, qm.ChannelErrorAccumulator]
    top1: dict[str, qm.Top1Accumulator]
    deployed: dict[str, qm.ErrorAccumulator]
    deployed_top1: dict[str, qm.Top1Accumulator]
    task: dict[str, list[TaskAccumulator]]
    hist_counts: dict[int, list[np.ndarray]]
    clip_counts: dict[str, list[float]]
    sample_cosines: list[tuple[float, int, str]]
    seen: int
    sample_errors: list[SampleError] = field(default_factory=list)
    sample_task: list[SampleTaskFigure] = field(default_factory=list)
    """Per sample and task output with per-sample figures: worst samples by the task metric."""
    deployed_basis: dict[str, qm.ErrorAccumulator] = field(default_factory=dict)
    """Fake-quant against FP32 on the deployed check's samples only (the gap compares like with like)."""
    deployed_seen: int = 0
    isolated_split: dict[tuple[int, str], qm.ErrorAccumulator] = field(default_factory=dict)

    def merge(self, other: EvalSums) -> EvalSums:
        """Add `other` (the same analysis over other samples) into this one, in place; returns self."""
        for group, theirs in ((self.cumulative, other.cumulative), (self.isolated, other.isolated),
                              (self.deployed, other.deployed), (self.deployed_basis, other.deployed_basis),
                              (self.isolated_split, other.isolated_split)):
            for key, acc in group.items():
                acc.merge(theirs[key])  # type: ignore[index]
        for k, ch in self.act_channel.items():
            ch.merge(other.act_channel[k])
        for top, theirs_top in ((self.top1, other.top1), (self.deployed_top1, other.deployed_top1)):
            for o, t1 in top.items():
                t1.merge(theirs_top[o])
        for o, accs in self.task.items():
            for mine, their in zip(accs, other.task[o], strict=True):
                mine.merge(their)
        for k, counts in self.hist_counts.items():
            for slot in range(2):
                counts[slot] = counts[slot] + other.hist_counts[k][slot]
        for t, clip in self.clip_counts.items():
            clip[0] += other.clip_counts[t][0]
            clip[1] += other.clip_counts[t][1]
        self.sample_cosines.extend(other.sample_cosines)
        self.sample_errors.extend(other.sample_errors)
        self.sample_task.extend(other.sample_task)
        self.seen += other.seen
        self.deployed_seen += other.deployed_seen
        return self


def quantizes(site: Site, plan: qgraph.QuantPlan) -> bool:
    """True when the site has anything quantized: its output, a data input or a weight. A site whose
    output stays float (quantize_static's BatchNormalization after a ConvTranspose: gamma and beta
    quantized, the output not) still has an isolated figure: its quantized inputs and weights alone."""
    weights = [site.weight, site.bias, *(w for w, _ in site.extra_weights)]
    return (site.output in plan.activations or any(i in plan.activations for i in site.inputs)
            or any(w in plan.weights or w in plan.biases for w in weights if w))


def splits(site: Site, plan: qgraph.QuantPlan) -> bool:
    """True when the site's error can be split into a weight half and an activation half: it has a
    quantized weight and a quantized input or output (else its isolated figure is one of the halves)."""
    weights = [site.weight, *(w for w, _ in site.extra_weights)]
    return (any(w in plan.weights for w in weights if w)
            and (site.output in plan.activations or any(i in plan.activations for i in site.inputs)))


def accumulate_evaluation(
    prepared: PreparedModel,
    qdq: onnx.ModelProto,
    sites: Sequence[Site],
    plan: qgraph.QuantPlan,
    compare: Sequence[str],
    eval_set: CalibSet,
    batch_size: int,
    runner: Runner,
    progress: ProgressFactory,
    probe: Probe,
    opts: ScanOptions,
    segments: int = 1,
    offset: int = 0,
) -> EvalSums:
    """Pass 2's sums over `eval_set`, whose first sample is sample `offset` of the whole evaluation set
    (a `--workers` shard: sample indexes and the hist.npz sample window stay those of the whole set).

    One pass: cumulative, isolated and per-channel sums come out of one session per batch (or
    `segments` sessions taking turns on each batch, when the memory plan says one cannot fit);
    `finish_evaluation` turns the (merged) sums into figures."""
    graph, spec = _analysis_graph(prepared, qdq, sites, plan, compare, probe, opts)
    fp32_nodes = [n.name for n in prepared.proto.graph.node]
    session: Session | SegmentedSession
    if segments > 1:
        cuts = balanced_cuts(node_bytes(prepared.proto, probe), segments)
        session = SegmentedSession(runner, split(graph.take(), fp32_nodes, cuts))
    else:
        session = open_session(runner, graph, ordered=True)
    def deployed() -> Session:  # built on first use: a shard past the deployed samples never needs it
        return runner.session(qdq, opt_level="all", built=True)

    task = task_accumulators(prepared.proto, spec.headline, probe.shapes, spec.classifiers, eval_set, opts,
                             probe.input_shapes)
    sums = _EvalPass(spec, deployed, task, eval_set.labels, offset, deployed_limit(opts, eval_set.n_samples + offset))
    sweep(session, eval_set.batches(batch_size), sums.update, progress=progress, label="measuring",
          total=n_batches(eval_set.n_samples, batch_size), fetch=sums.wanted)
    return sums.sums()


@dataclass
class _AnalysisSpec:
    """Where the analysis graph's reductions are: which outputs hold which sums."""

    pairs: dict[str, qgraph.PairSums]
    iso_pairs: dict[int, qgraph.PairSums]
    split_pairs: dict[tuple[int, str], qgraph.PairSums]
    channel_pairs: dict[int, qgraph.ChannelSums]
    hist_codes: dict[int, tuple[str, str]]
    clip_names: dict[str, tuple[str, str]]
    headline: list[str]
    classifiers: set[str]

    def outputs(self) -> list[str]:
        names = [n for p in [*self.pairs.values(), *self.iso_pairs.values(), *self.split_pairs.values()]
                 for n in p.names()]
        names += [n for pair in self.channel_pairs.values() for n in pair.names()]
        names += [n for o in self.headline for n in (o, o + qgraph.CUMULATIVE_SUFFIX)]
        return names + [n for pair in self.clip_names.values() for n in pair]

    def hist_outputs(self) -> list[str]:
        return [n for pair in self.hist_codes.values() for n in pair]


def _analysis_graph(
    prepared: PreparedModel,
    qdq: onnx.ModelProto,
    sites: Sequence[Site],
    plan: qgraph.QuantPlan,
    compare: Sequence[str],
    probe: Probe,
    opts: ScanOptions,
) -> tuple[GraphHandoff, _AnalysisSpec]:
    """The analysis model (FP32 + cumulative copy + isolated twins) with its reductions attached, in the
    interleaved order, and where each sum is; the model is handed off, not kept (sweep.GraphHandoff)."""
    isolated_ids = [k for k, s in enumerate(sites) if quantizes(s, plan)]
    split_ids = [k for k in isolated_ids if splits(sites[k], plan)] if opts.split_isolated else []
    combined = qgraph.build_analysis_model(prepared.proto, qdq, sites, plan, isolated=isolated_ids, split=split_ids)
    reducer = qgraph.Reducer(prepared.opset_to)
    rank = {t: len(probe.shapes.get(t, ())) for t in compare}
    measurable = [t for t in compare if all(d > 0 for d in probe.shapes.get(t, (1,)))]
    pairs = {t: reducer.pair(t, t + qgraph.CUMULATIVE_SUFFIX, rank[t]) for t in measurable}
    for site in sites:  # a model input's site: its quantized value is the DequantizeLinear beside the input
        if site.is_input and site.output in plan.activations and site.output not in pairs:
            rank[site.output] = len(probe.input_shapes.get(site.output, ()))
            test = qgraph.input_alias(site.output) + qgraph.CUMULATIVE_SUFFIX
            pairs[site.output] = reducer.pair(site.output, test, rank[site.output])
    iso_pairs = {
        k: reducer.pair(sites[k].output, qgraph.iso_name(sites[k].output, k), rank.get(sites[k].output, 0))
        for k in isolated_ids
        if sites[k].output in pairs
    }
    split_pairs = {
        (k, part): reducer.pair(sites[k].output, qgraph.iso_name(sites[k].output, k, part),
                                rank.get(sites[k].output, 0))
        for k in split_ids if sites[k].output in pairs
        for part in (qgraph.WEIGHT_ONLY, qgraph.ACT_ONLY)
    }
    channel_pairs: dict[int, qgraph.ChannelSums] = {}
    hist_codes: dict[int, tuple[str, str]] = {}
    for k, site in enumerate(sites):
        qp = plan.activations.get(site.output)
        shape = probe.shapes.get(site.output, ())
        axis = channel_axis_for(site, shape)
        if qp is not None and axis is not None and site.output in pairs:
            codes, fq = reducer.quantize(site.output, qp, f"{site.output}@chq")
            channel_pairs[k] = reducer.channel_sums(site.output, fq, len(shape), axis)
            hist_codes[k] = (codes, f"{site.output}__act__q{qgraph.CUMULATIVE_SUFFIX}")
    headline = headline_outputs(probe, opts.output, opts.state)
    clip_names = {site.output: reducer.outside(site.output, *clip_range(plan.activations[site.output]),
                                               rank.get(site.output, 0))
                  for site in sites if site.output in plan.activations and site.output in pairs}
    spec = _AnalysisSpec(pairs, iso_pairs, split_pairs, channel_pairs, hist_codes, clip_names, headline,
                         classifier_outputs(prepared, headline, probe))
    fp32_nodes = [n.name for n in prepared.proto.graph.node]
    attached = reducer.attach(combined, spec.outputs() + spec.hist_outputs(), in_place=True)
    return GraphHandoff(interleave(attached, fp32_nodes)), spec


def deployed_limit(opts: ScanOptions, n_samples: int) -> int:
    """How many of the first evaluation samples the deployed check runs on (rounded up to whole batches).

    Why not all: the check runs the whole QDQ model a second time, at ORT_ENABLE_ALL (1.3-1.8 FP32 passes
    per sample, benchmarks/floor.py), to find a *systematic* difference between onnxruntime's integer
    kernels and the simulation; the first few dozen samples show one as well as a thousand do, and the
    fake-quant figure it is compared with is taken on the same samples (`EvalSums.deployed_basis`)."""
    limit = opts.deployed_samples
    return n_samples if limit == EVERY_SAMPLE else min(int(limit), n_samples)


class _EvalPass:
    """Pass 2's accumulator: every batch's in-graph sums folded into float64 accumulators, plus the
    deployed (ORT_ENABLE_ALL) run of the QDQ model on the same batch while within the first
    `deployed_limit` samples of the whole evaluation set."""

    def __init__(
        self,
        spec: _AnalysisSpec,
        deployed: Callable[[], Session],
        task: dict[str, list[TaskAccumulator]],
        labels: Sequence[Any] | None,
        offset: int,
        deployed_limit: int,
    ) -> None:
        self.spec, self.task, self.labels, self.offset = spec, task, labels, offset
        self._deployed_factory = deployed
        self._deployed: Session | None = None
        self.deployed_limit = deployed_limit
        self.deployed_basis = {o: qm.ErrorAccumulator() for o in spec.headline}
        self.deployed_seen = 0
        self.names = spec.outputs()
        self.hist_counts = {k: [np.zeros(256, np.int64), np.zeros(256, np.int64)] for k in spec.hist_codes}
        self.cumulative = {t: qm.ErrorAccumulator() for t in spec.pairs}
        self.isolated = {k: qm.ErrorAccumulator() for k in spec.iso_pairs}
        self.isolated_split = {key: qm.ErrorAccumulator() for key in spec.split_pairs}
        self.act_channel = {k: qm.ChannelErrorAccumulator(1) for k in spec.channel_pairs}
        self.top1 = {o: qm.Top1Accumulator() for o in spec.classifiers}
        self.deployed_acc = {o: qm.ErrorAccumulator() for o in spec.headline}
        self.deployed_top1 = {o: qm.Top1Accumulator() for o in spec.classifiers}
        self.clip_counts = {t: [0.0, 0.0] for t in spec.clip_names}
        self.sample_cosines: list[tuple[float, int, str]] = []
        self.sample_errors: list[SampleError] = []
        self.sample_task: list[SampleTaskFigure] = []
        self.seen = offset

    def wanted(self) -> list[str]:
        """The outputs of the next batch: the histogram codes too while within the first HIST_SAMPLES."""
        return self.names + self.spec.hist_outputs() if self.seen < HIST_SAMPLES else self.names

    def update(self, feeds: Feeds, values: Values) -> None:
        first = next(iter(feeds.values()), None)
        n = int(first.shape[0]) if first is not None and first.ndim else 1  # rank-0 inputs: one sample
        start = self.seen - self.offset
        batch_labels = self.labels[start: start + n] if self.labels else None
        for t, (outside, size) in self.spec.clip_names.items():
            self.clip_counts[t][0] += float(np.sum(values[outside], dtype=np.float64))
            self.clip_counts[t][1] += float(values[size])
        cosines, errors = _per_sample_figures(values, self.spec.headline, self.seen, n)
        self.sample_cosines.extend(cosines)
        self.sample_errors.extend(errors)
        if self.seen < HIST_SAMPLES:
            _count_codes(self.spec.hist_codes, self.hist_counts, values)
        room = self.deployed_limit - self.seen  # this batch's samples still within the deployed check's
        self._fold(values, batch_labels)
        self.seen += n
        self._deployed_check(feeds, values, batch_labels, n, room)

    def _deployed_check(self, feeds: Feeds, values: Values, batch_labels: Sequence[Any] | None, n: int,
                        room: int) -> None:
        """The QDQ model at ORT_ENABLE_ALL on this batch when it starts within the deployed check's samples
        (whole batches: a model whose batch dim is fixed takes no other count), beside the fake-quant
        figures of the same samples."""
        if room <= 0:
            return
        if self._deployed is None:
            self._deployed = self._deployed_factory()
        dep = self._deployed.run(feeds, self.spec.headline)
        for o, acc in self.deployed_acc.items():
            acc.update(values[o], dep[o])
            self.deployed_basis[o].update(values[o], values[o + qgraph.CUMULATIVE_SUFFIX])
        for o, t1 in self.deployed_top1.items():
            t1.update(values[o], dep[o], batch_labels)
        self.deployed_seen += n

    def _fold(self, values: Values, batch_labels: Sequence[Any] | None) -> None:
        spec = self.spec
        for t, acc in self.cumulative.items():
            acc.update_sums(*spec.pairs[t].fold(values))
        for k, acc in self.isolated.items():
            acc.update_sums(*spec.iso_pairs[k].fold(values))
        for key, acc in self.isolated_split.items():
            acc.update_sums(*spec.split_pairs[key].fold(values))
        for k, ch in self.act_channel.items():
            ch.update_sums(*spec.channel_pairs[k].fold(values))
        for o, t1 in self.top1.items():
            t1.update(values[o], values[o + qgraph.CUMULATIVE_SUFFIX], batch_labels)
        for o, accs in self.task.items():
            for tacc in accs:
                figures = feed(tacc, o, values, qgraph.CUMULATIVE_SUFFIX, batch_labels)
                self.sample_task.extend(
                    SampleTaskFigure(self.seen + i, o, str(getattr(tacc, "sample_metric", tacc.kind)), float(v),
                                     bool(getattr(tacc, "higher_is_worse", False)))
                    for i, v in enumerate(figures))

    def sums(self) -> EvalSums:
        return EvalSums(self.spec.headline, self.cumulative, self.isolated, self.act_channel, self.top1,
                        self.deployed_acc, self.deployed_top1, self.task, self.hist_counts, self.clip_counts,
                        self.sample_cosines, self.seen - self.offset, self.sample_errors, self.sample_task,
                        self.deployed_basis, self.deployed_seen, self.isolated_split)


def finish_evaluation(
    sums: EvalSums, sites: Sequence[Site], plan: qgraph.QuantPlan, eval_set: CalibSet
) -> Evaluation:
    """The figures from the (merged) sums: ratios, warnings, histograms, the worst samples."""
    cumulative, headline = sums.cumulative, sums.headline
    warnings = [
        f"tensor '{name}': NaN/Inf in activations (samples left out: FP32 side {acc.nonfinite_ref}, "
        f"int8 side {acc.nonfinite_test} elements)"
        for name, acc in cumulative.items()
        if acc.nonfinite_ref or acc.nonfinite_test
    ] + [
        f"tensor '{name}': finite values too large for float32 error sums ({acc.overflow} elements, "
        "|x| > 1.8e19, e.g. a float-min mask): its error figures are not measured"
        for name, acc in cumulative.items()
        if acc.overflow
    ]
    output_metrics: dict[str, OutputMetrics] = {}
    deployed_metrics: dict[str, OutputMetrics] = {}
    figures = task_results(sums.task)
    for o in headline:
        if o in cumulative:
            output_metrics[o] = measure_output(cumulative[o], sums.top1.get(o))
            output_metrics[o].task = figures.get(o, {})
        if sums.deployed_seen:
            deployed_metrics[o] = measure_output(sums.deployed[o], sums.deployed_top1.get(o))
    hist = _histograms(sites, plan, sums.hist_counts)
    clip = {t: (c[0] / c[1] if c[1] else math.nan) for t, c in sums.clip_counts.items()}
    return Evaluation(
        cumulative, sums.isolated, sums.act_channel, hist, output_metrics, deployed_metrics, headline, warnings,
        sums.seen, sums.task, clip, worst_samples(sums.sample_cosines, eval_set, sums.sample_errors, sums.sample_task),
        largest_error_share_first(sums.sample_errors), sums.deployed_seen,
        {o: measure_output(sums.deployed_basis[o], None) for o in sums.deployed_basis
         if 0 < sums.deployed_seen < sums.seen},
        sums.isolated_split,
    )


def clip_range(qp: quant.QParams) -> tuple[float, float]:
    """The values a per-tensor quantizer represents without saturating: its code range widened by half
    a step on each side (anything beyond rounds to qmin/qmax and is clipped)."""
    scale, zp = float(np.asarray(qp.scale).reshape(-1)[0]), float(np.asarray(qp.zero_point).reshape(-1)[0])
    return (qp.qmin - zp - 0.5) * scale, (qp.qmax - zp + 0.5) * scale


def _per_sample_figures(
    values: Mapping[str, np.ndarray], outputs: Sequence[str], start: int, n: int
) -> tuple[list[tuple[float, int, str]], list[SampleError]]:
    """Per sample of the batch: (cosine, sample index, output) of its worst headline output, and every
    headline output's error and reference energy (samples with non-finite outputs give neither)."""
    worst: list[tuple[float, int, str]] = []
    errors: list[SampleError] = []
    for i in range(n):
        per_output = []
        for o in outputs:
            ref, test = values[o], values[o + qgraph.CUMULATIVE_SUFFIX]
            if np.ndim(ref) == 0 or ref.shape[0] != n:
                continue
            x, y = ref[i].astype(np.float64).ravel(), test[i].astype(np.float64).ravel()
            if not (np.isfinite(x).all() and np.isfinite(y).all()):
                continue
            if x.size > 1:  # the cosine of one number is its sign agreement, no figure (qm.ErrorAccumulator)
                per_output.append((float(qm.cosine_from_sums(x @ y, x @ x, y @ y)), start + i, o))
            d = x - y
            errors.append(SampleError(start + i, o, float(d @ d), float(x @ x)))
        if per_output:
            worst.append(min(per_output))
    return worst, errors


@dataclass(frozen=True)
class SampleTaskFigure:
    """One sample's task figure on one output (a landmark error, an image's matched IoU, a mask IoU)."""

    index: int
    output: str
    metric: str
    value: float
    higher_is_worse: bool
    severity: float = math.nan
    """Comparable across metrics, larger is worse (`_worst_task_figure` sets it)."""


@dataclass(frozen=True)
class SampleError:
    """One sample's Σ(x−y)² and Σx² on one headline output (x FP32, y the all-int8 copy)."""

    index: int
    output: str
    error_energy: float
    reference_energy: float


def largest_error_share_first(errors: Sequence[SampleError]) -> list[int]:
    """Sample indices by their largest share of a headline output's pooled error, largest first.

    Why this order and not the lowest per-sample cosine: the headline cosine is pooled over the whole
    set, cos = Σxy / sqrt(Σx² Σy²), and for small errors 1 − cos ≈ Σ‖x−y‖² / (2 Σ‖x‖²): sample i
    takes ‖x_i−y_i‖² / (2 Σ‖x‖²) of the loss. A near-silent audio window can have the worst cosine
    and almost none of the error (silero_vad), so the gain measured on the lowest-cosine windows
    ranks sites by what they do where nothing is at stake. Each output's share is taken against its
    own total reference energy (outputs of different scales compare); a sample counts by its largest
    share over the outputs. Ties (and exact outputs) keep index order.
    """
    totals: dict[str, float] = {}
    for e in errors:
        totals[e.output] = totals.get(e.output, 0.0) + e.reference_energy
    share: dict[int, float] = {}
    for e in errors:
        total = totals[e.output]
        value = e.error_energy / total if total > 0 else (math.inf if e.error_energy > 0 else 0.0)
        share[e.index] = max(share.get(e.index, -math.inf), value)
    return sorted(share, key=lambda i: (-share[i], i))


def worst_samples(
    cosines: Sequence[tuple[float, int, str]], eval_set: CalibSet, errors: Sequence[SampleError] = (),
    task: Sequence[SampleTaskFigure] = (),
) -> list[dict[str, Any]]:
    """The WORST_SAMPLES worst samples, each with its lowest output cosine (NaN for outputs of one value
    per sample) and its file when one file holds one sample.

    Order: by the task metric when an output has per-sample task figures (the lowest-IoU image, the
    largest landmark error, a flipped decision first: `task_metric`, `task_value`, `task_output`), since
    that is what the application reads; else by the largest share of the output error
    (`largest_error_share_first`; the lowest cosines without `errors`).

    Why not the lowest cosines: a sample whose output is near zero (a text-free photo under a text
    segmenter, a silent audio window) has a low cosine from any noise and almost none of the error."""
    files = eval_set.files if len(eval_set.files) == eval_set.n_samples else None
    lowest: dict[int, tuple[float, int, str]] = {}
    for figure in sorted(cosines, reverse=True):
        lowest[figure[1]] = figure  # the lowest cosine of each sample wins (written last)
    worst_task = _worst_task_figure(task)
    if worst_task:  # ties (no decision flipped anywhere) keep the error-share order
        share = {i: r for r, i in enumerate(largest_error_share_first(errors))}
        order = sorted(worst_task, key=lambda i: (-worst_task[i].severity, share.get(i, len(share)), i))
    elif errors:  # a sample whose outputs hold one value each has an error share but no cosine
        order = largest_error_share_first(errors)
    else:
        order = [i for _, i, _ in sorted(lowest.values())]
    measured = {e.index: e.output for e in errors}
    rows = []
    for index in order[:WORST_SAMPLES]:
        cosine, _, output = lowest.get(index, (math.nan, index, ""))
        output = output or (worst_task[index].output if index in worst_task else measured.get(index, ""))
        row: dict[str, Any] = {"index": index, "file": files[index].name if files and index < len(files) else None,
                               Col.OUTPUT: output, "cosine": cosine}
        if index in worst_task:
            task_figure = worst_task[index]
            row.update({"task_output": task_figure.output, "task_metric": task_figure.metric,
                        "task_value": task_figure.value})
        rows.append(row)
    return rows


def _worst_task_figure(task: Sequence[SampleTaskFigure]) -> dict[int, SampleTaskFigure]:
    """Per sample, its worst task figure over the outputs, figures of different units made comparable:
    a higher-is-worse figure (pixels, an error rate, a flip) over its largest value on the set, a
    lower-is-worse one (an IoU, an agreement, in [0, 1]) as 1 − value."""
    top: dict[str, float] = {}
    for figure in task:
        if figure.higher_is_worse and math.isfinite(figure.value):
            top[figure.metric] = max(top.get(figure.metric, 0.0), figure.value)

    def severity(figure: SampleTaskFigure) -> float:
        if math.isnan(figure.value):
            return -math.inf
        if figure.higher_is_worse:
            return figure.value / top[figure.metric] if top.get(figure.metric) else 0.0
        return 1.0 - figure.value

    worst: dict[int, tuple[float, SampleTaskFigure]] = {}
    for figure in task:
        held = worst.get(figure.index)
        if held is None or severity(figure) > held[0]:
            worst[figure.index] = (severity(figure), figure)
    return {i: replace(f, severity=v) for i, (v, f) in worst.items()}


def node_bytes(model: onnx.ModelProto, probe: Probe) -> list[int]:
    """Per FP32 node: bytes per sample of the float tensors it writes (the probe's shapes, float32)."""
    return [
        sum(int(np.prod(probe.shapes[o][1:], dtype=np.int64)) * 4 for o in node.output
            if o in probe.float_tensors and len(probe.shapes.get(o, ())) >= 1)
        for node in model.graph.node
    ]


def _count_codes(
    names: Mapping[int, tuple[str, str]], counts: Mapping[int, list[np.ndarray]], values: Mapping[str, np.ndarray]
) -> None:
    """Histogram of the integer codes: FP32 values under the site's scale vs the cumulative int8 codes."""
    for k, (fp32_codes, int8_codes) in names.items():
        for slot, name in enumerate((fp32_codes, int8_codes)):
            counts[k][slot] += np.bincount(_code_bins(np.asarray(values[name]).reshape(-1)), minlength=256)[:256]


def _code_bins(codes: np.ndarray) -> np.ndarray:
    """Each code's bin of 256 from the bottom of its type: 8-bit codes one bin each, 16-bit codes
    (`--activations int16`) 256 codes a bin, so the report's histogram keeps its 256 bins."""
    wide = codes.astype(np.int64)
    if codes.dtype in (np.int8, np.int16):
        wide = wide - int(np.iinfo(codes.dtype).min)
    return wide >> 8 if codes.dtype.itemsize == 2 else wide


def _histograms(
    sites: Sequence[Site], plan: qgraph.QuantPlan, counts: Mapping[int, list[np.ndarray]]
) -> dict[str, np.ndarray]:
    """hist.npz content: per site, 64 bins over the quantized range (4 codes per bin; 16-bit codes,
    `--activations int16`: 1024 per bin, see `_code_bins`)."""
    hist: dict[str, np.ndarray] = {"site_nodes": np.array([s.node for s in sites])}
    for k, (fp32, int8) in counts.items():
        qp = plan.activations[sites[k].output]
        dtype = qp.zero_point.dtype
        lo_code = int(np.iinfo(dtype).min)
        codes_per_count = 256 if dtype.itemsize == 2 else 1
        edges_codes = lo_code + np.arange(0, 257, 4) * codes_per_count - 0.5
        hist[f"{k}/edges"] = ((edges_codes - float(qp.zero_point)) * float(qp.scale)).astype(np.float64)
        hist[f"{k}/fp32"] = fp32.reshape(64, 4).sum(axis=1)
        hist[f"{k}/int8"] = int8.reshape(64, 4).sum(axis=1)
    return hist


def measure_output(acc: qm.ErrorAccumulator, top1: qm.Top1Accumulator | None) -> OutputMetrics:
    """One output's headline metrics (and top-1 agreement / accuracy for classifiers)."""
    metrics = OutputMetrics(
        cosine=acc.cosine,
        sqnr_db=acc.sqnr_db,
        mse=acc.mse,
        max_abs=acc.max_abs,
        rel_l2=acc.rel_l2,
        worst_sample_cosine=acc.worst_sample_cosine,
        mean_sample_cosine=acc.mean_sample_cosine,
    )
    if top1 is not None:
        metrics.top1_agreement = top1.agreement
        if top1.accuracy is not None:
            metrics.accuracy = top1.accuracy
            if top1.ref_accuracy is not None:
                metrics.fp32_accuracy = top1.ref_accuracy
    return metrics


def output_row(acc: qm.ErrorAccumulator, top1: qm.Top1Accumulator | None) -> dict[str, Any]:
    """`measure_output` in its JSON form: the row bisection compares against its target."""
    return measure_output(acc, top1).to_json()


def headline(evaluation: Evaluation) -> Headline:
    """The worst headline output counts (contract), for the fake-quant and the deployed model."""
    if not evaluation.output_metrics:
        raise ModelError("expected a float graph output to measure int8 error on, found none "
                         "(every output is an integer, boolean or empty tensor)")
    worst = min(evaluation.output_metrics, key=lambda o: _nan_last(evaluation.output_metrics[o].cosine))
    return Headline(
        output=worst,
        metrics=evaluation.output_metrics[worst],
        deployed=evaluation.deployed_metrics.get(worst),
        outputs=list(evaluation.output_metrics),
        deployed_samples=evaluation.deployed_samples,
        deployed_basis=evaluation.deployed_basis.get(worst),
    )


def _nan_last(value: float) -> float:
    return math.inf if math.isnan(value) else value
