"""`relu6-to-relu`: a layer's Clip(0, cap) (Relu6) whose input never reaches the cap on the calibration
data -> Relu, so cross-layer equalization can pass it.

Why: equalization rescales a producer's output channels by positive factors and the consumer's weights by
their inverse; that commutes with Relu but not with Clip(0, 6), whose fixed cap would move with the
scale. MobileNet-style models put a Relu6 after nearly every conv (issue 40: a keypoint model's
depthwise conv whose input channels span 250x, its weights 12,776x, behind a Relu6), and `--equalize`
refuses them all. Where the Clip's input stays below the cap on the calibration data, Clip and Relu are
the same function on that data: the swap is proven like every rewrite (the runner's exact criterion on
`--calib`), and a Clip whose input does reach its cap is left alone with the figure.

Recognised: Clip with min 0 (or absent: then not a Relu6, refused) and a finite positive max, reading a
Conv/ConvTranspose/Gemm/MatMul (through a BatchNormalization). Clips elsewhere (inside a decomposed
HardSwish, a Clip on a model input) are not layer activations and are not touched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import onnx

from quantscan.graph.edit import copy_model, node_label
from quantscan.graph.index import GraphIndex
from quantscan.rewrites.base import Change, Refusal, RewriteResult

REWRITE_ID = "relu6-to-relu"
LAYER_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


def relu6_candidates(model: onnx.ModelProto) -> dict[str, float]:
    """Each layer Relu6's input tensor -> its cap (the statistics `relu6_to_relu` needs)."""
    index = GraphIndex.of(model)
    found = {}
    for node in index.nodes:
        cap = _layer_relu6_cap(node, index)
        if cap is not None:
            found[node.input[0]] = cap
    return found


def relu6_to_relu(model: onnx.ModelProto, maxima: Mapping[str, float]) -> RewriteResult:
    """Swap every layer Relu6 whose input's calibrated max (`maxima`: tensor -> max) is below its cap."""
    out = copy_model(model)
    index = GraphIndex.of(out)
    result = RewriteResult(model=out)
    for node in out.graph.node:
        cap = _layer_relu6_cap(node, index)
        if cap is None:
            continue
        top = float(maxima.get(node.input[0], math.nan))
        if not top < cap:
            reason = (f"its input reaches {top:.4g} on the calibration data, at or above the cap {cap:g}"
                      if math.isfinite(top) else "its input was not measured on the calibration data")
            result.refusals.append(Refusal(REWRITE_ID, node_label(node), reason))
            continue
        data = node.input[0]
        del node.input[:]
        node.input.append(data)
        del node.attribute[:]
        node.op_type = "Relu"
        result.changes.append(Change(REWRITE_ID, node_label(node),
                                     f"Clip(0, {cap:g}) -> Relu: its input peaks at {top:.4g} < {cap:g} on the "
                                     "calibration data, where the two are the same function"))
    return result


def _layer_relu6_cap(node: onnx.NodeProto, index: GraphIndex) -> float | None:
    """The cap of a Clip(0, cap) reading a weight layer (through a BatchNormalization), else None."""
    if node.op_type != "Clip" or node.domain not in ("", "ai.onnx") or not node.input:
        return None
    low, high = _bounds(node, index)
    if low != 0.0 or not (math.isfinite(high) and high > 0):
        return None
    producer = index.producer_node(node.input[0])
    if producer is not None and producer.op_type == "BatchNormalization":
        producer = index.producer_node(producer.input[0])
    return high if producer is not None and producer.op_type in LAYER_OPS else None


def _bounds(node: onnx.NodeProto, index: GraphIndex) -> tuple[float, float]:
    """(min, max) of a Clip: inputs 1 and 2 from opset 11, attributes before; NaN when not constant."""
    attrs = {a.name: a.f for a in node.attribute}
    if "min" in attrs or "max" in attrs:
        return attrs.get("min", -math.inf), attrs.get("max", math.inf)
    bounds = []
    for pos, default in ((1, -math.inf), (2, math.inf)):
        if len(node.input) <= pos or not node.input[pos]:
            bounds.append(default)
            continue
        value = index.constant(node.input[pos])
        bounds.append(float(np.ravel(value)[0]) if value is not None and np.size(value) == 1 else math.nan)
    return bounds[0], bounds[1]
