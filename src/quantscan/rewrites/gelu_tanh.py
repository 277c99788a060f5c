"""`gelu-tanh`: exact (Erf) GELU -> tanh approximation 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).

Why: many NPUs have Tanh but no Erf, and the tanh form is what their GELU kernels compute. It is an
approximation (max |error| about 3e-4 for unit-scale inputs), so the result is marked `exact=False`
and its proof is labelled approximate. Recognised: the Erf forms of `quantscan.patterns.gelu`, and a
native Gelu (opset 20) with approximate="none", whose attribute is switched to "tanh".
The replacement is written with Mul/Add/Tanh (opset-neutral); its last node writes the original
output name. Refused: an intermediate read elsewhere.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from quantscan.graph.edit import (
    Replacements,
    copy_model,
    elem_types,
    get_attr,
    node_label,
    np_dtype,
    scalar_input,
    set_attr,
    unique_name,
)
from quantscan.graph.index import GraphIndex
from quantscan.patterns import gelu
from quantscan.patterns.base import Match
from quantscan.rewrites.base import Change, Refusal, RewriteResult

REWRITE_ID = "gelu-tanh"


def gelu_tanh(model: onnx.ModelProto) -> RewriteResult:
    """Replace every Erf-GELU by the tanh approximation; new model plus changes and refusals."""
    out = copy_model(model)
    graph = out.graph
    index = GraphIndex(graph, ir_version=out.ir_version)
    taken = index.taken_names()
    types = elem_types(out)
    edits = Replacements(graph)
    result = RewriteResult(model=out, exact=False)
    for node in index.nodes:
        if node.op_type == "Gelu" and node.domain in ("", "ai.onnx"):
            if get_attr(node, "approximate", b"none") in (b"none", "none"):
                set_attr(node, "approximate", "tanh")
                result.changes.append(
                    Change(REWRITE_ID, node_label(node), 'Gelu approximate "none" -> "tanh"')
                )
            continue
        found = gelu.match_at(index, node)
        if not isinstance(found, Match):
            continue
        x, nodes = found.x, list(found.nodes)
        label = node_label(node)
        shared = found.shared(index)
        if shared:
            reason = f"intermediate {shared[0]!r} has another consumer or is an output"
            result.refusals.append(Refusal(REWRITE_ID, label, reason))
            continue
        dtype = np_dtype(types.get(x))
        base = node.name or f"gelu:{nodes[-1].output[0]}"
        new = _tanh_form(out, x, nodes[-1].output[0], dtype, base, taken)
        edits.replace(nodes, new, keep=x)
        result.changes.append(Change(REWRITE_ID, label, f"{'+'.join(n.op_type for n in nodes)} -> tanh GELU"))
    edits.apply()
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
