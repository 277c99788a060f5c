"""Exact GELU written with Erf: 0.5·x·(1 + erf(x/√2)), in the orders exporters write (operands of Add
and Mul in either order):

    e = Erf(Div(x, √2) | Mul(x, 1/√2)); a = Add(e, 1); then
    Mul(Mul(x, a), 0.5) | Mul(Mul(x, 0.5), a) | Mul(Mul(a, 0.5), x)

The match is anchored on the Erf node; its last node writes the GELU output.
"""

from __future__ import annotations

import math

import onnx

from quantscan.graph.index import GraphIndex, is_op, other_input
from quantscan.patterns import base
from quantscan.patterns.base import Match, NoMatch

KERNEL = "GELU"
_RTOL = 1e-4


def _near(index: GraphIndex, name: str, target: float) -> bool:
    return base.near(index.scalar(name), target, rtol=_RTOL)


def _readers(index: GraphIndex, name: str, op: str) -> list[onnx.NodeProto]:
    return [n for n in index.readers(name) if is_op(n, op)]


def match_at(index: GraphIndex, erf: onnx.NodeProto) -> Match | NoMatch:
    """The Erf-GELU whose Erf node is `erf`."""
    if not is_op(erf, "Erf"):
        return NoMatch(f"{erf.op_type} is not an Erf")
    scale = index.producer_node(erf.input[0])
    if scale is not None and is_op(scale, "Div") and _near(index, scale.input[1], math.sqrt(2.0)):
        x = scale.input[0]
    elif scale is not None and is_op(scale, "Mul"):
        cands = [i for i in scale.input if _near(index, i, 1 / math.sqrt(2.0))]
        other = other_input(scale, cands[0]) if cands else None
        if other is None:
            return NoMatch("the Erf input is not x/√2")
        x = other
    else:
        return NoMatch("the Erf input is not x/√2")
    e = erf.output[0]
    add = next((n for n in _readers(index, e, "Add") if _near(index, other_input(n, e) or "", 1.0)), None)
    if add is None:
        return NoMatch("1 is not added to erf(x/√2)")
    a = add.output[0]
    for m in _readers(index, a, "Mul"):
        o = other_input(m, a)
        if o is None:
            continue
        if o == x:  # x·(1+erf) then ·0.5
            for h in _readers(index, m.output[0], "Mul"):
                if _near(index, other_input(h, m.output[0]) or "", 0.5):
                    return Match(KERNEL, x, (scale, erf, add, m, h), h.output[0])
        half_x = index.producer_node(o)
        halves_x = half_x is not None and is_op(half_x, "Mul") and x in half_x.input
        if half_x is not None and halves_x and _near(index, other_input(half_x, x) or "", 0.5):
            return Match(KERNEL, x, (half_x, scale, erf, add, m), m.output[0])  # (0.5·x)·(1+erf)
        if _near(index, o, 0.5):  # ((1+erf)·0.5)·x
            for fin in _readers(index, m.output[0], "Mul"):
                if other_input(fin, m.output[0]) == x:
                    return Match(KERNEL, x, (scale, erf, add, m, fin), fin.output[0])
    return NoMatch("(1 + erf(x/√2)) is not multiplied by x and 0.5")


def match_from(index: GraphIndex, x: str) -> Match | NoMatch:
    """The Erf-GELU of tensor `x`, if any (its Erf lies two nodes downstream)."""
    return base.match_from(index, x, match_at, 2, KERNEL)
