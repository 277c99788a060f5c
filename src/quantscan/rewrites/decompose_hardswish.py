"""`decompose-hardswish`: HardSwish(x) -> x · Clip(x + 3, 0, 6) / 6 (Add, Clip, Mul, Div).

Why: many NPUs (and opsets < 14) have no HardSwish kernel but run Add/Clip(ReLU6)/Mul/Div natively;
this is the form their converters recognise. HardSwish has no attributes (alpha = 1/6, beta = 1/2 by
definition), so the decomposition is exact up to float32 rounding. The last node writes HardSwish's
output tensor, so downstream names are unchanged.
"""

from __future__ import annotations

import numpy as np
import onnx

from quantscan.graph.edit import clip_nodes, scalar_input, unique_name
from quantscan.rewrites.base import RewriteResult, expand_nodes

REWRITE_ID = "decompose-hardswish"


def decompose_hardswish(model: onnx.ModelProto) -> RewriteResult:
    """Replace every HardSwish by Add/Clip/Mul/Div; return a new model plus changes and refusals."""
    return expand_nodes(model, "HardSwish", REWRITE_ID, _add_clip_mul_div)


def _add_clip_mul_div(
    out: onnx.ModelProto, node: onnx.NodeProto, base: str, dtype: np.dtype, taken: set[str]
) -> tuple[list[onnx.NodeProto], str]:
    x, y = node.input[0], node.output[0]
    t_add, t_clip, t_mul = (unique_name(f"{base}/{s}", taken) for s in ("add", "clip", "mul"))
    three = scalar_input(out, f"{base}/three", 3.0, dtype, taken)
    six = scalar_input(out, f"{base}/six", 6.0, dtype, taken)
    new = [onnx.helper.make_node("Add", [x, three], [t_add], name=unique_name(f"{base}/Add", taken))]
    new += clip_nodes(out, t_add, t_clip, 0.0, 6.0, dtype, unique_name(f"{base}/Clip", taken), taken)
    new.append(onnx.helper.make_node("Mul", [x, t_clip], [t_mul], name=unique_name(f"{base}/Mul", taken)))
    new.append(onnx.helper.make_node("Div", [t_mul, six], [y], name=unique_name(f"{base}/Div", taken)))
    return new, "HardSwish -> x·Clip(x+3,0,6)/6 (Add, Clip, Mul, Div)"
