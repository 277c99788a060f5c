"""ONNX graph surgery: expose tensors, insert QuantizeLinear/DequantizeLinear, build isolated twins.

No onnxruntime here: this module only writes graphs. The fake-quant model it builds is standard
ONNX (QDQ), so the user can open it in Netron or run it in any runtime; tensor and output names are
those of the original model (the producer of a quantized tensor writes `<name>__f32`, the
DequantizeLinear writes `<name>`), so every consumer, and every graph output, reads the quantized
value under its original name.

The *analysis model* is one graph holding three things at once, so a single onnxruntime run per
batch yields every figure (instead of one network run per layer, which is what peers do):
  1. the FP32 prepared graph, names unchanged;
  2. the cumulative QDQ copy, every produced tensor suffixed `@q`;
  3. one *isolated twin* per site: the site's nodes again, fed QDQ(FP32 inputs) and the same fake
     quantized weights, output suffixed `@iso<k>`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import ml_dtypes
import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscan.graph.edit import copy_without_initializers
from quantscan.graph.index import subgraph_inputs
from quantscan.quant import QParams, expand_blocks


class QuantSite(Protocol):
    """What QDQ insertion needs of a quantization site (`quantscan.sites.Site` is one).

    A protocol rather than an import so the graph layer depends on nothing above it.
    """

    @property
    def nodes(self) -> list[str]: ...
    @property
    def inputs(self) -> list[str]: ...
    @property
    def output(self) -> str: ...
    @property
    def weight(self) -> str | None: ...
    @property
    def bias(self) -> str | None: ...
    @property
    def extra_weights(self) -> list[tuple[str, int]]: ...
    @property
    def inner(self) -> list[str]: ...


CUMULATIVE_SUFFIX = "@q"
F32_SUFFIX = "__f32"


WEIGHT_ONLY = "w"
"""Suffix of a site's weight-only twin (`@iso<k>w`): only its weights quantized, FP32 inputs and output."""
ACT_ONLY = "a"
"""Suffix of a site's activation-only twin (`@iso<k>a`): its inputs and output quantized, FP32 weights."""


def iso_name(tensor: str, k: int, part: str = "") -> str:
    """Site k's isolated output (`part` "": the whole twin; WEIGHT_ONLY or ACT_ONLY: one half of it)."""
    return f"{tensor}@iso{k}{part}"


def activation_tag(tensor: str) -> str:
    """Prefix of the QuantizeLinear/DequantizeLinear pair (and their scale/zero point) of an activation."""
    return f"{tensor}__act"


def activation_qdq_names(tensor: str) -> tuple[str, str]:
    """Node names of an activation's QuantizeLinear and DequantizeLinear (see `qdq_nodes`)."""
    tag = activation_tag(tensor)
    return f"{tag}__Q", f"{tag}__DQ"


def activation_scale(tensor: str) -> str:
    """The scale initializer of an activation's QuantizeLinear/DequantizeLinear pair (see `qdq_nodes`)."""
    return scale_of(activation_tag(tensor))


def scale_of(tag: str) -> str:
    """The scale initializer of the QDQ pair named `tag` (`qdq_nodes`)."""
    return f"{tag}__scale"


def activation_codes(tensor: str) -> str:
    """The QuantizeLinear output (the integer codes) of an activation (see `qdq_nodes`)."""
    return f"{activation_tag(tensor)}__q"


def input_alias(tensor: str) -> str:
    """What consumers of a quantized graph input read: the DequantizeLinear output beside the input."""
    return f"{tensor}__qdq"


def weight_dq_output(name: str) -> str:
    """The DequantizeLinear output a quantized site reads in place of its weight/bias initializer."""
    return f"{name}__dq"


@dataclass
class WeightQuant:
    """A weight initializer and its per-channel int8 (or int16) parameters."""

    name: str
    qparams: QParams
    values: np.ndarray  # the quantized integers, same shape as the weight


