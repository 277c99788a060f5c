"""`decompose-hardsigmoid`: HardSigmoid(x; alpha, beta) -> Clip(alpha·x + beta, 0, 1) (Mul, Add, Clip).

Why: chips without a HardSigmoid kernel run Mul/Add/Clip. The node's own alpha/beta are honoured:
Paddle exports use alpha = 0.2 (not PyTorch's 1/6), and a decomposition that assumed 1/6 would silently
change the SE blocks of every PP-LCNet / MobileNetV3 model. Exact up to float32 rounding; the Clip
writes the original output tensor name.
"""

from __future__ import annotations

import onnx

from quantscan.graph.edit import (
    attr_float,
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

REWRITE_ID = "decompose-hardsigmoid"
_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE}


def decompose_hardsigmoid(model: onnx.ModelProto) -> RewriteResult:
    """Replace every HardSigmoid by Mul/Add/Clip with its alpha/beta; return a new model and the record."""
    out = copy_model(model)
    graph = out.graph
    taken = GraphIndex(graph).taken_names()
    types = elem_types(out)
    result = RewriteResult(model=out)
    remove: set[int] = set()
    insert: dict[int, list[onnx.NodeProto]] = {}
    for pos, node in enumerate(graph.node):
        if node.op_type != "HardSigmoid" or node.domain not in ("", "ai.onnx"):
            continue
        label = node_label(node)
        x, y = node.input[0], node.output[0]
        etype = types.get(x)
        if etype is not None and etype not in _FLOAT_TYPES:
            result.refusals.append(Refusal(REWRITE_ID, label, f"input is not float (type {etype})"))
            continue
        alpha = attr_float(node, "alpha", 0.2)
        beta = attr_float(node, "beta", 0.5)
        dtype = np_dtype(etype)
        base = node.name or f"hardsigmoid_{pos}"
        t_mul, t_add = (unique_name(f"{base}/{s}", taken) for s in ("mul", "add"))
        a_name = scalar_input(out, f"{base}/alpha", alpha, dtype, taken)
        b_name = scalar_input(out, f"{base}/beta", beta, dtype, taken)
        new = [
            onnx.helper.make_node("Mul", [x, a_name], [t_mul], name=unique_name(f"{base}/Mul", taken)),
            onnx.helper.make_node("Add", [t_mul, b_name], [t_add], name=unique_name(f"{base}/Add", taken)),
        ]
        new += clip_nodes(out, t_add, y, 0.0, 1.0, dtype, unique_name(f"{base}/Clip", taken), taken)
        remove.add(pos)
        insert[pos] = new
        result.changes.append(
            Change(
                REWRITE_ID, label, f"HardSigmoid(alpha={alpha:g}, beta={beta:g}) -> Clip(alpha·x+beta,0,1)"
            )
        )
    if remove:
        splice(graph, remove, insert)
    return result
