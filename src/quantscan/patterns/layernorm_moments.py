"""LayerNorm with the variance from the first two moments, as jax2tf writes flax's `nn.LayerNorm`
(`use_fast_variance`, the default) and tf2onnx exports it (magika's byte classifier):

    m  = mean(x, A);  m2 = mean(Mul(x, x) | Pow(x, 2), A)
    v  = Sub(m2, Mul(m, m) | Pow(m, 2));  [v = Max(v, 0) | Max(0, v) | Relu(v)]
    e  = Add(restore(v), eps);  r = 1/√e as Sqrt→Reciprocal, Sqrt→Div(1, ·) or Pow(e, −0.5)
    [r = Mul(r, scale)];  y = Mul(Sub(x, restore(m)), r);  [y = Mul(y, scale)];  [y = Add(y, bias)]

That is E[x²] − E[x]² clamped at 0 (flax's `_compute_stats`), then flax's `mul = rsqrt(var + eps) *
scale; y = (x - mean) * mul + bias`. mean(t, A) is ReduceMean(t, A), or ReduceSum(t, A) then Mul by
1/C or Div by C, where C is the number of elements over the axes A: jax2tf lowers `jnp.mean` to a sum
and a multiplication by the reciprocal. That constant is checked against C (the tensor's shape over A
where known, else the scale's or bias's size, which is the normalised shape in flax), so a sum scaled
by anything else is not a mean and not this kernel. The reductions may drop the axes (keepdims=0):
then a restore chain (Reshape/Unsqueeze/Expand, `softmax.restore_chain`) puts them back before the
Sub and the Add; where the shapes are known, the restored tensor must have x's shape with A as 1 (or
x's shape), so the statistics broadcast along the axes they were taken over.

The match is anchored on the first mean's reduction (the one reading x) and is a `LayerNormMatch`,
so the site grouping, the compatibility rules and the rewrites read it like the other spelling.
"""

from __future__ import annotations

import numpy as np
import onnx

from quantscan.graph.edit import attr_int
from quantscan.graph.index import GraphIndex, is_op, other_input
from quantscan.patterns import base, layernorm
from quantscan.patterns.base import NoMatch
from quantscan.patterns.layernorm import KERNEL, LayerNormMatch
from quantscan.patterns.softmax import RESTORE_OPS, reduction

_RTOL = 1e-5


def match_at(index: GraphIndex, anchor: onnx.NodeProto) -> LayerNormMatch | NoMatch:
    """The moments LayerNorm whose first mean's reduction (ReduceSum or ReduceMean of x) is `anchor`."""
    if not (is_op(anchor, "ReduceSum") or is_op(anchor, "ReduceMean")):
        return NoMatch(f"{anchor.op_type} is not a ReduceSum or ReduceMean")
    x = anchor.input[0]
    first = _mean(index, anchor)
    if first is None:
        return NoMatch("the reduction of x is not a mean (ReduceMean, or a sum times 1/C)")
    mean_nodes, m, axes, kept, reciprocal = first
    second = _second_moment(index, x, axes, kept)
    if second is None:
        return NoMatch("x·x is not averaged over the same axes")
    sq_nodes, m2, reciprocal2 = second
    mm = _square_of(index, m)
    sub = next((n for n in index.readers(m2) if is_op(n, "Sub") and mm is not None
                and list(n.input) == [m2, mm.output[0]]), None)
    if mm is None or sub is None:
        return NoMatch("the variance is not E[x²] − E[x]²")
    clamp = _clamp_at_zero(index, sub.output[0])
    v = (clamp or sub).output[0]
    v_chain, add = _restored_reader(index, v, "Add", x, axes, kept)
    eps = index.scalar(other_input(add, v_chain[-1].output[0] if v_chain else v) or "") if add else None
    if add is None or eps is None:
        return NoMatch("no constant epsilon is added to the (restored) variance")
    m_chain, centre = _restored_reader(index, m, "Sub", x, axes, kept)
    if centre is None or centre.input[0] != x:
        return NoMatch("the (restored) mean is not subtracted from x")
    inverse = _one_over_sqrt(index, add.output[0])
    if inverse is None:
        return NoMatch("the variance + eps is not taken to the power −1/2 (Sqrt→Reciprocal, 1/Sqrt, Pow −0.5)")
    r = inverse[-1].output[0]
    scale = None
    pre_scale = _times_constant(index, r)
    if pre_scale is not None:
        scale = other_input(pre_scale, r)
        inverse.append(pre_scale)
        r = pre_scale.output[0]
    d = centre.output[0]
    mul = next((n for n in index.readers(r) if is_op(n, "Mul") and sorted(n.input) == sorted([d, r])), None)
    if mul is None:
        return NoMatch("x − mean is not multiplied by 1/√(variance + eps)")
    tail_nodes, out, scale, bias = _affine_tail(index, mul.output[0], scale)
    extent = _extent(index, x, axes, scale, bias)
    if extent is None:
        return NoMatch("the number of elements over the axes is unknown, so the mean's 1/C cannot be checked")
    for k in (reciprocal, reciprocal2):
        if k is not None and not base.near(k * extent, 1.0, rtol=_RTOL):
            return NoMatch(f"the sum is scaled by {k:g}, not 1/{extent} (the elements over axes {axes})")
    nodes = [*mean_nodes, *sq_nodes, mm, sub, *([clamp] if clamp else []), *v_chain, add,
             *m_chain, centre, *inverse, mul, *tail_nodes]
    return LayerNormMatch(KERNEL, x, tuple(nodes), out, tuple(axes), eps, scale, bias)


