"""float64 models measured as float32: the analysis copy computes in float, with Casts at the edges.

Why: QuantizeLinear takes float, float16 or bfloat16 inputs, never double, so a QDQ graph built on a
valid float64 model is invalid (onnxruntime's INVALID_GRAPH). An int8 deployment computes in float32
anyway, so the analysis copy turns every double initializer, constant and Cast target into float32,
casts double graph inputs to float once at the start and float outputs back to double at the end.
The user's feeds and outputs keep their dtype; only the inside of the graph changes.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

DOUBLE, FLOAT = onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT
INPUT_SUFFIX = "__f32"
OUTPUT_SUFFIX = "__f32_out"


def has_float64(proto: onnx.ModelProto) -> bool:
    """True when the main graph has a double input, output or initializer (what the rewrite handles)."""
    g = proto.graph
    return (any(t.data_type == DOUBLE for t in g.initializer)
            or any(v.type.tensor_type.elem_type == DOUBLE for v in [*g.input, *g.output]))


def float64_to_float32(proto: onnx.ModelProto) -> int:
    """Rewrite the main graph of `proto` in place to compute in float32; returns how many things changed."""
    g = proto.graph
    changed = 0
    for index, tensor in enumerate(g.initializer):
        if tensor.data_type == DOUBLE:
            g.initializer[index].CopyFrom(_to_float(tensor))
            changed += 1
    for node in g.node:
        changed += _node_to_float(node)
    for vi in g.value_info:
        if vi.type.tensor_type.elem_type == DOUBLE:
            vi.type.tensor_type.elem_type = FLOAT
    changed += _cast_inputs(g) + _cast_outputs(g)
    return changed


def _to_float(tensor: onnx.TensorProto) -> onnx.TensorProto:
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name)


def _node_to_float(node: onnx.NodeProto) -> int:
    changed = 0
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == DOUBLE:
            attr.t.CopyFrom(_to_float(attr.t))
            changed += 1
        elif attr.type == onnx.AttributeProto.INT and attr.name in ("to", "dtype") and attr.i == DOUBLE:
            attr.i = FLOAT
            changed += 1
    return changed


def _rename_uses(g: onnx.GraphProto, old: str, new: str) -> None:
    for node in g.node:
        for k, name in enumerate(node.input):
            if name == old:
                node.input[k] = new


def _cast_inputs(g: onnx.GraphProto) -> int:
    casts = []
    for vi in g.input:
        if vi.type.tensor_type.elem_type != DOUBLE:
            continue
        inner = vi.name + INPUT_SUFFIX
        _rename_uses(g, vi.name, inner)
        casts.append(onnx.helper.make_node("Cast", [vi.name], [inner], to=FLOAT, name=inner + "_cast"))
    for cast in reversed(casts):
        g.node.insert(0, cast)
    return len(casts)


def _cast_outputs(g: onnx.GraphProto) -> int:
    count = 0
    inputs = {vi.name for vi in g.input}
    for vi in g.output:
        if vi.type.tensor_type.elem_type != DOUBLE:
            continue
        if vi.name in inputs:  # a pass-through output: the input keeps its dtype, nothing to cast
            continue
        inner = vi.name + OUTPUT_SUFFIX
        for node in g.node:
            for k, name in enumerate(node.output):
                if name == vi.name:
                    node.output[k] = inner
        _rename_uses(g, vi.name, inner)
        g.node.append(onnx.helper.make_node("Cast", [inner], [vi.name], to=DOUBLE, name=vi.name + "_cast"))
        count += 1
    return count
