"""`decompose-layernorm`: LayerNormalization -> ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add.

Why: LayerNormalization exists from opset 17; targets whose converters stop below that (and chips
without the op) need the arithmetic form, which is what PyTorch < 1.13 and Paddle export anyway.
Exact up to float32 rounding for float32 inputs. The last node writes the original output name.
ReduceMean takes `axes` as an attribute before opset 18 and as an input from 18 on; both are emitted.
Refused: the optional Mean / InvStdDev outputs are read, a non-float32 input (stash_type computes in
float32, the arithmetic form would compute in the input type), a positive axis with unknown rank.
"""

from __future__ import annotations

import numpy as np
import onnx

from quantscan.graph.edit import (
    add_initializer,
    attr_float,
    attr_int,
    copy_model,
    elem_types,
    node_label,
    splice,
    unique_name,
)
from quantscan.graph.index import GraphIndex, opset_version
from quantscan.graph.infer import infer_shapes
from quantscan.rewrites.base import Change, Refusal, RewriteResult

REWRITE_ID = "decompose-layernorm"


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    try:
        inferred = infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - rank stays unknown
        return {}
    g = inferred.graph
    return {
        vi.name: len(vi.type.tensor_type.shape.dim)
        for vi in list(g.input) + list(g.value_info) + list(g.output)
        if vi.type.tensor_type.HasField("shape")
    }


def decompose_layernorm(model: onnx.ModelProto) -> RewriteResult:
    """Replace every LayerNormalization by its arithmetic form; new model plus changes and refusals."""
    out = copy_model(model)
    graph = out.graph
    index = GraphIndex(graph, ir_version=out.ir_version)
    taken = index.taken_names()
    types = elem_types(out)
    ranks = _ranks(out)
    opset = opset_version(out)
    result = RewriteResult(model=out)
    remove: set[int] = set()
    insert: dict[int, list[onnx.NodeProto]] = {}
    for pos, node in enumerate(graph.node):
        if node.op_type != "LayerNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        label = node_label(node)
        x = node.input[0]
        if any(o and index.use_count(o) for o in node.output[1:]):
            result.refusals.append(Refusal(REWRITE_ID, label, "its Mean/InvStdDev outputs are read"))
            continue
        if types.get(x, onnx.TensorProto.FLOAT) != onnx.TensorProto.FLOAT:
            result.refusals.append(Refusal(REWRITE_ID, label, "input is not float32 (stash_type semantics)"))
            continue
        axis = attr_int(node, "axis", -1)
        if axis >= 0:
            rank = ranks.get(x)
            if rank is None:
                result.refusals.append(
                    Refusal(REWRITE_ID, label, f"axis {axis} with an input of unknown rank")
                )
                continue
            axis -= rank
        axes = list(range(axis, 0))
        eps = attr_float(node, "epsilon", 1e-5)
        new = _arithmetic(out, node, axes, eps, opset, taken, node.name or f"layernorm_{pos}")
        remove.add(pos)
        insert[pos] = new
        result.changes.append(
            Change(
                REWRITE_ID,
                label,
                f"LayerNormalization(axes {axes}, eps {eps:g}) -> {len(new)} arithmetic ops",
            )
        )
    if remove:
        splice(graph, remove, insert)
    return result


def _arithmetic(
    model: onnx.ModelProto,
    node: onnx.NodeProto,
    axes: list[int],
    eps: float,
    opset: int,
    taken: set[str],
    base: str,
) -> list[onnx.NodeProto]:
    """The ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul(/Add) nodes computing `node`'s output."""
    make = onnx.helper.make_node

    def t(suffix: str) -> str:
        return unique_name(f"{base}/{suffix}", taken)

    def const(suffix: str, value: np.ndarray) -> str:
        name = t(suffix)
        add_initializer(model, name, value)
        return name

    def reduce_mean(src: str, dst: str) -> onnx.NodeProto:
        if opset >= 18:
            return make(
                "ReduceMean", [src, const("axes", np.array(axes, np.int64))], [dst], name=t("ReduceMean")
            )
        return make("ReduceMean", [src], [dst], name=t("ReduceMean"), axes=axes)

    x, y = node.input[0], node.output[0]
    mean, diff, sq, var, var_eps, std, norm = (
        t(s) for s in ("mean", "diff", "sq", "var", "ve", "std", "norm")
    )
    has_bias = len(node.input) > 2 and bool(node.input[2])
    scaled = t("scaled") if has_bias else y
    nodes = [
        reduce_mean(x, mean),
        make("Sub", [x, mean], [diff], name=t("Sub")),
        make("Pow", [diff, const("two", np.array(2.0, np.float32))], [sq], name=t("Pow")),
        reduce_mean(sq, var),
        make("Add", [var, const("eps", np.array(eps, np.float32))], [var_eps], name=t("Add")),
        make("Sqrt", [var_eps], [std], name=t("Sqrt")),
        make("Div", [diff, std], [norm], name=t("Div")),
        make("Mul", [norm, node.input[1]], [scaled], name=t("Mul")),
    ]
    if has_bias:
        nodes.append(make("Add", [scaled, node.input[2]], [y], name=t("AddBias")))
    return nodes
