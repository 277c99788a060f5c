"""HardSwish: x·relu6(x+3)/6 in the spellings exporters write.

    HardSwish(x)                                                         (native, opset 14)
    Mul(x, Clip(Add(x, 3), 0, 6)) then Div(·, 6) or Mul(·, 1/6)          (Mul-then-Div)
    Div(Clip(Add(x, 3), 0, 6), 6) or Mul(Clip(...), 1/6) then Mul(x, ·)   (Div-then-Mul)
    Mul(x, HardSigmoid(x; alpha=1/6, beta=1/2))                          (HardSigmoid)

Add/Mul operands may come in either order; the Clip bounds may be attributes (opset < 11) or inputs.
The match is anchored on the HardSwish, Clip or HardSigmoid node; its nodes are in data-flow order and
the last one writes the kernel's output.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np
import onnx

from quantscan.graph.edit import attr_float, get_attr
from quantscan.graph.index import GraphIndex, is_op
from quantscan.patterns import base
from quantscan.patterns.base import Match, NoMatch, near

KERNEL = "HardSwish"


class Spelling(str, Enum):
    NATIVE = "native"
    CLIP = "clip"
    HARDSIGMOID = "hardsigmoid"


DECOMPOSED = frozenset({Spelling.CLIP, Spelling.HARDSIGMOID})


@dataclass(frozen=True)
class HardSwishMatch(Match):
    spelling: Spelling = Spelling.CLIP

    def mul_of_x(self) -> onnx.NodeProto | None:
        """The Mul that multiplies x in (where a decomposed HardSwish meets its input again)."""
        return next((n for n in self.nodes if n.op_type == "Mul" and self.x in n.input), None)


def match_at(index: GraphIndex, anchor: onnx.NodeProto) -> HardSwishMatch | NoMatch:
    """The HardSwish whose HardSwish, Clip or HardSigmoid node is `anchor`."""
    if is_op(anchor, "HardSwish"):
        return HardSwishMatch(KERNEL, anchor.input[0], (anchor,), anchor.output[0], Spelling.NATIVE)
    if is_op(anchor, "HardSigmoid"):
        return _hardsigmoid_form(index, anchor)
    if not is_op(anchor, "Clip"):
        return NoMatch(f"{anchor.op_type} is not HardSwish, Clip or HardSigmoid")
    bounds = _clip_bounds(anchor, index)
    if bounds is None or not (np.isclose(bounds[0], 0.0) and np.isclose(bounds[1], 6.0, rtol=1e-5)):
        return NoMatch(f"Clip bounds {bounds} are not (0, 6)")
    add = index.producer_node(anchor.input[0])
    if add is None or not is_op(add, "Add"):
        return NoMatch("Clip input is not an Add")
    x = _const_operand(add, index, 3.0)
    if x is None:
        return NoMatch("the Add before the Clip does not add 3")
    c = anchor.output[0]
    for n1 in index.readers(c):
        if is_op(n1, "Mul") and set(n1.input) == {x, c}:  # Mul-then-Div / Mul-then-Mul(1/6)
            for n2 in index.readers(n1.output[0]):
                if _scales_by_sixth(n2, n1.output[0], index):
                    return HardSwishMatch(KERNEL, x, (add, anchor, n1, n2), n2.output[0])
        if _scales_by_sixth(n1, c, index):  # Div-then-Mul / Mul(1/6)-then-Mul
            for n2 in index.readers(n1.output[0]):
                if is_op(n2, "Mul") and set(n2.input) == {x, n1.output[0]}:
                    return HardSwishMatch(KERNEL, x, (add, anchor, n1, n2), n2.output[0])
    return NoMatch("relu6(x+3) is not multiplied by x and divided by 6")


def match_from(index: GraphIndex, x: str) -> HardSwishMatch | NoMatch:
    """The HardSwish computed from tensor `x`, if any (anchors lie at most two nodes downstream)."""
    return base.match_from(index, x, match_at, 2, KERNEL)


def _hardsigmoid_form(index: GraphIndex, hs: onnx.NodeProto) -> HardSwishMatch | NoMatch:
    alpha, beta = attr_float(hs, "alpha", 0.2), attr_float(hs, "beta", 0.5)
    if not (np.isclose(alpha, 1 / 6, rtol=1e-5) and np.isclose(beta, 0.5, rtol=1e-5)):
        return NoMatch(f"HardSigmoid(alpha={alpha:g}, beta={beta:g}) is not relu6(x+3)/6")
    x = hs.input[0]
    for mul in index.readers(hs.output[0]):
        if is_op(mul, "Mul") and set(mul.input) == {x, hs.output[0]}:
            return HardSwishMatch(KERNEL, x, (hs, mul), mul.output[0], Spelling.HARDSIGMOID)
    return NoMatch("HardSigmoid(x) is not multiplied by x")


def _const_operand(node: onnx.NodeProto, index: GraphIndex, target: float) -> str | None:
    """The other input of a binary node one of whose inputs is the scalar constant `target`."""
    if len(node.input) != 2:
        return None
    a, b = node.input
    if near(index.scalar(b), target):
        return a
    if near(index.scalar(a), target):
        return b
    return None


def _clip_bounds(clip: onnx.NodeProto, index: GraphIndex) -> tuple[float, float] | None:
    if get_attr(clip, "min") is not None or get_attr(clip, "max") is not None:
        return attr_float(clip, "min", -np.inf), attr_float(clip, "max", np.inf)
    if len(clip.input) < 3 or not clip.input[1] or not clip.input[2]:
        return None
    lo, hi = index.scalar(clip.input[1]), index.scalar(clip.input[2])
    return None if lo is None or hi is None else (lo, hi)


def _scales_by_sixth(node: onnx.NodeProto, operand: str, index: GraphIndex) -> bool:
    """True for Div(operand, 6) or Mul(operand, 1/6) (either order for Mul)."""
    if is_op(node, "Div") and len(node.input) == 2 and node.input[0] == operand:
        return near(index.scalar(node.input[1]), 6.0)
    if is_op(node, "Mul"):
        return _const_operand(node, index, 1 / 6) == operand
    return False

