"""LayerNorm written out in arithmetic (PyTorch < 1.13, Paddle and TF exports):

    m = mean(x); d = Sub(x, m); p = Pow(d, 2) | Mul(d, d); v = mean(p)
    e = Add(v, eps); n = Div(d, Sqrt(e)) | Mul(d, r)
        with r = Reciprocal(Sqrt(e)) | Pow(e, -0.5) | Div(1, Sqrt(e))
    [y = Mul(n, scale)]; [y = Add(y, bias)]

where mean(t) is ReduceMean(t, A) (keepdims=1) or MatMul(t, W) with W a constant [C, 1] or [C, C]
matrix of 1/C (a mean over the last axis written as a matrix product, A = (-1,)). Both means are over
the same axes A; eps, scale and bias are constants. The match is anchored on the first mean node and
carries A as written (the caller decides whether the axes are a trailing range a LayerNormalization op
can express).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from quantscan.graph.edit import attr_int, get_attr
from quantscan.graph.index import GraphIndex, is_op, other_input
from quantscan.patterns import base
from quantscan.patterns.base import Match, NoMatch

KERNEL = "LayerNorm"


@dataclass(frozen=True)
class LayerNormMatch(Match):
    axes: tuple[int, ...] = ()
    eps: float = 0.0
    scale: str | None = field(default=None)
    """The constant the normalised value is multiplied by, when the pattern has that Mul."""
    bias: str | None = field(default=None)
    """The constant added after the scale, when the pattern has that Add."""


def reduce_axes(node: onnx.NodeProto, index: GraphIndex) -> list[int] | None:
    """The axes a keepdims=1 ReduceMean reduces (attribute or constant input), else None."""
    if attr_int(node, "keepdims", 1) != 1:
        return None
    axes = get_attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        value = index.constant(node.input[1])
        axes = None if value is None else [int(a) for a in value.reshape(-1)]
    return None if axes is None else [int(a) for a in axes]  # type: ignore[attr-defined]


def mean_axes(node: onnx.NodeProto, index: GraphIndex) -> list[int] | None:
    """The axes `node` averages its first input over, keeping them: a keepdims=1 ReduceMean, or a
    MatMul by a constant [C, 1] / [C, C] matrix whose every entry is 1/C (the last axis); else None."""
    if is_op(node, "ReduceMean"):
        return reduce_axes(node, index)
    if not is_op(node, "MatMul") or len(node.input) != 2:
        return None
    w = index.constant(node.input[1])
    if w is None or w.ndim != 2 or w.shape[1] not in (1, w.shape[0]) or w.shape[0] < 2:
        return None
    return [-1] if bool(np.allclose(w, 1.0 / w.shape[0], rtol=1e-5, atol=0.0)) else None


def match_at(index: GraphIndex, anchor: onnx.NodeProto) -> LayerNormMatch | NoMatch:
    """The arithmetic LayerNorm whose first mean (ReduceMean or MatMul by 1/C) is `anchor`."""
    if not (is_op(anchor, "ReduceMean") or is_op(anchor, "MatMul")):
        return NoMatch(f"{anchor.op_type} is not a ReduceMean or MatMul")
    x = anchor.input[0]
    axes = mean_axes(anchor, index)
    subs = [n for n in index.readers(anchor.output[0]) if is_op(n, "Sub") and list(n.input) == [x, anchor.output[0]]]
    if axes is None or len(subs) != 1:
        return NoMatch("the mean is not subtracted from x once (or its axes are unknown)")
    sub = subs[0]
    d = sub.output[0]
    readers = index.readers(d)
    sq = next((n for n in readers if is_op(n, "Pow") and n.input[0] == d and index.scalar(n.input[1]) == 2.0), None)
    if sq is None:
        sq = next((n for n in readers if is_op(n, "Mul") and list(n.input) == [d, d]), None)
    if sq is None:
        return NoMatch("x - mean is not squared")
    rm2 = next((n for n in index.readers(sq.output[0]) if mean_axes(n, index) is not None), None)
    if rm2 is None or mean_axes(rm2, index) != axes:
        return NoMatch("the square is not averaged over the same axes")
    add = next((n for n in index.readers(rm2.output[0]) if is_op(n, "Add")), None)
    eps = index.scalar(other_input(add, rm2.output[0]) or "") if add is not None else None
    if add is None or eps is None:
        return NoMatch("no constant epsilon is added to the variance")
    inverse = _inverse_std(index, add.output[0], d)
    if inverse is None:
        return NoMatch("x - mean is not divided by sqrt(variance + eps) (Div, Reciprocal, 1/Sqrt or Pow -0.5)")
    nodes = [anchor, sub, sq, rm2, add, *inverse]
    scale = bias = None
    tail = inverse[-1].output[0]
    mul = next((n for n in index.readers(tail) if is_op(n, "Mul")), None)
    if mul is not None and index.use_count(tail) == 1:
        scale = other_input(mul, tail)
        if scale is not None and index.constant(scale) is not None:
            nodes.append(mul)
            tail = mul.output[0]
            badd = next((n for n in index.readers(tail) if is_op(n, "Add")), None)
            if badd is not None and index.use_count(tail) == 1:
                bias = other_input(badd, tail)
                if bias is not None and index.constant(bias) is not None:
                    nodes.append(badd)
                    tail = badd.output[0]
                else:
                    bias = None
        else:
            scale = None
    return LayerNormMatch(KERNEL, x, tuple(nodes), tail, tuple(axes), eps, scale, bias)


def _inverse_std(index: GraphIndex, var_eps: str, d: str) -> list[onnx.NodeProto] | None:
    """The nodes that divide `d` by sqrt(`var_eps`), ending with the one that outputs the normalised value.

    Exporters spell the division four ways: Div(d, Sqrt(e)), Mul(d, Reciprocal(Sqrt(e))),
    Mul(d, Div(1, Sqrt(e))) and Mul(d, Pow(e, -0.5)); a chip compiler folds them all into one LayerNorm
    kernel, so all are one.
    """
    for node in index.readers(var_eps):
        if is_op(node, "Sqrt"):
            s = node.output[0]
            div = next((n for n in index.readers(s) if is_op(n, "Div") and list(n.input) == [d, s]), None)
            if div is not None:
                return [node, div]
            for rec in index.readers(s):
                one_over = is_op(rec, "Div") and list(rec.input)[1:] == [s] and index.scalar(rec.input[0]) == 1.0
                if not (is_op(rec, "Reciprocal") or one_over):
                    continue
                mul = _mul_of(index, rec.output[0], d)
                if mul is not None:
                    return [node, rec, mul]
        elif is_op(node, "Pow") and index.scalar(node.input[1]) == -0.5 and node.input[0] == var_eps:
            mul = _mul_of(index, node.output[0], d)
            if mul is not None:
                return [node, mul]
    return None


def _mul_of(index: GraphIndex, a: str, b: str) -> onnx.NodeProto | None:
    """The Mul of tensors `a` and `b` (either order), if one reads `a`."""
    return next((n for n in index.readers(a) if is_op(n, "Mul") and sorted(n.input) == sorted([a, b])), None)


def match_from(index: GraphIndex, x: str) -> LayerNormMatch | NoMatch:
    """The arithmetic LayerNorm normalising tensor `x`, if any."""
    return base.match_from(index, x, match_at, 1, KERNEL)
