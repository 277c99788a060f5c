"""Reshape targets pinned to the static shapes they take, for converters that mis-read a computed shape.

Why: tpu-mlir 1.30.2 folds PP-OCRv4 rec's computed Reshape targets (`Shape -> ... -> Concat`) into
`[0, 40, 3, 8, 15]` (0: copy the input's first dim) and then flattens the MatMul before it to 2-D
(40x360), so its interpreter copies 40 instead of 1 and writes a 40x larger tensor than the one it
allocated: its float model departs from FP32 at the first attention block (output cosine 0.70 against
onnxruntime) and calibration dies of the overflow (SIGSEGV). The same graph with every Reshape target a
constant of the shape it produces at the one static input shape the converter builds (no 0, no -1)
converts and runs exactly (cosine 1.0). The values come from a run of the model (`quantscan.runner`);
this module only edits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from quantscan.graph.edit import add_initializer, copy_model, unique_name


def reshape_outputs(model: onnx.ModelProto) -> list[str]:
    """The output tensor of every main-graph Reshape (what a probe run must return to pin them)."""
    return [n.output[0] for n in model.graph.node if n.op_type == "Reshape" and n.output and n.output[0]]


def with_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    """A copy that also returns `names` as graph outputs (type left to the runtime)."""
    out = copy_model(model)
    present = {o.name for o in out.graph.output}
    for name in names:
        if name not in present:
            out.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    return out


def pin_reshape_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> tuple[onnx.ModelProto, int]:
    """A copy where each Reshape whose output is in `shapes` reads a new int64 constant of that shape;
    returns it and how many were pinned. The old shape computation is left for the converter to drop."""
    out = copy_model(model)
    taken = {i.name for i in out.graph.initializer} | {t for n in out.graph.node for t in (*n.input, *n.output)}
    pinned = 0
    for node in out.graph.node:
        if node.op_type != "Reshape" or len(node.input) < 2 or node.output[0] not in shapes:
            continue
        name = unique_name(f"{node.output[0]}__static_shape", taken)
        add_initializer(out, name, np.asarray(list(shapes[node.output[0]]), dtype=np.int64))
        node.input[1] = name
        pinned += 1
    return out, pinned
