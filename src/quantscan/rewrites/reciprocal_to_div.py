"""`reciprocal`: Reciprocal(x) -> Div(1, x), for chips that run Div but not Reciprocal.

Why: RKNN (rk3568/rk3588) and TIDL list Div among their NPU ops but not Reciprocal, which exporters
write for 1/sqrt(var) in normalisations and 1/x in sigmoid-like gates; the converter rejects the
model. Div(1, x) is the correctly rounded 1/x (onnx.reference gives identical bits); onnxruntime's
Reciprocal kernel is not always correctly rounded, so against it the result differs by up to one float
rounding (1.5e-8 on an output of range 0.5 in the tests), which the exact proof accepts. Refused: integer
Reciprocal (not an ONNX type for it, left alone) and a node whose input type shape inference cannot
tell (no constant 1 of the right type can be written). A Reciprocal of a constant folds anyway and is
left to constant folding.
"""

from __future__ import annotations

import numpy as np
import onnx

from quantscan.graph.edit import copy_model, elem_types, node_label, np_dtype, scalar_input
from quantscan.graph.index import GraphIndex, is_op
from quantscan.rewrites.base import FLOAT_TYPES, Change, Refusal, RewriteResult

REWRITE_ID = "reciprocal"


def reciprocal_to_div(model: onnx.ModelProto) -> RewriteResult:
    """Replace every float Reciprocal by a Div of a constant one; the input model is not mutated."""
    out = copy_model(model)
    index = GraphIndex.of(out)
    taken = index.taken_names()
    types = elem_types(out)
    result = RewriteResult(model=out)
    for node in out.graph.node:
        if not is_op(node, "Reciprocal") or not node.input:
            continue
        label = node_label(node)
        if index.constant(node.input[0]) is not None:
            result.refusals.append(Refusal(REWRITE_ID, label, "input is a constant: constant folding removes it"))
            continue
        etype = types.get(node.input[0])
        if etype not in FLOAT_TYPES:
            result.refusals.append(Refusal(REWRITE_ID, label, f"input type unknown or not float ({etype})"))
            continue
        dtype = np_dtype(etype)
        one = scalar_input(out, f"{node.name or 'reciprocal'}/one", 1.0, np.dtype(dtype), taken)
        node.op_type = "Div"
        node.input.insert(0, one)
        result.changes.append(Change(REWRITE_ID, label, f"Reciprocal -> Div(1, x) ({dtype}): 1/x correctly rounded"))
    return result
