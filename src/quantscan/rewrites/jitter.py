"""The noise floor of a no-latency recovery pass: the model with its weights one float32 ulp off.

Why a module of its own: `rewrite --recover` (quantscan.recover) and the scan's bias-correction check
(scanning/recover_check.py) decide by the same rule whether a pass helps, and the scan may not import
the recover command (which builds on the scan). Why a jitter: the all-int8 cosine of some models moves
by 1e-3 when their weights move by one ulp (a re-calibration flips the rounding of thousands of codes),
and every exact pass moves weights by about that much; a gain is real only above that change.
"""

from __future__ import annotations

import numpy as np
import onnx

from quantscan.graph.index import GraphIndex
from quantscan.rewrites.linear import WEIGHT_OPS, Linear, linear_of, write_back

MIN_GAIN = 1e-5
"""A pass is kept when it raises the all-int8 output cosine by more than this and the noise floor."""
JITTER_RUNS = 2
"""Jittered copies measured for the noise floor (the largest change counts)."""


def ulp_jitter(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    """A copy whose weight-layer weights and biases each move by one float32 ulp, up or down at random:
    the size of change an exact rescaling makes, applied where it changes nothing of substance."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    rng = np.random.default_rng(seed)
    index = GraphIndex(out.graph, ir_version=out.ir_version)
    layers = [got for n in index.nodes if n.op_type in WEIGHT_OPS
              for got in [linear_of(n, index)] if isinstance(got, Linear)]
    for layer in layers:
        layer.weight = _nudge(layer.weight, rng)
        if layer.bias is not None:
            layer.bias = _nudge(layer.bias, rng)
    write_back(out, layers)
    return out


def _nudge(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    x32 = np.asarray(x, dtype=np.float32)
    up = rng.random(x32.shape) < 0.5
    return np.where(up, np.nextafter(x32, np.float32(np.inf)), np.nextafter(x32, np.float32(-np.inf)))
