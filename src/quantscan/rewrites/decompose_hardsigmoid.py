"""`decompose-hardsigmoid`: HardSigmoid(x; alpha, beta) -> Clip(alpha·x + beta, 0, 1) (Mul, Add, Clip).

Why: chips without a HardSigmoid kernel run Mul/Add/Clip. The node's own alpha/beta are honoured:
Paddle exports use alpha = 0.2 (not PyTorch's 1/6), and a decomposition that assumed 1/6 would silently
change the SE blocks of every PP-LCNet / MobileNetV3 model. Exact up to float32 rounding; the Clip
writes the original output tensor name.
"""

from __future__ import annotations

import numpy as np
import onnx

from quantscan.graph.edit import attr_float, clip_nodes, scalar_input, unique_name
from quantscan.rewrites.base import RewriteResult, expand_nodes

REWRITE_ID = "decompose-hardsigmoid"


def decompose_hardsigmoid(model: onnx.ModelProto) -> RewriteResult:
    """Replace every HardSigmoid by Mul/Add/Clip with its alpha/beta; return a new model and the record."""
    return expand_nodes(model, "HardSigmoid", REWRITE_ID, _mul_add_clip)


def _mul_add_clip(
    out: onnx.ModelProto, node: onnx.NodeProto, base: str, dtype: np.dtype, taken: set[str]
) -> tuple[list[onnx.NodeProto], str]:
    x, y = node.input[0], node.output[0]
    alpha = attr_float(node, "alpha", 0.2)
    beta = attr_float(node, "beta", 0.5)
    t_mul, t_add = (unique_name(f"{base}/{s}", taken) for s in ("mul", "add"))
    a_name = scalar_input(out, f"{base}/alpha", alpha, dtype, taken)
    b_name = scalar_input(out, f"{base}/beta", beta, dtype, taken)
    new = [
        onnx.helper.make_node("Mul", [x, a_name], [t_mul], name=unique_name(f"{base}/Mul", taken)),
        onnx.helper.make_node("Add", [t_mul, b_name], [t_add], name=unique_name(f"{base}/Add", taken)),
    ]
    new += clip_nodes(out, t_add, y, 0.0, 1.0, dtype, unique_name(f"{base}/Clip", taken), taken)
    return new, f"HardSigmoid(alpha={alpha:g}, beta={beta:g}) -> Clip(alpha·x+beta,0,1)"
