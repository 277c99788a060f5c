"""Softmax written out in arithmetic (exports of hand-written attention, TF/jax2tf, some Paddle models):

    e = Exp(x); s = ReduceSum(e, A); y = Div(e, s) | Mul(e, Reciprocal(s))            (plain)
    m = ReduceMax(x, A); d = Sub(x, m); e = Exp(d); ... the same ...                   (stable)
    m = Max(ReduceMax(x, A), −inf); ...                                 (stable, jax2tf's identity)

with keepdims=1 on every reduction and the ReduceMax (when present) over the same axes A as the
ReduceSum. The match is anchored on the Exp node; its nodes are in data-flow order and the last one
writes the softmax output. `axes` are carried as written (attribute or constant input).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from quantscan.graph.index import GraphIndex, is_op
from quantscan.patterns import base
from quantscan.patterns.base import Match, NoMatch
from quantscan.patterns.layernorm import reduce_axes

KERNEL = "Softmax"


@dataclass(frozen=True)
class SoftmaxMatch(Match):
    axes: tuple[int, ...] = ()
    stable: bool = False
    """True when the maximum is subtracted first (ReduceMax/Sub), as numerically careful exports do."""


def match_at(index: GraphIndex, exp: onnx.NodeProto) -> SoftmaxMatch | NoMatch:
    """The decomposed Softmax whose Exp node is `exp`."""
    if not is_op(exp, "Exp"):
        return NoMatch(f"{exp.op_type} is not an Exp")
    e = exp.output[0]
    total = next((n for n in index.readers(e) if is_op(n, "ReduceSum")), None)
    axes = reduce_axes(total, index) if total is not None else None
    if total is None or axes is None:
        return NoMatch("exp(x) is not summed (keepdims=1, known axes)")
    tail = _divide(index, e, total.output[0])
    if tail is None:
        return NoMatch("exp(x) is not divided by its sum")
    head, x, stable = _max_shift(index, exp, axes)
    return SoftmaxMatch(KERNEL, x, (*head, exp, total, *tail), tail[-1].output[0], tuple(axes), stable)


def _divide(index: GraphIndex, e: str, s: str) -> list[onnx.NodeProto] | None:
    """Div(e, s), or Reciprocal(s) then Mul(e, ·) in either order."""
    div = next((n for n in index.readers(s) if is_op(n, "Div") and list(n.input) == [e, s]), None)
    if div is not None:
        return [div]
    for rec in index.readers(s):
        if not is_op(rec, "Reciprocal"):
            continue
        r = rec.output[0]
        mul = next((n for n in index.readers(r) if is_op(n, "Mul") and sorted(n.input) == sorted([e, r])), None)
        if mul is not None:
            return [rec, mul]
    return None


def _max_shift(
    index: GraphIndex, exp: onnx.NodeProto, axes: list[int]
) -> tuple[list[onnx.NodeProto], str, bool]:
    """(nodes, x, stable): the ReduceMax/Sub that shift x by its maximum over `axes` before the Exp,
    or nothing (x is the Exp input) when it is not there."""
    sub = index.producer_node(exp.input[0])
    if sub is None or not is_op(sub, "Sub") or len(sub.input) != 2:
        return [], exp.input[0], False
    x, m = sub.input
    peak = index.producer_node(m)
    identity = _max_with_minus_inf(index, peak)
    if identity is not None:
        peak = index.producer_node(next(i for i in identity.input if i not in _minus_inf_inputs(index, identity)))
    if peak is None or not is_op(peak, "ReduceMax") or peak.input[0] != x or reduce_axes(peak, index) != axes:
        return [], exp.input[0], False
    return [peak, *([identity] if identity is not None else []), sub], x, True


def _minus_inf_inputs(index: GraphIndex, node: onnx.NodeProto) -> set[str]:
    """The inputs of `node` that are constants holding only −inf."""
    found = set()
    for name in node.input:
        value = index.constant(name) if name else None
        if value is not None and value.size and bool(np.all(np.isneginf(value))):
            found.add(name)
    return found


def _max_with_minus_inf(index: GraphIndex, node: onnx.NodeProto | None) -> onnx.NodeProto | None:
    """`Max(m, −inf)`: the identity of a max-reduction that jax2tf writes after its ReduceMax; None else."""
    if node is None or not is_op(node, "Max") or len(node.input) != 2:
        return None
    return node if len(_minus_inf_inputs(index, node)) == 1 else None


def match_from(index: GraphIndex, x: str) -> SoftmaxMatch | NoMatch:
    """The decomposed Softmax over tensor `x`, if any (its Exp lies one or two nodes downstream)."""
    return base.match_from(index, x, match_at, 2, KERNEL)
