"""Read where a QDQ model quantizes, node by node, in the names of the float model it came from.

Why: the `onnxruntime` profile's recipe is quantize_static's, and the exact placement (which inputs
and outputs of which node carry a QuantizeLinear/DequantizeLinear pair, their scales, the int8
weights and int32 biases) is best read from the model quantize_static writes rather than guessed.
This module turns such a model back into quantscan's terms (a `QuantPlan` plus one
`NodePlacement` per float-model node it touches), so the usual analysis, output gain and bisection
run on it.

onnxruntime's naming (onnxruntime/quantization/qdq_quantizer.py, 1.17-1.32): an activation `t`
gets `t -> QuantizeLinear -> DequantizeLinear -> t_DequantizeLinear_Output`; a graph output `t` is
written as `t_QuantizeLinear_Input` and the DequantizeLinear writes `t`; an initializer `w` is stored
as `w_quantized` with a DequantizeLinear. Names are not trusted beyond that suffix: tensors are traced
through the Q/DQ nodes back to a name the float model has.

Pure onnx/numpy: no onnxruntime here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from quantscan.graph.qdq import BiasQuant, QuantPlan, WeightQuant
from quantscan.quant import QParams

QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
QUANTIZED_SUFFIX = "_quantized"
GRAPH_OUTPUT_SUFFIX = "_QuantizeLinear_Input"


@dataclass
class NodePlacement:
    """One float-model node and where the QDQ model quantizes around it (float-model names)."""

    node: str
    inputs: list[str] = field(default_factory=list)
    """Activation inputs read through a DequantizeLinear."""
    outputs: list[str] = field(default_factory=list)
    """Outputs followed by a QuantizeLinear."""
    weights: list[tuple[str, int | None]] = field(default_factory=list)
    """Initializer inputs stored quantized (int8/int16), with their per-channel axis (None: per tensor)."""
    bias: str | None = None
    """An initializer input stored as int32 at s_in*s_w."""
    writes: list[str] = field(default_factory=list)
    """Float-model tensors this node writes in the QDQ model that another float-model node wrote
    (onnxruntime removes a Relu/Clip after a quantized output and lets its producer write its name)."""


@dataclass
class QdqPlacement:
    """A QDQ model read back: the plan (scales, integer weights) and per-node placement."""

    plan: QuantPlan
    nodes: dict[str, NodePlacement]
    removed: list[str]
    """Float-model nodes the QDQ model no longer has (removed activations)."""


def _arrays(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _qparams(node: onnx.NodeProto, arrays: Mapping[str, np.ndarray]) -> QParams:
    scale = np.asarray(arrays[node.input[1]], dtype=np.float32)
    zp = np.asarray(arrays[node.input[2]]) if len(node.input) > 2 and node.input[2] else np.zeros(scale.shape, np.uint8)
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1) if scale.ndim == 1 else None
    return QParams(scale, zp, axis)


def read_placement(qdq: onnx.ModelProto, fp32: onnx.ModelProto) -> QdqPlacement:
    """Where `qdq` (quantize_static's output for `fp32`) quantizes, in `fp32`'s names."""
    arrays = _arrays(qdq)
    fp32_inits = {t.name for t in fp32.graph.initializer}
    fp32_tensors = fp32_inits | {i.name for i in fp32.graph.input} | {o for n in fp32.graph.node for o in n.output}
    producers = {o: n for n in qdq.graph.node for o in n.output if o}
    plan = QuantPlan()
    dq_source: dict[str, tuple[str, str]] = {}  # DQ output -> ("act"|"weight"|"bias", float-model name)
    for node in qdq.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        src = node.input[0]
        if src in arrays:
            name = src[: -len(QUANTIZED_SUFFIX)] if src.endswith(QUANTIZED_SUFFIX) else src
            if name not in fp32_inits:
                continue
            qp = _qparams(node, arrays)
            values = arrays[src]
            if values.dtype == np.int32:
                plan.biases[name] = BiasQuant(name, values, np.asarray(qp.scale, np.float32))
                dq_source[node.output[0]] = ("bias", name)
            else:
                plan.weights[name] = WeightQuant(name, qp, values)
                dq_source[node.output[0]] = ("weight", name)
            continue
        q = producers.get(src)
        if q is None or q.op_type != "QuantizeLinear":
            continue
        tensor = _float_name(q.input[0], node.output[0], fp32_tensors)
        plan.activations[tensor] = _qparams(q, arrays)
        dq_source[node.output[0]] = ("act", tensor)
    fp32_producer = {o: n.name for n in fp32.graph.node for o in n.output if o}
    kept = {n.name for n in qdq.graph.node if n.op_type not in QDQ_OPS}
    nodes: dict[str, NodePlacement] = {}
    for node in qdq.graph.node:
        if node.op_type in QDQ_OPS:
            continue
        place = NodePlacement(node.name)
        for name in node.input:
            kind, original = dq_source.get(name, ("", ""))
            if kind == "act" and original not in place.inputs:
                place.inputs.append(original)
            elif kind == "weight":
                place.weights.append((original, plan.weights[original].qparams.axis))
            elif kind == "bias":
                place.bias = original
        for out in node.output:
            original = out[: -len(GRAPH_OUTPUT_SUFFIX)] if out.endswith(GRAPH_OUTPUT_SUFFIX) else out
            if original in plan.activations:
                place.outputs.append(original)
            if fp32_producer.get(original, node.name) != node.name:
                place.writes.append(original)
        nodes[node.name] = place
    removed = [n.name for n in fp32.graph.node if n.name not in kept]
    return QdqPlacement(plan, nodes, removed)


def _float_name(q_input: str, dq_output: str, fp32_tensors: set[str]) -> str:
    """The float-model tensor a Q->DQ pair quantizes: the Q's input, or for a graph output the DQ's output."""
    if q_input in fp32_tensors:
        return q_input
    if q_input.endswith(GRAPH_OUTPUT_SUFFIX) and q_input[: -len(GRAPH_OUTPUT_SUFFIX)] in fp32_tensors:
        return q_input[: -len(GRAPH_OUTPUT_SUFFIX)]
    return dq_output
