"""SiLU / Swish: x·sigmoid(x), and x·sigmoid(β·x) with a constant β (Mul before the Sigmoid).

The match is anchored on the Sigmoid node; the last node is the Mul by x.
"""

from __future__ import annotations

import onnx

from quantscan.graph.index import GraphIndex, is_op, other_input
from quantscan.patterns import base
from quantscan.patterns.base import Match, NoMatch

KERNEL = "SiLU"


def match_at(index: GraphIndex, sig: onnx.NodeProto) -> Match | NoMatch:
    """The SiLU whose Sigmoid is `sig`: the β form first, then the plain one."""
    if not is_op(sig, "Sigmoid"):
        return NoMatch(f"{sig.op_type} is not a Sigmoid")
    s = sig.input[0]
    scaled = index.producer_node(s)
    if scaled is not None and is_op(scaled, "Mul"):
        for operand in scaled.input:
            x = other_input(scaled, operand)
            if index.is_const(operand) and x is not None and not index.is_const(x):
                mul = _times(index, sig, x)
                if mul is not None:
                    return Match(KERNEL, x, (scaled, sig, mul), mul.output[0])
    mul = _times(index, sig, s)
    if mul is None:
        return NoMatch("sigmoid(x) is not multiplied by x")
    return Match(KERNEL, s, (sig, mul), mul.output[0])


def _times(index: GraphIndex, sig: onnx.NodeProto, x: str) -> onnx.NodeProto | None:
    """The Mul of sigmoid's output by `x`."""
    return next(
        (m for m in index.readers(sig.output[0]) if is_op(m, "Mul") and other_input(m, sig.output[0]) == x), None
    )


def match_from(index: GraphIndex, x: str) -> Match | NoMatch:
    """The SiLU of tensor `x`, if any (its Sigmoid lies one or two nodes downstream)."""
    return base.match_from(index, x, match_at, 2, KERNEL)
