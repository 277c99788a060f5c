"""The all-int8 output cosine with each top deciding sample left out of calibration (calib-advice).

Why: a sample that alone sets a tensor's range is either an outlier that costs every other sample
resolution (drop it) or the one example of data the model must handle (keep it). Leaving it out needs
no network pass for the ranges (the per-sample ranges give the rest's min/max) but one evaluation pass
per sample for the cosine: the FP32 model and the int8 copy planned without it, in one session
(scanning.gain.Evaluator), on the evaluation set. With `--eval`, the coverage of the evaluation set
takes one FP32 pass over it (the calibration pass's graph, its per-sample ranges kept).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from quantscan import graph as qgraph
from quantscan import quant
from quantscan.scanning.calib_advice import CalibAdvice, Decider, SampleRanges, coverage
from quantscan.scanning.calibrate import calibrate, make_plan
from quantscan.scanning.gain import Evaluator, mixed_builder
from quantscan.scanning.options import ProgressFactory, no_progress
from quantscan.scanning.prepare import ScanContext

DECIDERS_EVALUATED = 3
"""Top deciding samples whose leave-one-out cosine is measured: one evaluation pass each."""
SUBSET_COSINE_DRAWS = 3
"""Bootstrap subsets per size n whose all-int8 cosine `calib-advice` measures: one evaluation pass each."""


def with_decider_cosines(ctx: ScanContext, advice: CalibAdvice, top: int = DECIDERS_EVALUATED) -> CalibAdvice:
    """`advice` with the all-int8 cosine of the full set and of each top decider left out (the onnxruntime
    recipe plans through quantize_static, so there it is left unmeasured)."""
    ranges = ctx.quant.calib_stats.sample_ranges
    if ranges is None or ctx.quant.quantize_static is not None or not advice.deciders or top <= 0:
        return advice
    usable = ranges.usable()
    full = _cosine(ctx)
    measured = [replace(d, cosine_without=_cosine(_with_plan(ctx, _plan_without(ctx, usable, d))))
                for d in advice.deciders[:top]]
    return replace(advice, cosine_full=full, deciders=[*measured, *advice.deciders[top:]])


def _plan_without(ctx: ScanContext, usable: SampleRanges, decider: Decider) -> qgraph.QuantPlan:
    """The all-int8 plan calibrated on every sample but the decider."""
    return _plan_for(ctx, usable, np.flatnonzero(np.arange(usable.n_samples) != decider.sample))


def _plan_for(ctx: ScanContext, usable: SampleRanges, samples: np.ndarray) -> qgraph.QuantPlan:
    """The all-int8 plan calibrated on `samples` (indices, repeats allowed); tensors not split per sample
    keep their full range."""
    observers: dict[str, quant.Observer] = dict(ctx.quant.calib_stats.observers)
    for j, tensor in enumerate(usable.tensors):
        old = observers[tensor]
        obs = quant.MinMaxObserver(symmetric=bool(getattr(old, "symmetric", False)))
        obs.update(np.array([usable.mins[samples, j].min(), usable.maxs[samples, j].max()], np.float32))
        observers[tensor] = obs
    plan, _ = make_plan(ctx.graph.prepared.proto, ctx.graph.sites, ctx.graph.origins, observers, ctx.chip.activations,
                        ctx.chip.per_channel_weights, ctx.chip.scheme)
    return plan


def with_subset_cosines(ctx: ScanContext, advice: CalibAdvice, draws: int = SUBSET_COSINE_DRAWS) -> CalibAdvice:
    """Per subset size n, the all-int8 output cosine of `draws` bootstrap subsets of n samples (seeded),
    one evaluation pass each: what the spread of the scales does to the output."""
    ranges = ctx.quant.calib_stats.sample_ranges
    if ranges is None or ctx.quant.quantize_static is not None or draws <= 0:
        return advice
    usable = ranges.usable()
    rng = np.random.default_rng(ctx.opts.seed + 1)
    rows = []
    for row in advice.rows:
        cosines = [_cosine(_with_plan(ctx, _plan_for(ctx, usable, rng.integers(0, usable.n_samples, row.n))))
                   for _ in range(draws)]
        rows.append(replace(row, cosine_draws=draws, cosine_mean=float(np.mean(cosines)),
                            cosine_min=float(np.min(cosines))))
    full = advice.cosine_full if advice.cosine_full is not None else _cosine(ctx)
    return replace(advice, rows=rows, cosine_full=full)


def _cosine(ctx: ScanContext) -> float:
    """The headline (worst output) cosine of the all-int8 model of `ctx.quant.plan` on the evaluation set."""
    builder = mixed_builder(ctx)
    return float(Evaluator(ctx, builder, "cosine").evaluate(builder.precisions(())).worst["cosine"])


def with_coverage(ctx: ScanContext, advice: CalibAdvice, progress: ProgressFactory = no_progress) -> CalibAdvice:
    """With a separate evaluation set (`--eval`): one FP32 pass over it keeping per-sample ranges (the
    calibration pass's graph), then per tensor and label how far its samples reach past the calibrated range."""
    calib = ctx.quant.calib_stats.sample_ranges
    if ctx.opts.eval is None or calib is None:
        return advice
    graph = ctx.graph
    stats = calibrate(graph.prepared, graph.sites, graph.origins, ctx.data.eval_set, ctx.data.batch_size,
                      ctx.runner, ctx.opts.calib_method, ctx.chip.activations, progress, graph.probe.shapes,
                      graph.probe.input_shapes)
    if stats.sample_ranges is None:
        return advice
    eset = ctx.data.eval_set
    groups = ([None if label is None else eset.label_names[label] for label in eset.labels]
              if eset.labels and eset.label_names else None)
    return replace(advice, coverage=coverage(calib, stats.sample_ranges, str(ctx.chip.activations), groups))


def _with_plan(ctx: ScanContext, plan: qgraph.QuantPlan) -> ScanContext:
    """The same scan with another int8 plan (scales from another subset of the calibration samples)."""
    return replace(ctx, quant=replace(ctx.quant, plan=plan))
