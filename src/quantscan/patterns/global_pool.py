"""A pooling window that covers its whole input: an AveragePool/MaxPool that is a global pool.

TFLite exporters (and tf2onnx) write the squeeze-excite pool of MobileNetV3 as `AVERAGE_POOL_2D` with
kernel = stride = the input's H×W: one window, one output cell per channel, which is exactly what
GlobalAveragePool (GlobalMaxPool for MaxPool) computes. With one window the stride is never applied,
so a chip's stride limit (rk3588: [1, 8]) says nothing about it, and the pool is judged by the limits
of its global form. Recognised when, on every spatial axis, the kernel equals the input's static size,
nothing is padded (pads 0, auto_pad NOTSET or VALID), dilation is 1 and so the output is 1: then every
output cell averages (or maxes) all H×W input cells, ceil_mode and count_include_pad change nothing.
A MaxPool that also returns Indices is not one (GlobalMaxPool has no Indices output).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from quantscan.graph.edit import get_attr
from quantscan.graph.index import DEFAULT_DOMAINS, GraphIndex
from quantscan.patterns.base import Match, NoMatch

GLOBAL_FORM = {"AveragePool": "GlobalAveragePool", "MaxPool": "GlobalMaxPool"}
"""Pool op -> the op computing the same thing when its window is the whole input."""


@dataclass(frozen=True)
class GlobalPoolMatch(Match):
    global_op: str = ""
    window: tuple[int, ...] = ()
    """The kernel, equal to the input's spatial size."""


def match_at(index: GraphIndex, node: onnx.NodeProto) -> GlobalPoolMatch | NoMatch:
    """The pool `node` as its global form, when its one window covers its whole (static) input."""
    if node.op_type not in GLOBAL_FORM or node.domain not in DEFAULT_DOMAINS:
        return NoMatch(f"{node.op_type} is not an AveragePool or MaxPool")
    if len([o for o in node.output if o]) > 1:
        return NoMatch("the MaxPool also returns Indices, which GlobalMaxPool has not")
    kernel = [int(k) for k in get_attr(node, "kernel_shape", [])]  # type: ignore[attr-defined]
    n = len(kernel)
    shape = index.info(node.input[0]).shape
    if not kernel or shape is None or len(shape) != n + 2:
        return NoMatch("the input's spatial size is unknown")
    spatial = list(shape[2:])
    if any(not isinstance(d, int) or d <= 0 for d in spatial):
        free = ", ".join(str(d) for d in spatial if not isinstance(d, int) or d <= 0)
        return NoMatch(f"input spatial dim(s) {free} not fixed: whether one window covers them depends on them")
    if kernel != spatial:
        return NoMatch(f"kernel {kernel} does not cover the input's {spatial}")
    auto_pad = get_attr(node, "auto_pad", b"NOTSET")
    pads = [int(p) for p in get_attr(node, "pads", [0] * (2 * n))]  # type: ignore[attr-defined]
    dilations = [int(d) for d in get_attr(node, "dilations", [1] * n)]  # type: ignore[attr-defined]
    if auto_pad not in (b"NOTSET", "NOTSET", b"VALID", "VALID") or any(pads):
        return NoMatch("the window is padded: it averages padding cells a global pool does not see")
    if any(d != 1 for d in dilations):
        return NoMatch(f"dilations {dilations}: the window skips input cells")
    return GlobalPoolMatch(GLOBAL_FORM[node.op_type], node.input[0], (node,), node.output[0],
                           GLOBAL_FORM[node.op_type], tuple(kernel))