def _mean(
    index: GraphIndex, node: onnx.NodeProto
) -> tuple[list[onnx.NodeProto], str, list[int], bool, float | None] | None:
    """(nodes, mean tensor, axes, keepdims, k) for ReduceMean (k None) or ReduceSum then ×k / ÷(1/k)."""
    found = reduction(node, index)
    if found is None:
        return None
    axes, kept = found
    if is_op(node, "ReduceMean"):
        return [node], node.output[0], axes, kept, None
    if not is_op(node, "ReduceSum") or attr_int(node, "noop_with_empty_axes", 0) and not axes:
        return None
    s = node.output[0]
    for scaling in index.readers(s):
        if is_op(scaling, "Mul"):
            k = index.scalar(other_input(scaling, s) or "")
        elif is_op(scaling, "Div") and scaling.input[0] == s:
            c = index.scalar(scaling.input[1])
            k = 1.0 / c if c else None
        else:
            continue
        if k is not None:
            return [node, scaling], scaling.output[0], axes, kept, k
    return None


def _second_moment(
    index: GraphIndex, x: str, axes: list[int], kept: bool
) -> tuple[list[onnx.NodeProto], str, float | None] | None:
    """(nodes, E[x²] tensor, k): the mean of x·x (or Pow(x, 2)) over the same axes, same keepdims."""
    square = _square_of(index, x)
    if square is None:
        return None
    for node in index.readers(square.output[0]):
        if not (is_op(node, "ReduceSum") or is_op(node, "ReduceMean")):
            continue
        found = _mean(index, node)
        if found is not None and found[2] == axes and found[3] == kept:
            return [square, *found[0]], found[1], found[4]
    return None


def _square_of(index: GraphIndex, t: str) -> onnx.NodeProto | None:
    """The node computing t² from `t`: Mul(t, t) or Pow(t, 2)."""
    for node in index.readers(t):
        if is_op(node, "Mul") and list(node.input) == [t, t]:
            return node
        if is_op(node, "Pow") and node.input[0] == t and index.scalar(node.input[1]) == 2.0:
            return node
    return None


def _clamp_at_zero(index: GraphIndex, v: str) -> onnx.NodeProto | None:
    """Max(v, 0) in either order, or Relu(v), when that is `v`'s only reader (flax's guard against a
    negative variance from rounding)."""
    reader = index.single_user(v)
    if reader is None:
        return None
    if is_op(reader, "Relu"):
        return reader
    if is_op(reader, "Max") and len(reader.input) == 2 and index.scalar(other_input(reader, v) or "") == 0.0:
        return reader
    return None


def _restored_reader(
    index: GraphIndex, t: str, op: str, x: str, axes: list[int], kept: bool
) -> tuple[list[onnx.NodeProto], onnx.NodeProto | None]:
    """(chain, reader): the first `op` node reading `t` directly or through a restore chain
    (Reshape/Unsqueeze/Expand/Identity; an intermediate read elsewhere is `Match.shared`'s concern).
    keepdims=0 needs a Reshape/Unsqueeze in the chain, and the restored shape must broadcast along
    `axes` only (checked where the shapes are known)."""
    chain: list[onnx.NodeProto] = []
    while True:
        direct = next((n for n in index.readers(t) if is_op(n, op)), None)
        if direct is not None:
            break
        link = next((n for n in index.readers(t) if n.op_type in RESTORE_OPS and n.input[0] == t), None)
        if link is None:
            return chain, None
        chain.append(link)
        t = link.output[0]
    if not kept and not any(n.op_type in ("Reshape", "Unsqueeze") for n in chain):
        return chain, None
    if chain and not _broadcasts_over(index, t, x, axes):
        return chain, None
    return chain, direct


