"""`decompose-hardswish`: HardSwish(x) -> x · Clip(x + 3, 0, 6) / 6 (Add, Clip, Mul, Div).

Why: many NPUs (and opsets < 14) have no HardSwish kernel but run Add/Clip(ReLU6)/Mul/Div natively;
this is the form their converters recognise. HardSwish has no attributes (alpha = 1/6, beta = 1/2 by
definition), so the decomposition is exact up to float32 rounding. The last node writes HardSwish's
output tensor, so downstream names are unchanged.
"""

from __future__ import annotations

import onnx

from quantscan.graph.edit import (
    clip_nodes,
    copy_model,
    elem_types,
    node_label,
    np_dtype,
    scalar_input,
    splice,
    unique_name,
)
from quantscan.graph.index import GraphIndex
from quantscan.rewrites.base import Change, Refusal, RewriteResult

REWRITE_ID = "decompose-hardswish"
_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE}


def decompose_hardswish(model: onnx.ModelProto) -> RewriteResult:
    """Replace every HardSwish by Add/Clip/Mul/Div; return a new model plus changes and refusals."""
    out = copy_model(model)
    graph = out.graph
    taken = GraphIndex(graph).taken_names()
    types = elem_types(out)
    result = RewriteResult(model=out)
    remove: set[int] = set()
    insert: dict[int, list[onnx.NodeProto]] = {}
    for pos, node in enumerate(graph.node):
        if node.op_type != "HardSwish" or node.domain not in ("", "ai.onnx"):
            continue
        label = node_label(node)
        x, y = node.input[0], node.output[0]
        etype = types.get(x)
        if etype is not None and etype not in _FLOAT_TYPES:
            result.refusals.append(Refusal(REWRITE_ID, label, f"input is not float (type {etype})"))
            continue
        dtype = np_dtype(etype)
        base = node.name or f"hardswish_{pos}"
        t_add, t_clip, t_mul = (unique_name(f"{base}/{s}", taken) for s in ("add", "clip", "mul"))
        three = scalar_input(out, f"{base}/three", 3.0, dtype, taken)
        six = scalar_input(out, f"{base}/six", 6.0, dtype, taken)
        new = [onnx.helper.make_node("Add", [x, three], [t_add], name=unique_name(f"{base}/Add", taken))]
        new += clip_nodes(out, t_add, t_clip, 0.0, 6.0, dtype, unique_name(f"{base}/Clip", taken), taken)
        new.append(onnx.helper.make_node("Mul", [x, t_clip], [t_mul], name=unique_name(f"{base}/Mul", taken)))
        new.append(onnx.helper.make_node("Div", [t_mul, six], [y], name=unique_name(f"{base}/Div", taken)))
        remove.add(pos)
        insert[pos] = new
        result.changes.append(
            Change(REWRITE_ID, label, "HardSwish -> x·Clip(x+3,0,6)/6 (Add, Clip, Mul, Div)")
        )
    if remove:
        splice(graph, remove, insert)
    return result
