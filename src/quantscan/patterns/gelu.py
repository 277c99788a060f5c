"""GELU written out in arithmetic, in the two forms exporters write (operands of Add and Mul in either
order, constants up to float32 export rounding):

Exact (Erf) form, 0.5·x·(1 + erf(x/√2)):

    e = Erf(Div(x, √2) | Mul(x, 1/√2)); a = Add(e, 1); then
    Mul(Mul(x, a), 0.5) | Mul(Mul(x, 0.5), a) | Mul(Mul(a, 0.5), x)

Tanh form, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) (BERT/GPT-2 "gelu_new", PyTorch
approximate="tanh" below opset 20, TF exports):

    k = 0.044715·x³ as any product of x, x, x and the constant (Pow(x, 3)·c, c·((x·x)·x),
        x·(x·(c·x)) as jax2tf writes it); u = Add(x, k)
    e = Tanh(Mul(u, √(2/π))); a = Add(e, 1); then the same three tails as the Erf form

The Erf match is anchored on the Erf node, the tanh match on the Tanh node; the last node of a match
writes the GELU output. `match_at` is the Erf form alone (the `gelu-tanh` rewrite replaces exactly
that); `match_from` finds either.
"""

from __future__ import annotations

import math

import onnx

from quantscan.graph.index import GraphIndex, is_op, other_input
from quantscan.patterns import base
from quantscan.patterns.base import Match, NoMatch

KERNEL = "GELU"
_RTOL = 1e-4
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
CUBIC = 0.044715


def _near(index: GraphIndex, name: str, target: float) -> bool:
    return base.near(index.scalar(name), target, rtol=_RTOL)


def _readers(index: GraphIndex, name: str, op: str) -> list[onnx.NodeProto]:
    return [n for n in index.readers(name) if is_op(n, op)]


def _times_const(index: GraphIndex, node: onnx.NodeProto | None, target: float) -> str | None:
    """For Mul(t, target) in either order, the tensor t; None for any other node."""
    if node is None or not is_op(node, "Mul"):
        return None
    for operand in node.input:
        if _near(index, operand, target):
            return other_input(node, operand)
    return None


def match_at(index: GraphIndex, erf: onnx.NodeProto) -> Match | NoMatch:
    """The Erf-GELU whose Erf node is `erf`."""
    if not is_op(erf, "Erf"):
        return NoMatch(f"{erf.op_type} is not an Erf")
    scale = index.producer_node(erf.input[0])
    if scale is not None and is_op(scale, "Div") and _near(index, scale.input[1], math.sqrt(2.0)):
        x = scale.input[0]
    else:
        found = _times_const(index, scale, 1 / math.sqrt(2.0))
        if scale is None or found is None:
            return NoMatch("the Erf input is not x/√2")
        x = found
    return _tail(index, x, [scale, erf], "erf(x/√2)")


def match_tanh_at(index: GraphIndex, tanh: onnx.NodeProto) -> Match | NoMatch:
    """The tanh-form GELU whose Tanh node is `tanh`."""
    if not is_op(tanh, "Tanh"):
        return NoMatch(f"{tanh.op_type} is not a Tanh")
    scale = index.producer_node(tanh.input[0])
    u = _times_const(index, scale, SQRT_2_OVER_PI)
    add = index.producer_node(u) if u is not None else None
    if scale is None or add is None or not is_op(add, "Add"):
        return NoMatch("the Tanh input is not √(2/π)·(x + ...)")
    for k in add.input:
        x = other_input(add, k)
        cubic = _cubic_term(index, k, x) if x is not None else None
        if x is not None and cubic is not None:
            return _tail(index, x, [*cubic, add, scale, tanh], "tanh(√(2/π)·(x + 0.044715·x³))")
    return NoMatch("the Tanh input is not √(2/π)·(x + 0.044715·x³)")


