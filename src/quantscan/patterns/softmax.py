"""Softmax written out in arithmetic (exports of hand-written attention, TF/jax2tf, some Paddle models):

    e = Exp(x); s = ReduceSum(e, A); y = Div(e, s) | Mul(e, Reciprocal(s))            (plain)
    m = ReduceMax(x, A); d = Sub(x, m); e = Exp(d); ... the same ...                   (stable)
    m = Max(ReduceMax(x, A), −inf); ...                                 (stable, jax2tf's identity)

with keepdims=1 on every reduction and the ReduceMax (when present) over the same axes A as the
ReduceSum. tf2onnx/jax2tf reduce with keepdims=0 and put the axes back by hand before the Sub and the
Div: `Reshape(s, [N, 1])` (or Unsqueeze A), often then `Expand` to x's shape (magika's classifier head).
Such a restore chain (Reshape/Unsqueeze/Expand/Identity, values unchanged) between a reduction and its
reader is part of the match, and a keepdims=0 reduction counts only with one: divided as it is, its
result would broadcast along the wrong axes. The match is anchored on the Exp node; its nodes are in
data-flow order and the last one writes the softmax output. `axes` are carried as written (attribute
or constant input).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from quantscan.graph.edit import attr_int
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


RESTORE_OPS = ("Reshape", "Unsqueeze", "Expand", "Identity")
"""Ops that put reduced axes back (or broadcast) without changing a value: a restore chain's links."""


def match_at(index: GraphIndex, exp: onnx.NodeProto) -> SoftmaxMatch | NoMatch:
    """The decomposed Softmax whose Exp node is `exp`."""
    if not is_op(exp, "Exp"):
        return NoMatch(f"{exp.op_type} is not an Exp")
    e = exp.output[0]
    total = next((n for n in index.readers(e) if is_op(n, "ReduceSum")), None)
    found = reduction(total, index) if total is not None else None
    if total is None or found is None:
        return NoMatch("exp(x) is not summed (keepdims=1 or a restore chain, known axes)")
    axes, kept = found
    tail = _divide(index, e, total.output[0], kept)
    if tail is None:
        return NoMatch("exp(x) is not divided by its sum (keepdims=0 needs a Reshape/Unsqueeze restoring the axes)")
    head, x, stable = _max_shift(index, exp, axes)
    return SoftmaxMatch(KERNEL, x, (*head, exp, total, *tail), tail[-1].output[0], tuple(axes), stable)


def reduction(node: onnx.NodeProto, index: GraphIndex) -> tuple[list[int], bool] | None:
    """(axes, keepdims) of a reduction whose axes are known (attribute or constant input), else None."""
    kept = attr_int(node, "keepdims", 1) == 1
    if kept:
        axes = reduce_axes(node, index)
        return None if axes is None else (axes, True)
    axes = reduce_axes(_with_keepdims(node), index)
    return None if axes is None or not axes else (axes, False)


def _with_keepdims(node: onnx.NodeProto) -> onnx.NodeProto:
    """A copy of `node` with keepdims=1, so `reduce_axes` reads its axes."""
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for a in copy.attribute:
        if a.name == "keepdims":
            a.i = 1
    return copy


def restore_chain(index: GraphIndex, t: str, source: str, kept: bool) -> list[onnx.NodeProto] | None:
    """The restore-chain nodes from `source` to `t` (walking back from `t`, data flow order), [] when
    t is source; None when `t` is not `source` restored, or (keepdims=0) nothing puts the axes back."""
    chain: list[onnx.NodeProto] = []
    while t != source:
        node = index.producer_node(t)
        if node is None or node.op_type not in RESTORE_OPS or not node.input:
            return None
        chain.insert(0, node)
        t = node.input[0]
    if not kept and not any(n.op_type in ("Reshape", "Unsqueeze") for n in chain):
        return None
    return chain


def _divide(index: GraphIndex, e: str, s: str, kept: bool = True) -> list[onnx.NodeProto] | None:
    """Div(e, s), or Reciprocal(s) then Mul(e, ·) in either order; s may come restored (`_restore_chain`)."""
    for div in index.readers(e):
        if is_op(div, "Div") and len(div.input) == 2 and div.input[0] == e:
            chain = restore_chain(index, div.input[1], s, kept)
            if chain is not None:
                return [*chain, div]
    for rec in index.readers(s):
        if not is_op(rec, "Reciprocal") or not kept:
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
    chain: list[onnx.NodeProto] = []
    peak = index.producer_node(m)
    while peak is not None and peak.op_type in RESTORE_OPS and peak.input:
        chain.insert(0, peak)
        peak = index.producer_node(peak.input[0])
    identity = _max_with_minus_inf(index, peak)
    if identity is not None:
        peak = index.producer_node(next(i for i in identity.input if i not in _minus_inf_inputs(index, identity)))
    found = reduction(peak, index) if peak is not None and is_op(peak, "ReduceMax") else None
    restored = found is not None and (found[1] or any(n.op_type in ("Reshape", "Unsqueeze") for n in chain))
    if peak is None or found is None or not restored or peak.input[0] != x or found[0] != axes:
        return [], exp.input[0], False
    return [peak, *([identity] if identity is not None else []), *chain, sub], x, True


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
