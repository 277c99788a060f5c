"""What a bisection aims at: `--target METRIC=VALUE`, and how a task-metric target is measured.

Why its own module: the state machine only compares numbers and the driver only loops; which
metric, how it is spelt on the command line, and which accumulators measure it live here. Cosine,
SQNR and top-1 come from the in-graph sums every evaluation already has; the task metrics (top-5,
CTC string agreement, mask IoU, box agreement) need the raw FP32 and mixed outputs per step, so the
evaluator gets a factory of task accumulators only when the target needs one.

The output gain that orders the sites is measured in the target's metric when the gain pass has it
(cosine, SQNR, top-1), else in cosine: task metrics need the whole output of every branch, which the
single gain session does not keep. Each bisection step still measures the target metric itself, so
the plan meets the target as measured; only the order in which sites are tried is cosine's.
"""

from __future__ import annotations

import math
from dataclasses import replace

from quantscan.bisect.reference import CachedReferenceEvaluator
from quantscan.bisect.state import METRICS, Target
from quantscan.errors import UsageError
from quantscan.graph.mixed import MixedBuilder
from quantscan.scanning.gain import Evaluator, TaskFactory
from quantscan.scanning.prepare import ScanContext
from quantscan.scanning.tasks import task_accumulators
from quantscan.taskmetrics import TaskAccumulator

GAIN_KEYS = ("cosine", "sqnr_db", "top1_agreement")
"""Metrics the output-gain pass measures per site (gain.py); other targets order sites by cosine."""
TASK_KEYS = ("top5_agreement", "string_agreement", "mask_iou", "box_agreement", "peak_agreement",
             "sequence_agreement", "detection_agreement", "next_token_agreement", "keypoint_pck")
"""Target metrics that come from task accumulators (the raw outputs of each step)."""
TASK_OF = {"top5_agreement": "classify", "string_agreement": "ctc", "mask_iou": "mask", "box_agreement": "box",
           "peak_agreement": "heatmap", "sequence_agreement": "decoder", "detection_agreement": "anchors",
           "next_token_agreement": "lm", "keypoint_pck": "keypoints"}
"""The task whose accumulator gives each task key (used when the scan options left the task on auto)."""


def parse_target(text: str) -> Target:
    """`top1=0.99`, `box=0.9`, `cosine=0.995`, or the long key (`box_agreement=0.9`) → a Target."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    long_names = {key: short for short, key in METRICS.items()}
    metric = long_names.get(name, name)
    if not sep or metric not in METRICS:
        raise UsageError(f"--target: expected METRIC=VALUE with METRIC one of {', '.join(METRICS)}, found {text!r}")
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"--target: expected a number after '=', found {raw!r}") from None
    if not math.isfinite(value):
        raise UsageError(f"--target: expected a finite number, found {raw!r}")
    if metric != "sqnr" and not 0 <= value <= 1:
        raise UsageError(f"--target {metric}: expected a fraction in [0, 1], found {raw!r}")
    return Target(metric, value)


def gain_key(target: Target) -> str:
    """The metric the output gain (and so the site order) is measured in for this target."""
    return target.key if target.key in GAIN_KEYS else "cosine"


def task_factory(ctx: ScanContext, target: Target) -> TaskFactory | None:
    """Fresh task accumulators per headline output for each step, when the target is a task metric."""
    if target.key not in TASK_KEYS:
        return None
    opts = ctx.opts
    if opts.task in ("auto", "none"):
        opts = replace(opts, task=TASK_OF[target.key], metric=())
    outputs = ctx.headline_outputs()
    classifiers = ctx.classifier_outputs(outputs)

    def build() -> dict[str, list[TaskAccumulator]]:
        return task_accumulators(ctx.graph.prepared.proto, outputs, ctx.graph.probe.shapes, classifiers,
                                 ctx.data.eval_set, opts,
                                 ctx.graph.probe.input_shapes)

    if not any(TASK_OF[target.key] == acc.kind for accs in build().values() for acc in accs):
        raise UsageError(f"--target {target.metric}: expected a headline output with {target.key} "
                         f"(task {TASK_OF[target.key]}), found none")
    return build


GRAPH_STRATEGIES = ("switchable", "cached_reference", "fp32_in_graph")
"""How a simulated judge runs a candidate, chosen once per search (bisect/simulated.py) and recorded in the
session: `switchable` one session whose selector inputs pick each site's precision (bisect/switched.py),
`cached_reference` the candidate's own QDQ model against FP32 outputs computed once (bisect/reference.py),
`fp32_in_graph` FP32 and the candidate in one graph per evaluation (scanning/gain.Evaluator: task-metric
targets, which read whole outputs). The figures are the same on every path; only the time differs."""


def graph_strategy(target: Target, recorded: str | None = None) -> str | None:
    """The strategy a search runs on: the one its session recorded, fp32_in_graph for a task-metric target,
    else None: measured on the search's first evaluations, switchable or cached_reference, then kept for the
    whole search (bisect/switched.py says how and why it is measured, not assumed)."""
    if recorded in GRAPH_STRATEGIES:
        return str(recorded)
    return "fp32_in_graph" if target.key in TASK_KEYS else None


def make_evaluator(ctx: ScanContext, builder: MixedBuilder, target: Target,
                   strategy: str | None = "cached_reference") -> tuple[Evaluator, CachedReferenceEvaluator | None]:
    """The per-step evaluator of `strategy` (None: measured once, bisect/switched.py) with in-graph sums,
    plus task accumulators when the target needs them, and its cached-reference self when it has one (the
    realisations share its FP32 outputs and its switchable session)."""
    tasks = task_factory(ctx, target)
    if tasks is not None or strategy == "fp32_in_graph":
        return Evaluator(ctx, builder, target.key, tasks=tasks), None
    # output metrics only: the FP32 outputs are computed once and fed to every step (bisect/reference.py)
    cached = CachedReferenceEvaluator(ctx, builder, target.key)
    cached.switch.policy = {"switchable": "always", "cached_reference": "never"}.get(str(strategy), "measured")
    return cached, cached
