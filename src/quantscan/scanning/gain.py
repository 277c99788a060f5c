"""The output gain of every site, measured in one session, and the evaluation of one configuration.

What `quantscan bisect` and the scan's gain ranking measure with. The graphs come from
`quantscan.graph.mixed` (mixed-precision models, downstream branches, the gain graph); this module
runs them on the evaluation set and reduces the outputs.

Output gain, without re-running the network per site. `gain_if_float` of site k is the headline
metric of the model where only k is float, minus the all-int8 metric. Each site's branch (its dirty
downstream nodes, graph.mixed) goes into ONE graph next to the FP32 reference and the all-int8 copy
(the scan's analysis construction): one session, one run per batch, weights stored once (branches
share initializers by name), per-sample reductions inside the graph. Batches are the outer loop, sites
the inner one (all branches run in the same onnxruntime call), nothing is kept between batches, so
memory is flat in the sample count; the work per batch is FP32 + all-int8 + Σ downstream(k), about half
of "one full network per site" on a chain. `loss_if_only` (only k quantized) is the same construction
against the FP32 graph.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import onnx
import pandas as pd

from quantscan import graph as qgraph
from quantscan import metrics as qm
from quantscan import quant
from quantscan.calib import CalibSet
from quantscan.columns import Col
from quantscan.errors import UsageError
from quantscan.graph.mixed import INT16_OPSET, Branch, FloatSiteBranches, GainGraph, MixedBuilder, diff_branch
from quantscan.model import onnx_opset, upgrade_opset
from quantscan.records import ActivationScheme, Precision
from quantscan.runner import Runner
from quantscan.scanning.evaluate import output_row
from quantscan.scanning.options import ProgressFactory, no_progress
from quantscan.scanning.ort_recipe import RECIPE, int16_activations, range_settings
from quantscan.scanning.prepare import ScanContext
from quantscan.scanning.sweep import Feeds, GraphHandoff, Values, open_session, sweep
from quantscan.scanning.tasks import task_results
from quantscan.taskmetrics import TaskAccumulator, feed

GAIN_TAG = "@g"
LOSS_TAG = "@l"
TaskFactory = Callable[[], dict[str, list[TaskAccumulator]]]
"""Fresh task-metric accumulators per headline output, one set per evaluated configuration."""
GAIN_ORT_LEVEL = "disable"
"""The gain graph's session runs with onnxruntime's graph optimizations off (ORT_DISABLE_ALL).