def _broadcasts_over(index: GraphIndex, t: str, x: str, axes: list[int]) -> bool:
    """False when known shapes show `t` is not x's shape with `axes` kept as 1 (or as they are)."""
    ts, xs = index.info(t), index.info(x)
    if not (ts.is_static and xs.is_static) or ts.shape is None or xs.shape is None:
        return True
    if len(ts.shape) != len(xs.shape):
        return False
    rank = len(xs.shape)
    reduced = {a % rank for a in axes}
    pairs = enumerate(zip(ts.shape, xs.shape, strict=True))
    return all(td == xd or (i in reduced and td == 1) for i, (td, xd) in pairs)


def _one_over_sqrt(index: GraphIndex, e: str) -> list[onnx.NodeProto] | None:
    """The nodes computing 1/√e: Sqrt then Reciprocal, Sqrt then Div(1, ·), or Pow(e, −0.5)."""
    for node in index.readers(e):
        if is_op(node, "Pow") and node.input[0] == e and index.scalar(node.input[1]) == -0.5:
            return [node]
        if not is_op(node, "Sqrt"):
            continue
        s = node.output[0]
        for inv in index.readers(s):
            if is_op(inv, "Reciprocal") or (
                is_op(inv, "Div") and list(inv.input)[1:] == [s] and index.scalar(inv.input[0]) == 1.0
            ):
                return [node, inv]
    return None


def _times_constant(index: GraphIndex, t: str) -> onnx.NodeProto | None:
    """Mul(t, constant) in either order, when it is `t`'s only reader."""
    reader = index.single_user(t)
    if reader is None or not is_op(reader, "Mul") or len(reader.input) != 2:
        return None
    operand = other_input(reader, t)
    return reader if operand is not None and index.constant(operand) is not None else None


def _affine_tail(
    index: GraphIndex, y: str, scale: str | None
) -> tuple[list[onnx.NodeProto], str, str | None, str | None]:
    """(nodes, output, scale, bias): the constant Mul (when the scale was not folded into 1/√) and the
    constant Add after the normalised value, each only when it is the value's only reader."""
    nodes: list[onnx.NodeProto] = []
    if scale is None:
        mul = _times_constant(index, y)
        if mul is not None:
            scale = other_input(mul, y)
            nodes.append(mul)
            y = mul.output[0]
    bias = None
    add = index.single_user(y)
    if add is not None and is_op(add, "Add") and len(add.input) == 2:
        operand = other_input(add, y)
        if operand is not None and index.constant(operand) is not None:
            bias = operand
            nodes.append(add)
            y = add.output[0]
    return nodes, y, scale, bias


def _extent(index: GraphIndex, x: str, axes: list[int], scale: str | None, bias: str | None) -> int | None:
    """C, the number of elements a mean over `axes` divides by: from x's shape where it is known there,
    else the size of the scale (or bias), which in flax has the normalised shape."""
    shape = index.info(x).shape
    if shape is not None:
        rank = len(shape)
        dims = [shape[a % rank] for a in axes] if all(-rank <= a < rank for a in axes) else []
        if dims and all(isinstance(d, int) and d > 0 for d in dims):
            return int(np.prod([int(d) for d in dims if isinstance(d, int)]))
    for name in (scale, bias):
        value = index.constant(name) if name else None
        if value is not None and value.size > 1:
            return int(value.size)
    return None


def either_at(index: GraphIndex, anchor: onnx.NodeProto) -> LayerNormMatch | NoMatch:
    """The LayerNorm anchored at `anchor` in either spelling (`layernorm`'s x − mean first, or this
    module's moments): what the compatibility rules and `fuse-layernorm` ask, so both read the same."""
    found = layernorm.match_at(index, anchor)
    return found if isinstance(found, LayerNormMatch) else match_at(index, anchor)


def match_from(index: GraphIndex, x: str) -> LayerNormMatch | NoMatch:
    """The moments LayerNorm normalising tensor `x`, if any (its first reduction reads x)."""
    return base.match_from(index, x, match_at, 1, "LayerNorm (moments)")