@dataclass
class BiasQuant:
    """A bias as int32 at scale s_in·s_w (per output channel)."""

    name: str
    values: np.ndarray  # int32
    scale: np.ndarray  # float32 per channel


@dataclass
class QuantPlan:
    """Everything needed to fake-quantize a prepared model.

    `activations` maps each quantized tensor to its parameters; `weights` and `biases` are keyed by
    the initializer name. Sites absent from `float_sites` are quantized; those in it keep float.
    """

    activations: dict[str, QParams] = field(default_factory=dict)
    weights: dict[str, WeightQuant] = field(default_factory=dict)
    biases: dict[str, BiasQuant] = field(default_factory=dict)


def _const(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def qdq_nodes(src: str, dst: str, qp: QParams, tag: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """QuantizeLinear(src) -> DequantizeLinear -> dst, with per-tensor or per-channel parameters."""
    scale_name, zp_name = scale_of(tag), f"{tag}__zp"
    inits = [_const(scale_name, qp.scale.astype(np.float32)), _const(zp_name, qp.zero_point)]
    kwargs: dict[str, Any] = {"axis": qp.axis} if qp.axis is not None else {}
    q = helper.make_node("QuantizeLinear", [src, scale_name, zp_name], [f"{tag}__q"], name=f"{tag}__Q", **kwargs)
    dq = helper.make_node(
        "DequantizeLinear", [f"{tag}__q", scale_name, zp_name], [dst], name=f"{tag}__DQ", **kwargs
    )
    return [q, dq], inits


def _dq_const_nodes(
    name: str, values: np.ndarray, scale: np.ndarray, zero_point: np.ndarray, axis: int | None,
    block_size: int | None = None, bits: int | None = None,
) -> tuple[onnx.NodeProto, list[onnx.TensorProto], str]:
    """A stored integer initializer and its DequantizeLinear: how QDQ models hold weights. 4-bit codes
    are stored as ONNX INT4/UINT4 and blocked parameters get `block_size` (both opset 21)."""
    qname, sname, zname, out = f"{name}__quantized", f"{name}__scale", f"{name}__zp", weight_dq_output(name)
    inits = [_const(qname, _stored(values, bits)), _const(sname, scale.astype(np.float32)),
             _const(zname, _stored(zero_point, bits))]
    kwargs: dict[str, Any] = {"axis": axis} if axis is not None and np.asarray(scale).ndim == 1 else {}
    if block_size:
        kwargs = {"axis": axis, "block_size": block_size}
    node = helper.make_node("DequantizeLinear", [qname, sname, zname], [out], name=f"{name}__DQ", **kwargs)
    return node, inits, out


def _stored(codes: np.ndarray, bits: int | None) -> np.ndarray:
    """Integer codes in their ONNX storage type: 4-bit codes (held in int8/uint8) as INT4/UINT4."""
    if bits != 4:
        return np.asarray(codes)
    arr = np.asarray(codes)
    return arr.astype(ml_dtypes.int4 if arr.dtype == np.int8 else ml_dtypes.uint4)


def weight_quant_dq(tag: str, w: WeightQuant) -> tuple[onnx.NodeProto, list[onnx.TensorProto], str]:
    """The DequantizeLinear of a quantized weight stored under `tag` (its own name, or a variant's)."""
    qp = w.qparams
    return _dq_const_nodes(tag, w.values, qp.scale, qp.zero_point, qp.axis, qp.block_size, qp.bits)


def weight_dq(plan: QuantPlan, weight: str) -> tuple[onnx.NodeProto, list[onnx.TensorProto], str]:
    return weight_quant_dq(weight, plan.weights[weight])


def bias_dq(plan: QuantPlan, bias: str) -> tuple[onnx.NodeProto, list[onnx.TensorProto], str]:
    b = plan.biases[bias]
    return _dq_const_nodes(bias, b.values, b.scale, np.zeros(b.scale.shape, np.int32), 0)


def build_qdq_model(model: onnx.ModelProto, sites: Sequence[QuantSite], plan: QuantPlan) -> onnx.ModelProto:
    """The fake-quant model as the chip would compute it: same inputs, same output names.

    Built on a copy without initializers, adding only those still read: a deep copy whose replaced
    weights were then pruned kept them alive with the copy (protobuf frees a message as a whole),
    one dead FP32 copy of every quantized weight in each QDQ model (BERT-base: 330 MB).
    """
    out = copy_without_initializers(model)
    graph = out.graph
    graph_inputs = {i.name for i in graph.input}
    new_nodes: list[onnx.NodeProto] = []
    new_inits: list[onnx.TensorProto] = []
    weight_out: dict[str, str] = {}
    for site in sites:
        for name in [site.weight, site.bias, *(w for w, _ in site.extra_weights)]:
            if not name or name in weight_out:
                continue
            if name in plan.weights:
                node, inits, dq = weight_dq(plan, name)
            elif name in plan.biases:
                node, inits, dq = bias_dq(plan, name)
            else:
                continue
            new_nodes.append(node)
            new_inits.extend(inits)
            weight_out[name] = dq
    site_nodes = {n for s in sites for n in s.nodes}
    # Rewire the sites' weight inputs to their DequantizeLinear outputs.
    for node in graph.node:
        if node.name not in site_nodes:
            continue
        for pos, name in enumerate(node.input):
            if name in weight_out:
                node.input[pos] = weight_out[name]
    # Activations: rename the producer's output, the DequantizeLinear takes the original name.
    aliased: dict[str, str] = {}
    producers = {o: n for n in graph.node for o in n.output}
    for tensor, qp in plan.activations.items():
        tag = activation_tag(tensor)
        if tensor in graph_inputs:
            alias = input_alias(tensor)
            nodes, inits = qdq_nodes(tensor, alias, qp, tag)
            aliased[tensor] = alias
        else:
            producer = producers.get(tensor)
            if producer is None:
                continue
            producer.output[list(producer.output).index(tensor)] = tensor + F32_SUFFIX
            nodes, inits = qdq_nodes(tensor + F32_SUFFIX, tensor, qp, tag)
        new_nodes.extend(nodes)
        new_inits.extend(inits)
    if aliased:
        for node in graph.node:
            for pos, name in enumerate(node.input):
                if name in aliased:
                    node.input[pos] = aliased[name]
    graph.node.extend(new_nodes)
    used = _names_read(graph)
    graph.initializer.extend(t for t in [*model.graph.initializer, *new_inits] if t.name in used)
    return topological_sort(out)


def _names_read(graph: onnx.GraphProto) -> set[str]:
    """What the graph's nodes and outputs read: the initializers worth keeping. An If/Loop body reading
    one from the outer graph reads it too (dropping those made onnxruntime reject the QDQ model of any
    model with a body left float)."""
    used = {i for n in graph.node for i in (*n.input, *subgraph_inputs(n))}
    return used | {o.name for o in graph.output}


def topological_sort(model: onnx.ModelProto) -> onnx.ModelProto:
    """Order nodes so each comes after its producers (inserted Q/DQ nodes were appended)."""
    graph = model.graph
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(graph.node)
    ordered: list[onnx.NodeProto] = []
    produced_by = {o: i for i, n in enumerate(pending) for o in n.output}
    visited: set[int] = set()

    def visit(i: int) -> None:
        stack = [(i, False)]
        while stack:
            idx, done = stack.pop()
            if done:
                ordered.append(pending[idx])
                continue
            if idx in visited:
                continue
            visited.add(idx)
            stack.append((idx, True))
            for name in reversed(pending[idx].input):
                j = produced_by.get(name)
                if name not in available and j is not None and j not in visited:
                    stack.append((j, False))

    for i in range(len(pending)):
        visit(i)
    del graph.node[:]
    graph.node.extend(ordered)
    return model


def expose(model: onnx.ModelProto, tensors: Iterable[str]) -> onnx.ModelProto:
    """Mark tensors as graph outputs (types left to the runtime); returns a new model."""
    out = copy.deepcopy(model)
    existing = {o.name for o in out.graph.output}
    for name in tensors:
        if name not in existing:
            out.graph.output.append(onnx.ValueInfoProto(name=name))
            existing.add(name)
    return out


def _suffix_copy(model: onnx.ModelProto, suffix: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Every node of `model` with produced tensors and node names suffixed; inputs/initializers kept."""
    produced = {o for n in model.graph.node for o in n.output if o}
    nodes = []
    for node in model.graph.node:
        new = copy.deepcopy(node)
        new.name = node.name + suffix
        for pos, name in enumerate(new.input):
            if name in produced:
                new.input[pos] = name + suffix
        for pos, name in enumerate(new.output):
            if name:
                new.output[pos] = name + suffix
        nodes.append(new)
    return nodes, list(model.graph.initializer)


def build_analysis_model(
    fp32: onnx.ModelProto,
    qdq: onnx.ModelProto,
    sites: Sequence[QuantSite],
    plan: QuantPlan,
    *,
    isolated: Iterable[int],
    split: Iterable[int] = (),
) -> onnx.ModelProto:
    """FP32 graph + cumulative QDQ copy + isolated twins in one model; see the module docstring.

    The graph outputs are left as the FP32 model's: callers choose what to read (usually through a
    `Reducer`). Tensor `t` of the cumulative copy is `t@q`; site k's isolated output is
    `site.output@iso<k>`. Sites in `split` also get a weight-only and an activation-only twin
    (`@iso<k>w`, `@iso<k>a`): which half of the quantization the site's error comes from.
    """
    model = copy.deepcopy(fp32)
    graph = model.graph
    existing_inits = {t.name for t in graph.initializer}
    q_nodes, q_inits = _suffix_copy(qdq, CUMULATIVE_SUFFIX)
    q_nodes, folded = _fold_constant_dequantize(q_nodes, q_inits)
    graph.node.extend(q_nodes)
    for t in [*q_inits, *folded]:
        if t.name not in existing_inits:
            graph.initializer.append(t)
            existing_inits.add(t.name)
    fp32_nodes = {n.name: n for n in fp32.graph.node}
    weight_dq_names = _weight_dq_outputs(qdq)
    twins = [(k, "") for k in isolated] + [(k, part) for k in split for part in (WEIGHT_ONLY, ACT_ONLY)]
    for k, part in twins:
        nodes, inits = isolated_twin(sites[k], k, fp32_nodes, plan, weight_dq_names, part)
        graph.node.extend(nodes)
        for t in inits:
            if t.name not in existing_inits:
                graph.initializer.append(t)
                existing_inits.add(t.name)
    return model


def _fold_constant_dequantize(
    nodes: list[onnx.NodeProto], inits: Sequence[onnx.TensorProto]
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Replace DequantizeLinear of stored weights/biases by their float values.

    onnxruntime never constant-folds DequantizeLinear (it keeps it for QDQ fusion), so the analysis
    session would dequantize every weight on every run. The values are identical: (q − zp)·s in
    float32, the same arithmetic DequantizeLinear does. The saved QDQ model keeps the int8 + DQ form.
    """
    values = {t.name: t for t in inits}
    kept: list[onnx.NodeProto] = []
    folded: list[onnx.TensorProto] = []
    for node in nodes:
        if node.op_type != "DequantizeLinear" or not all(i in values for i in node.input if i):
            kept.append(node)
            continue
        q = numpy_helper.to_array(values[node.input[0]]).astype(np.float32)
        scale = numpy_helper.to_array(values[node.input[1]]).astype(np.float32)
        zp = numpy_helper.to_array(values[node.input[2]]).astype(np.float32) if len(node.input) > 2 else 0.0
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        block = next((a.i for a in node.attribute if a.name == "block_size"), 0)
        if block:
            ax = axis % q.ndim
            scale = expand_blocks(scale, ax, block, q.shape[ax])
            zp = expand_blocks(np.asarray(zp), ax, block, q.shape[ax]) if np.ndim(zp) else zp
        elif np.ndim(scale) == 1 and q.ndim > 0:
            shape = [1] * q.ndim
            shape[axis % q.ndim] = -1
            scale = scale.reshape(shape)
            zp = np.reshape(zp, shape) if np.ndim(zp) == 1 else zp
        folded.append(numpy_helper.from_array(((q - zp) * scale).astype(np.float32), node.output[0]))
    return kept, folded


def _weight_dq_outputs(qdq: onnx.ModelProto) -> dict[str, str]:
    """Original weight name -> the suffixed DequantizeLinear output carrying its fake-quant value."""
    found = {}
    for node in qdq.graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0].endswith("__quantized"):
            original = node.input[0][: -len("__quantized")]
            found[original] = node.output[0] + CUMULATIVE_SUFFIX
    return found


def isolated_twin(
    site: QuantSite,
    k: int,
    fp32_nodes: Mapping[str, onnx.NodeProto],
    plan: QuantPlan,
    weight_dq_names: Mapping[str, str],
    part: str = "",
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The site's nodes again, reading QDQ(FP32 inputs) and fake-quant weights; output QDQ'd. `part`
    WEIGHT_ONLY keeps the inputs and output FP32 (only the weights quantized), ACT_ONLY keeps the
    weights FP32 (only the activations quantized): Horizon's and AIMET's per-layer split of the error."""
    suffix = f"@iso{k}{part}"
    acts, weights = part != WEIGHT_ONLY, part != ACT_ONLY
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    rename: dict[str, str] = {}
    for name in site.inputs:
        qp = plan.activations.get(name) if acts else None
        if qp is None:
            continue
        pair_nodes, pair_inits = qdq_nodes(name, name + suffix, qp, f"{name}{suffix}__in")
        nodes.extend(pair_nodes)
        inits.extend(pair_inits)
        rename[name] = name + suffix
    for wname in [site.weight, site.bias, *(w for w, _ in site.extra_weights)] if weights else []:
        if wname and wname in weight_dq_names:
            rename[wname] = weight_dq_names[wname]
    inner = {o for n in site.nodes for o in fp32_nodes[n].output if o}
    out_qp = plan.activations.get(site.output) if acts else None
    if not site.nodes:  # a model input as a site (sites.input_sites): its twin is QDQ(x) itself
        if out_qp is None:
            return nodes, inits
        return qdq_nodes(site.output, iso_name(site.output, k, part), out_qp, f"{site.output}{suffix}__out")
    for node_name in site.nodes:
        node = copy.deepcopy(fp32_nodes[node_name])
        node.name = node.name + suffix
        for pos, name in enumerate(node.input):
            if name in rename:
                node.input[pos] = rename[name]
            elif name in inner:
                node.input[pos] = name + suffix
        inner_pairs: list[onnx.NodeProto] = []
        for pos, name in enumerate(node.output):
            if not name:
                continue
            if name == site.output and out_qp is not None:
                node.output[pos] = name + suffix + F32_SUFFIX
            elif acts and name in site.inner and name in plan.activations:  # a point inside the kernel
                node.output[pos] = name + suffix + F32_SUFFIX
                pair_nodes, pair_inits = qdq_nodes(name + suffix + F32_SUFFIX, name + suffix,
                                                   plan.activations[name], f"{name}{suffix}__inner")
                inner_pairs.extend(pair_nodes)
                inits.extend(pair_inits)
            else:
                node.output[pos] = name + suffix
        nodes.append(node)
        nodes.extend(inner_pairs)
    if out_qp is not None:
        pair_nodes, pair_inits = qdq_nodes(
            site.output + suffix + F32_SUFFIX, iso_name(site.output, k, part), out_qp, f"{site.output}{suffix}__out"
        )
        nodes.extend(pair_nodes)
        inits.extend(pair_inits)
    return nodes, inits
