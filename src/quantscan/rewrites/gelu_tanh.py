"""`gelu-tanh`: exact (Erf) GELU -> tanh approximation 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).

Why: many NPUs have Tanh but no Erf, and the tanh form is what their GELU kernels compute. It is an
approximation (max |error| about 3e-4 for unit-scale inputs), so the result is marked `exact=False`
and its proof is labelled approximate. Recognised Erf forms (operands in either order):
    e = Erf(Div(x, √2) | Mul(x, 1/√2)); a = Add(e, 1); then
    Mul(Mul(x, a), 0.5) | Mul(Mul(x, 0.5), a) | Mul(x, Mul(a, 0.5))
and a native Gelu (opset 20) with approximate="none", whose attribute is switched to "tanh".
The replacement is written with Mul/Add/Tanh (opset-neutral); its last node writes the original
output name. Refused: an intermediate read elsewhere.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from quantscan.rewrites._graph import (
    GraphIndex,
    copy_model,
    elem_types,
    get_attr,
    node_label,
    np_dtype,
    prune_unused,
    scalar_input,
    set_attr,
    splice,
    unique_name,
)
from quantscan.rewrites.base import Change, Refusal, RewriteResult

REWRITE_ID = "gelu-tanh"


def gelu_tanh(model: onnx.ModelProto) -> RewriteResult:
    """Replace every Erf-GELU by the tanh approximation; new model plus changes and refusals."""
    out = copy_model(model)
    graph = out.graph
    index = GraphIndex(graph, out.ir_version)
    taken = index.names()
    types = elem_types(out)
    position = {n.output[0]: k for k, n in enumerate(graph.node) if n.output}
    result = RewriteResult(model=out, exact=False)
    remove: set[int] = set()
    insert: dict[int, list[onnx.NodeProto]] = {}
    orphans: set[str] = set()
    for node in graph.node:
        if node.op_type == "Gelu" and node.domain in ("", "ai.onnx"):
            if get_attr(node, "approximate", b"none") in (b"none", "none"):
                set_attr(node, "approximate", "tanh")
                result.changes.append(
                    Change(REWRITE_ID, node_label(node), 'Gelu approximate "none" -> "tanh"')
                )
            continue
        if node.op_type != "Erf" or node.domain not in ("", "ai.onnx"):
            continue
        found = _match(node, index)
        if found is None:
            continue
        x, nodes = found
        label = node_label(node)
        shared = [n.output[0] for n in nodes[:-1] if index.use_count(n.output[0]) != 1]
        if shared:
            reason = f"intermediate {shared[0]!r} has another consumer or is an output"
            result.refusals.append(Refusal(REWRITE_ID, label, reason))
            continue
        dtype = np_dtype(types.get(x))
        base = node.name or f"gelu:{nodes[-1].output[0]}"
        new = _tanh_form(out, x, nodes[-1].output[0], dtype, base, taken)
        positions = [position[n.output[0]] for n in nodes]
        remove.update(positions)
        insert[max(positions)] = new
        orphans.update(i for n in nodes for i in n.input if i != x)
        result.changes.append(Change(REWRITE_ID, label, f"{'+'.join(n.op_type for n in nodes)} -> tanh GELU"))
    if remove:
        splice(graph, remove, insert)
        prune_unused(graph, orphans)
    return result


def _tanh_form(
    model: onnx.ModelProto, x: str, y: str, dtype: np.dtype, base: str, taken: set[str]
) -> list[onnx.NodeProto]:
    make = onnx.helper.make_node

    def t(s: str) -> str:
        return unique_name(f"{base}/{s}", taken)

    def c(s: str, v: float) -> str:
        return scalar_input(model, f"{base}/{s}", v, dtype, taken)

    x2, x3, k, u, v, th, w, z = (t(s) for s in ("x2", "x3", "k", "u", "v", "tanh", "w", "z"))
    return [
        make("Mul", [x, x], [x2], name=t("Mul")),
        make("Mul", [x2, x], [x3], name=t("Mul")),
        make("Mul", [x3, c("c", 0.044715)], [k], name=t("Mul")),
        make("Add", [x, k], [u], name=t("Add")),
        make("Mul", [u, c("sqrt_2_over_pi", math.sqrt(2.0 / math.pi))], [v], name=t("Mul")),
        make("Tanh", [v], [th], name=t("Tanh")),
        make("Add", [th, c("one", 1.0)], [w], name=t("Add")),
        make("Mul", [x, w], [z], name=t("Mul")),
        make("Mul", [z, c("half", 0.5)], [y], name=t("Mul")),
    ]


def _is(node: onnx.NodeProto | None, op: str) -> bool:
    return node is not None and node.op_type == op and node.domain in ("", "ai.onnx")


def _near(index: GraphIndex, name: str, target: float) -> bool:
    value = index.constant(name)
    return (
        value is not None
        and value.size == 1
        and bool(np.isclose(float(value.reshape(())), target, rtol=1e-4))
    )


def _other(node: onnx.NodeProto, name: str) -> str | None:
    if len(node.input) != 2 or name not in node.input:
        return None
    return node.input[1] if node.input[0] == name else node.input[0]


def _readers(index: GraphIndex, name: str, op: str) -> list[onnx.NodeProto]:
    return [n for n in index.consumers.get(name, []) if _is(n, op)]


def _match(erf: onnx.NodeProto, index: GraphIndex) -> tuple[str, list[onnx.NodeProto]] | None:
    """(x, pattern nodes ending with the one writing the GELU output) or None."""
    scale = index.producer.get(erf.input[0])
    if scale is None:
        return None
    if _is(scale, "Div") and _near(index, scale.input[1], math.sqrt(2.0)):
        x = scale.input[0]
    elif _is(scale, "Mul"):
        cands = [i for i in scale.input if _near(index, i, 1 / math.sqrt(2.0))]
        if not cands:
            return None
        other = _other(scale, cands[0])
        if other is None:
            return None
        x = other
    else:
        return None
    add = next(
        (
            n
            for n in _readers(index, erf.output[0], "Add")
            if _near(index, _other(n, erf.output[0]) or "", 1.0)
        ),
        None,
    )
    if add is None:
        return None
    a = add.output[0]
    for m in _readers(index, a, "Mul"):
        o = _other(m, a)
        if o is None:
            continue
        if o == x:  # x·(1+erf) then ·0.5
            for h in _readers(index, m.output[0], "Mul"):
                if _near(index, _other(h, m.output[0]) or "", 0.5):
                    return x, [scale, erf, add, m, h]
        half_x = index.producer.get(o)
        if (
            half_x is not None
            and _is(half_x, "Mul")
            and x in half_x.input
            and _near(index, _other(half_x, x) or "", 0.5)
        ):
            return x, [half_x, scale, erf, add, m]  # (0.5·x)·(1+erf)
        if _near(index, o, 0.5):  # ((1+erf)·0.5)·x
            for fin in _readers(index, m.output[0], "Mul"):
                if _other(fin, m.output[0]) == x:
                    return x, [scale, erf, add, m, fin]
    return None