def _cubic_term(index: GraphIndex, term: str, x: str) -> list[onnx.NodeProto] | None:
    """The nodes computing `term` = 0.044715·x³, in any association of its factors, else None.

    Exporters agree on the value, not on the order: PyTorch writes Mul(Pow(x, 3), c), BERT's TF port
    Mul(c, Mul(Mul(x, x), x)), and jax2tf (after TF's grappler) folds the constant in first,
    Mul(x, Mul(x, Mul(c, x))). So the term is read as a product tree: its leaves must be exactly three
    factors of x (Pow(x, n) counts n) and constants whose product is 0.044715.
    """
    found = _monomial(index, term, x, depth=4)
    if found is None:
        return None
    nodes, power, coefficient = found
    if power != 3 or not base.near(coefficient, CUBIC, rtol=_RTOL) or not nodes:
        return None
    unique = list({id(n): n for n in nodes}.values())
    return sorted(unique, key=lambda n: index.producer.get(n.output[0], 0))


def _monomial(index: GraphIndex, t: str, x: str, depth: int) -> tuple[list[onnx.NodeProto], int, float] | None:
    """(nodes, n, c) when tensor `t` is c·xⁿ written with Mul and Pow nodes (at most `depth` deep)."""
    if t == x:
        return [], 1, 1.0
    value = index.scalar(t)
    if value is not None:
        return [], 0, value
    node = index.producer_node(t)
    if node is None or depth == 0:
        return None
    if is_op(node, "Pow") and node.input[0] == x:
        n = index.scalar(node.input[1])
        return ([node], int(n), 1.0) if n is not None and n == int(n) and n > 0 else None
    if not is_op(node, "Mul") or len(node.input) != 2:
        return None
    left = _monomial(index, node.input[0], x, depth - 1)
    right = _monomial(index, node.input[1], x, depth - 1)
    if left is None or right is None:
        return None
    return [*left[0], *right[0], node], left[1] + right[1], left[2] * right[2]


def _tail(index: GraphIndex, x: str, head: list[onnx.NodeProto], what: str) -> Match | NoMatch:
    """The GELU ending `0.5·x·(1 + e)` where `head`'s last node writes e, in any of the three orders."""
    e = head[-1].output[0]
    add = next((n for n in _readers(index, e, "Add") if _near(index, other_input(n, e) or "", 1.0)), None)
    if add is None:
        return NoMatch(f"1 is not added to {what}")
    a = add.output[0]
    for m in _readers(index, a, "Mul"):
        o = other_input(m, a)
        if o is None:
            continue
        if o == x:  # x·(1+e) then ·0.5
            for h in _readers(index, m.output[0], "Mul"):
                if _near(index, other_input(h, m.output[0]) or "", 0.5):
                    return Match(KERNEL, x, (*head, add, m, h), h.output[0])
        half_x = index.producer_node(o)
        halves_x = half_x is not None and is_op(half_x, "Mul") and x in half_x.input
        if half_x is not None and halves_x and _near(index, other_input(half_x, x) or "", 0.5):
            return Match(KERNEL, x, (half_x, *head, add, m), m.output[0])  # (0.5·x)·(1+e)
        if _near(index, o, 0.5):  # ((1+e)·0.5)·x
            for fin in _readers(index, m.output[0], "Mul"):
                if other_input(fin, m.output[0]) == x:
                    return Match(KERNEL, x, (*head, add, m, fin), fin.output[0])
    return NoMatch(f"(1 + {what}) is not multiplied by x and 0.5")


def _either_at(index: GraphIndex, node: onnx.NodeProto) -> Match | NoMatch:
    return match_tanh_at(index, node) if is_op(node, "Tanh") else match_at(index, node)


def match_from(index: GraphIndex, x: str) -> Match | NoMatch:
    """The GELU (Erf or tanh form) of tensor `x`, if any (its Erf lies two nodes downstream, its Tanh
    at most five: Mul, Mul, Mul, Add, Mul)."""
    return base.match_from(index, x, _either_at, 6, KERNEL)