Why: its nodes are mostly branch copies (downstream of each site, tens of times the network), and
ORT_ENABLE_BASIC's transformers walk all of them several times at session creation: 3x the
creation time of ORT_DISABLE_ALL, the largest single cost of the scan's gain measurement. They buy
nothing here: the QDQ pairs stay float fake-quant at both levels (integer kernels come only at
ORT_ENABLE_ALL), stored weights are already folded to float (graph.build_analysis_model), and the
gain is a difference between two outputs of the same session. Tests hold the gains equal at both.
A model with a Loop or Scan is the exception (`gain_ort_level`).
"""
CONTROL_FLOW_GAIN_LEVEL = "basic"
"""The gain session's level for a model with a Loop or Scan: every branch copy of the loop runs its body
once per iteration (SLANet's decoder: 501 iterations of 114 nodes, in each of 34 branches), and BASIC's
constant folding and Cast/Identity elimination inside the body pay back on every iteration; the
session's creation cost is small beside that (gain measurement 12-35% faster there, same gains)."""


def gain_ort_level(model: onnx.ModelProto) -> str:
    """The gain session's onnxruntime level for `model` (GAIN_ORT_LEVEL, CONTROL_FLOW_GAIN_LEVEL)."""
    looped = any(n.op_type in ("Loop", "Scan") for n in model.graph.node)
    return CONTROL_FLOW_GAIN_LEVEL if looped else GAIN_ORT_LEVEL



def mixed_builder(ctx: ScanContext, fallback: str = "float") -> MixedBuilder:
    """The mixed-precision builder of a prepared scan: its sites, all-int8 plan and calibrated ranges.

    With `fallback="int16"` the model is raised to opset 21 first (QuantizeLinear with int16); plan.json
    says so in `qdq_opset`."""
    if fallback not in {p.value for p in Precision}:
        raise UsageError(f"--fallback: expected float, int16 or int8, found {fallback!r}")
    if fallback == Precision.INT8.value and ctx.chip.scheme.weights != "int4":
        raise UsageError(f"--fallback int8: expected a scheme with int4 weights (--weights int4, --scheme w4...), "
                         f"found {ctx.chip.scheme.name()}, whose sites already hold 8-bit weights")
    proto = ctx.graph.prepared.proto
    if fallback == "int16" and onnx_opset(proto) < INT16_OPSET:
        proto = upgrade_opset(proto, INT16_OPSET)
    return MixedBuilder(
        proto,
        ctx.graph.sites,
        ctx.quant.plan,
        partial(_calibrated_range, ctx),
        fallback=fallback,
        int16_scheme=_int16_scheme(ctx),
        quantize_static_rules=ctx.chip.recipe == RECIPE,
        unset_ranges=_unset_ranges(ctx, proto) if ctx.chip.recipe == RECIPE else None,
        input_follows_readers=ctx.chip.input_follows_readers,
    )


def _unset_ranges(ctx: ScanContext, proto: onnx.ModelProto) -> dict[str, tuple[str, quant.QParams]]:
    """Under the onnxruntime recipe, what each range-setting site's tensor is quantized with when the site
    is excluded: its own calibrated range at the call's 8-bit scheme (ort_recipe.range_settings)."""
    scheme = "uint8" if ctx.chip.activations == ActivationScheme.UINT8 else "int8"
    out = {}
    for node, tensor in range_settings(proto, ctx.graph.sites).items():
        rmin, rmax = _calibrated_range(ctx, tensor)
        out[node] = (tensor, quant.activation_qparams(rmin, rmax, scheme))
    return out


def realised_builder(builder: MixedBuilder, factors: Mapping[str, float]) -> MixedBuilder:
    """The builder whose activation scales are multiplied by `factors` (tensor -> factor; missing: 1).

    A rounding realisation (bisect/robust.py): a chip calibrates and rounds its own way, so the same
    float set is judged under scales a few percent off quantscan's. Zero points stay: the range moves
    around the same integer zero, as it does when a toolchain's calibration finds another maximum.
    """
    acts = {
        t: replace(qp, scale=(qp.scale * factors.get(t, 1.0)).astype(qp.scale.dtype))
        for t, qp in builder.base_plan.activations.items()
    }
    plan = qgraph.QuantPlan(activations=acts, weights=builder.base_plan.weights, biases=builder.base_plan.biases)
    twin = builder.with_plan(plan)
    # a range-setting site's own range moves with its tensor's factor (1 for a tensor the plan never quantizes)
    twin.unset_ranges = {
        node: (t, replace(qp, scale=(qp.scale * factors.get(t, 1.0)).astype(qp.scale.dtype)))
        for node, (t, qp) in builder.unset_ranges.items()
    }
    return twin


def _calibrated_range(ctx: ScanContext, tensor: str) -> tuple[float, float]:
    rmin, rmax = ctx.quant.calib_stats.observers[ctx.graph.origins.get(tensor, tensor)].range()
    return float(rmin), float(rmax)


def _int16_scheme(ctx: ScanContext) -> str:
    """Symmetric int16 on a chip's kernels; under the onnxruntime recipe, quantize_static's 16-bit
    counterpart of the call's activation type (uint16 for uint8: see ort_recipe.INT16_ACTIVATIONS)."""
    if ctx.chip.recipe != RECIPE:
        return "int16"
    scheme = ctx.chip.activations
    return int16_activations("QUInt8" if scheme == ActivationScheme.UINT8 else "QInt8")[0]


# --- headline metrics ----------------------------------------------------------------------------------


def worst_output(rows: Mapping[str, Mapping[str, float]], key: str) -> tuple[str, dict[str, float]]:
    """The worst output counts (contract): (output name, its row) by `key`; NaN is worst."""
    usable = {o: r for o, r in rows.items() if key in r}
    if not usable:
        raise UsageError(
            f"target metric {key}: no headline output provides it (top-1 needs a classifier output)"
        )
    worst = min(usable, key=lambda o: -math.inf if math.isnan(usable[o][key]) else usable[o][key])
    return worst, dict(usable[worst])


class OutputPairs:
    """Accumulators for (reference, test) output pairs reduced inside the graph."""

    def __init__(self, reducer: qgraph.Reducer, rank: Mapping[str, int]) -> None:
        self.reducer = reducer
        self.rank = rank
        self.sums: dict[tuple[str, str], qgraph.PairSums] = {}
        self.acc: dict[tuple[str, str], qm.ErrorAccumulator] = {}
        self.top1: dict[tuple[str, str], qm.Top1Accumulator] = {}
        self.raw: list[str] = []
        self.per_sample: dict[tuple[str, str], list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        """Per-sample (Σxy, Σx², Σy²) of every batch: a few floats per sample and pair, kept for the
        jackknife (`cosine_replicates`), which needs each sample's share of the pooled sums."""

    def add(self, key: tuple[str, str], ref: str, test: str, output: str, classifier: bool) -> None:
        self.sums[key] = self.reducer.pair(ref, test, self.rank.get(output, 2))
        self.acc[key] = qm.ErrorAccumulator()
        if classifier:
            self.top1[key] = qm.Top1Accumulator()
            self.raw.extend([ref, test])

    def outputs(self) -> list[str]:
        names = [n for p in self.sums.values() for n in p.names()]
        return list(dict.fromkeys([*names, *self.raw]))

    def update(self, values: Mapping[str, np.ndarray], refs: Mapping[tuple[str, str], tuple[str, str]]) -> None:
        for key, p in self.sums.items():
            folded = p.fold(values)
            self.acc[key].update_sums(*folded)
            self.per_sample.setdefault(key, []).append(folded[:3])
        for key, t1 in self.top1.items():
            ref, test = refs[key]
            t1.update(values[ref], values[test])

    def row(self, key: tuple[str, str]) -> dict[str, float]:
        return output_row(self.acc[key], self.top1.get(key))

    def sample_sums(self, key: tuple[str, str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The pair's per-sample (Σxy, Σx², Σy²), in sample order: held-out intervals are made of them."""
        parts = self.per_sample.get(key, [])
        if not parts:
            return np.zeros(0), np.zeros(0), np.zeros(0)
        sxy, sxx, syy = (np.concatenate([np.reshape(p[i], -1) for p in parts]) for i in range(3))
        return sxy, sxx, syy

    def cosine_replicates(self, key: tuple[str, str]) -> np.ndarray:
        """The pair's pooled cosine with each sample left out in turn (jackknife replicates)."""
        parts = self.per_sample.get(key, [])
        if not parts:
            return np.full(0, np.nan)
        sxy, sxx, syy = (np.concatenate([np.reshape(p[i], -1) for p in parts]) for i in range(3))
        return qm.leave_one_out_cosine(sxy, sxx, syy)


# --- evaluation of one configuration -------------------------------------------------------------------


@dataclass
class Measured:
    """Headline metrics of one configuration: per output, and the worst output by the target key."""

    rows: dict[str, dict[str, float]]
    output: str
    worst: dict[str, float]
    sums: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    """Per output, its per-sample (Σxy, Σx², Σy²): the spread over samples of a robust bisection
    (bisect/robust.py) is computed from them."""


class Evaluator:
    """Runs one precision assignment on the evaluation set: FP32 and the mixed copy in one session."""

    def __init__(
        self,
        ctx: ScanContext,
        builder: MixedBuilder,
        key: str,
        runner: Runner | None = None,
        tasks: TaskFactory | None = None,
    ) -> None:
        self.ctx = ctx
        self.builder = builder
        self.key = key
        self.runner = runner or ctx.runner
        self.tasks = tasks
        """Fresh task-metric accumulators per headline output (bisect/targets.py), fed the raw FP32 and
        mixed outputs so a bisection can target top-5, CTC strings, mask IoU or boxes."""
        self.outputs = ctx.headline_outputs()
        self.classifiers = ctx.classifier_outputs(self.outputs)
        self.rank = {o: len(ctx.graph.probe.shapes.get(o, ())) for o in self.outputs}

    def evaluate(self, prec: Sequence[str]) -> Measured:
        graph, pairs, refs, tasks = self._graph(prec)
        session = open_session(self.runner, graph)

        def accumulate(feeds: Feeds, values: Values) -> None:
            pairs.update(values, refs)
            for o, accs in tasks.items():
                for acc in accs:
                    feed(acc, o, values, qgraph.CUMULATIVE_SUFFIX, None)

        sweep(session, self.ctx.data.eval_set.batches(self.ctx.data.batch_size), accumulate)
        figures = task_results(tasks)
        rows = {o: {**pairs.row((o, "q")), **figures.get(o, {})} for o in self.outputs}
        output, worst = worst_output(rows, self.key)
        return Measured(rows, output, worst, {o: pairs.sample_sums((o, "q")) for o in self.outputs})

    def _graph(
        self, prec: Sequence[str]
    ) -> tuple[GraphHandoff, OutputPairs, dict[tuple[str, str], tuple[str, str]], dict[str, list[TaskAccumulator]]]:
        """FP32 and the mixed copy in one graph, its output reductions, and fresh task accumulators."""
        sites, plan = self.builder.plan(prec)
        mixed = qgraph.build_qdq_model(self.builder.proto, sites, plan)
        combined = qgraph.build_analysis_model(self.builder.proto, mixed, sites, plan, isolated=[])
        pairs = OutputPairs(qgraph.Reducer(self.builder.opset), self.rank)
        refs: dict[tuple[str, str], tuple[str, str]] = {}
        for o in self.outputs:
            test = o + qgraph.CUMULATIVE_SUFFIX
            pairs.add((o, "q"), o, test, o, o in self.classifiers)
            refs[(o, "q")] = (o, test)
        tasks = self.tasks() if self.tasks is not None else {}
        read = [r for accs in tasks.values() for acc in accs for r in getattr(acc, "reads", ())]
        raw = [n for o in [*tasks, *read] for n in (o, o + qgraph.CUMULATIVE_SUFFIX)]
        names = list(dict.fromkeys([*pairs.outputs(), *raw]))
        return GraphHandoff(pairs.reducer.attach(combined, names, in_place=True)), pairs, refs, tasks


@dataclass
class GainResult:
    """Per-site output gains (DataFrame in topological order), the base metrics, and the work done."""

    table: pd.DataFrame
    all_int8: dict[str, dict[str, float]]
    node_executions: int
    full_pass_nodes: int
    fp32_nodes: int
    batches: int
    seconds: float
    branch_nodes: dict[str, int] = field(default_factory=dict)
    replicates: dict[str, np.ndarray] = field(default_factory=dict)
    """Per site, its cosine gain with each evaluation sample left out in turn (jackknife replicates):
    `Col.GAIN_IF_FLOAT_COSINE_STDERR` comes from them, and the standard error of the difference of two
    sites' gains comes from the differences of theirs (the same samples: paired)."""

    @property
    def work_ratio(self) -> float:
        """Node executions / (sites x one all-int8 pass of the naive way, which also needs FP32)."""
        naive = max(1, len(self.table)) * self.full_pass_nodes * self.batches
        return self.node_executions / naive


def compute_gain(
    ctx: ScanContext,
    builder: MixedBuilder,
    *,
    key: str = "cosine",
    loss_if_only: bool = False,
    progress: ProgressFactory = no_progress,
    runner: Runner | None = None,
    subset: Collection[str] | None = None,
    opt_level: str | None = None,
    samples: CalibSet | None = None,
) -> GainResult:
    """gain_if_float (and loss_if_only) of every site in one pass over the evaluation set.

    `subset` (site node names) limits the branches to those sites: the scan measures its strongest
    candidates this way, in the same single session, and the table then has their rows only.
    `opt_level` is the session's onnxruntime level (default `gain_ort_level`); `samples` replaces the
    evaluation set (the scan measures its candidates on the first few samples).
    """
    started = time.perf_counter()
    runner = runner or ctx.runner
    n = len(builder.sites)
    base_prec = ["int8"] * n
    gg = GainGraph(builder, base_prec)
    outputs = ctx.headline_outputs()
    classifiers = ctx.classifier_outputs(outputs)
    rank = {o: len(ctx.graph.probe.shapes.get(o, ())) for o in outputs}
    pairs = OutputPairs(qgraph.Reducer(builder.opset), rank)
    refs: dict[tuple[str, str], tuple[str, str]] = {}

    def measure(key_: tuple[str, str], output: str, test: str) -> None:
        pairs.add(key_, output, test, output, output in classifiers)
        refs[key_] = (output, test)

    for o in outputs:
        measure((o, "int8"), o, o + qgraph.CUMULATIVE_SUFFIX)
    branch_nodes: dict[str, int] = {}
    changed: dict[tuple[int, str], set[str]] = {}
    # Read off the all-int8 model when one float site changes only that site: not with int16, nor with
    # the onnxruntime recipe's conditional sites (a float site can make later ones float: `effective`).
    direct = builder.fallback == Precision.FLOAT.value and not any(s.quantized_if for s in builder.sites)
    floats = FloatSiteBranches(builder, gg.base) if direct else None
    for k, site in enumerate(builder.sites):
        if subset is not None and site.node not in subset:
            continue
        variants: list[tuple[str, Callable[[], Branch], Callable[[str], str]]] = [
            (GAIN_TAG, _gain_branch(builder, gg, floats, k), gg.in_int8)
        ]
        if loss_if_only:
            only = ["float"] * n
            only[k] = "int8"
            variants.append((LOSS_TAG, partial(_diff_to, builder.proto, builder, only), gg.in_fp32))
        for tag, make_branch, locate in variants:
            branch = make_branch()
            names = gg.add(branch, f"{tag}{k}", locate)
            branch_nodes[f"{tag}{k}"] = len(branch.nodes)
            reached = _reached_outputs(branch, outputs, names, locate)
            changed[(k, tag)] = set(reached)
            for o, test in reached.items():
                measure((o, f"{tag}{k}"), o, test)
    per_run = len(gg.model.graph.node) + len(pairs.reducer.nodes)
    graph = GraphHandoff(pairs.reducer.attach(gg.take_model(), pairs.outputs(), in_place=True))
    session = open_session(runner, graph, opt_level=opt_level or gain_ort_level(builder.proto))
    batches = sweep(session, (samples if samples is not None else ctx.data.eval_set).batches(ctx.data.batch_size),
                    lambda feeds, values: pairs.update(values, refs), progress=progress, label="output gain")
    executions = per_run * batches
    base_rows = {o: pairs.row((o, "int8")) for o in outputs}
    table, replicates = _gain_table(ctx, builder, pairs, changed, base_rows, key, loss_if_only)
    return GainResult(
        table,
        base_rows,
        executions,
        len(gg.base.graph.node),
        len(builder.proto.graph.node),
        batches,
        time.perf_counter() - started,
        branch_nodes,
        replicates,
    )


def _gain_branch(
    builder: MixedBuilder, gg: GainGraph, floats: FloatSiteBranches | None, k: int
) -> Callable[[], Branch]:
    """How site k's gain branch is built: read off the all-int8 model (float fallback), else diffed."""
    if floats is not None:
        return partial(floats.branch, k)
    return partial(_diff_to, gg.base, builder, builder.precisions([builder.sites[k].node]))


def _diff_to(base: onnx.ModelProto, builder: MixedBuilder, prec: Sequence[str]) -> Branch:
    return diff_branch(base, builder.model(prec))


def _reached_outputs(
    branch: Branch, outputs: Iterable[str], names: Mapping[str, str], locate: Callable[[str], str]
) -> dict[str, str]:
    """Headline outputs a variant changes -> where its value is in the combined graph.

    Either a branch node writes the output, or the output lost/gained its QDQ pair (a float kernel at
    the graph's end): then it is the base model's raw tensor, reached through the alias.
    """
    found = {}
    for o in outputs:
        if o in branch.produced:
            found[o] = names[o]
        elif branch.alias.get(o, o) != o:
            found[o] = locate(branch.alias[o])
    return found


def _variant_rows(
    pairs: OutputPairs,
    dirty: set[str],
    tag: str,
    base_rows: Mapping[str, dict[str, float]],
    outputs: Iterable[str],
) -> dict[str, dict[str, float]]:
    """Per-output rows of a variant: measured where its branch reaches the output, else the base's."""
    return {o: pairs.row((o, tag)) if o in dirty else dict(base_rows[o]) for o in outputs}


_GAIN_KEYS = (("cosine", "cosine"), ("sqnr_db", "sqnr_db"), ("top1_agreement", "top1"))


def _gain_table(
    ctx: ScanContext,
    builder: MixedBuilder,
    pairs: OutputPairs,
    changed: Mapping[tuple[int, str], set[str]],
    base_rows: Mapping[str, dict[str, float]],
    key: str,
    loss_if_only: bool,
) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """The gain table (one row per measured site) and each site's cosine-gain jackknife replicates."""
    outputs = list(base_rows)
    replicates: dict[str, np.ndarray] = {}
    fp32_rows = {o: {"cosine": 1.0, "sqnr_db": math.inf, "top1_agreement": 1.0} for o in outputs}
    base_worst = {m: worst_output(base_rows, m)[1][m] for m, _ in _GAIN_KEYS if _has(base_rows, m)}
    base_replicates = _cosine_replicates(pairs, set(), "", outputs)
    rows = []
    for k, site in enumerate(ctx.graph.sites):  # the builder's sites, typed as the scan's
        if (k, GAIN_TAG) not in changed:
            continue
        tag = f"{GAIN_TAG}{k}"
        variant = _variant_rows(pairs, changed[(k, GAIN_TAG)], tag, base_rows, outputs)
        row: dict[str, Any] = {
            Col.NODE: site.node,
            Col.OP_TYPE: site.op_type,
            Col.KERNEL: site.kernel,
            Col.ORDER: ctx.graph.order.get(site.node, -1 if site.is_input else k),
            Col.OUTPUT: site.output,
            Col.REACHES_OUTPUT: bool(changed[(k, GAIN_TAG)]),
        }
        for m, short in _GAIN_KEYS:
            if m not in base_worst:
                continue
            value = worst_output(variant, m)[1][m]
            row[f"if_float_{short}"] = value
            row[f"gain_if_float_{short}"] = _minus(value, base_worst[m])
        row[Col.GAIN_IF_FLOAT] = row.get(f"gain_if_float_{_short(key)}", math.nan)
        gain_replicates = _cosine_replicates(pairs, changed[(k, GAIN_TAG)], tag, outputs) - base_replicates
        row[Col.GAIN_IF_FLOAT_COSINE_STDERR] = qm.jackknife_stderr(gain_replicates)
        replicates[site.node] = gain_replicates
        if loss_if_only:
            only = _variant_rows(pairs, changed[(k, LOSS_TAG)], f"{LOSS_TAG}{k}", fp32_rows, outputs)
            for m, short in _GAIN_KEYS:
                if m in base_worst:
                    row[f"if_only_{short}"] = worst_output(only, m)[1][m]
            value = row.get(f"if_only_{_short(key)}", math.nan)
            row[Col.LOSS_IF_ONLY] = value if key == "sqnr_db" else 1.0 - value
        rows.append(row)
    return pd.DataFrame(rows), replicates


def _cosine_replicates(pairs: OutputPairs, dirty: Collection[str], tag: str, outputs: Sequence[str]) -> np.ndarray:
    """The headline cosine's jackknife replicates: per left-out sample, the worst output's pooled cosine
    (an output the branch does not reach keeps the all-int8 pair's figures, as in `_variant_rows`). NaN
    (no standard error) when the outputs disagree on the sample count: a Loop's output without a batch axis
    reduces to one value per batch."""
    per_output = [pairs.cosine_replicates((o, tag) if o in dirty else (o, "int8")) for o in outputs]
    sizes = {r.size for r in per_output}
    if len(sizes) != 1:  # an output without a sample axis is one "sample" per batch: no per-sample replicates
        return np.full(max(sizes, default=0), np.nan)
    return np.asarray(np.min(np.vstack(per_output), axis=0), dtype=np.float64)


def _has(rows: Mapping[str, Mapping[str, float]], key: str) -> bool:
    return any(key in r for r in rows.values())


def _short(key: str) -> str:
    return {"cosine": "cosine", "sqnr_db": "sqnr_db", "top1_agreement": "top1"}[key]


def _minus(a: float, b: float) -> float:
    if math.isinf(a) and math.isinf(b) and a == b:
        return 0.0
    return a - b


def sensitivity_order(table: pd.DataFrame, key: str, broad: float = 0.0) -> list[str]:
    """Most helpful site first: gain in the target metric, then cosine gain, then graph order.

    `broad` > 0 (a robust bisection, bisect/robust.py) ranks a cosine gain by gain - broad x its jackknife
    standard error: a gain carried by a few samples is the kind that does not transfer to a chip.
    With `loss_if_only` measured (bisect --loss-if-only) a site ranks by the larger of its gain and its
    loss if it alone is int8 (issue 38: PicoDet's `p2o.Conv.4` costs 0.12 alone, yet every gain is
    <= 0.021: a loss that shows only beside other int8 sites); not for an SQNR target, whose
    loss_if_only column holds the SQNR itself."""
    short = _short(key)

    def score(value: Any) -> float:
        v = float(value)
        return -math.inf if math.isnan(v) else v

    def gain(r: Mapping[str, Any]) -> float:
        value = score(r.get(f"gain_if_float_{short}", math.nan))
        stderr = float(r.get(Col.GAIN_IF_FLOAT_COSINE_STDERR, math.nan))
        value = value - broad * stderr if broad > 0 and short == "cosine" and math.isfinite(stderr) else value
        return value if short == "sqnr_db" else max(value, score(r.get(Col.LOSS_IF_ONLY, math.nan)))

    ranked = sorted(
        table.to_dict("records"),
        key=lambda r: (
            -gain(r),
            -score(r.get(Col.GAIN_IF_FLOAT_COSINE, math.nan)),
            int(r[Col.ORDER]),
        ),
    )
    return [str(r[Col.NODE]) for r in ranked]
