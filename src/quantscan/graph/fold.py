"""Constant folding shared by the `cleanup` and `fix-dim` rewrites.

A node whose inputs are all constant is evaluated once with onnx.reference (pure numpy, the model's own
opset, no onnxruntime in a rewrite pass) and replaced by its value. Left alone on purpose:
random ops, Quantize/DequantizeLinear (folding them would silently dequantize a QDQ model's weights),
ops with subgraphs or from custom domains, and results that would bloat the file (a large output built
from small inputs, e.g. ConstantOfShape/Expand/Tile).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from quantscan.graph.edit import (
    add_initializer,
    drop_value_info,
    make_constant_node,
    node_label,
    prune_unused,
    splice,
)
from quantscan.graph.index import GraphIndex

NEVER_FOLD = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "Constant",
    }
)
MAX_GROWN_ELEMENTS = 1 << 20
"""A folded output larger than this, and larger than its inputs together, stays a computation."""


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)


def evaluate_node(
    node: onnx.NodeProto, inputs: list[np.ndarray | None], model: onnx.ModelProto
) -> list[np.ndarray]:
    """Run one node on constant inputs with onnx.reference under the model's opset imports."""
    names = [i for i in node.input]
    feeds = {n: v for n, v in zip(names, inputs, strict=True) if n and v is not None}
    g_inputs = [
        onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
        for n, v in feeds.items()
    ]
    g_outputs = [onnx.ValueInfoProto(name=o) for o in node.output if o]
    graph = onnx.helper.make_graph([node], "fold", g_inputs, g_outputs)
    mini = onnx.helper.make_model(graph, opset_imports=list(model.opset_import))
    mini.ir_version = max(model.ir_version, 3)
    return [np.asarray(v) for v in ReferenceEvaluator(mini).run(None, feeds)]


def fold_constants(model: onnx.ModelProto) -> list[str]:
    """Fold every foldable all-constant node of `model` in place; returns the folded nodes' labels.

    Called on a copy by the passes. Repeats until nothing changes (folding one node can make the next
    one constant); folded outputs become initializers, or Constant nodes when they are graph outputs.
    """
    folded: list[str] = []
    while True:
        graph = model.graph
        index = GraphIndex(graph, ir_version=model.ir_version)
        values: dict[str, np.ndarray] = {}
        remove: set[int] = set()
        insert: dict[int, list[onnx.NodeProto]] = {}
        orphans: set[str] = set()
        for pos, node in enumerate(graph.node):
            if (
                node.op_type in NEVER_FOLD
                or node.domain not in ("", "ai.onnx")
                or _has_subgraph(node)
                or not any(node.input)
            ):
                continue
            ins: list[np.ndarray | None] = []
            ok = True
            for name in node.input:
                if not name:
                    ins.append(None)
                    continue
                v = values.get(name)
                if v is None:
                    v = index.constant(name)
                if v is None:
                    ok = False
                    break
                ins.append(v)
            if not ok:
                continue
            try:
                outs = evaluate_node(node, ins, model)
            except Exception:  # noqa: BLE001 - a node the reference cannot evaluate stays as it is
                continue
            in_size = sum(int(v.size) for v in ins if v is not None)
            if any(o.size > MAX_GROWN_ELEMENTS and o.size > in_size for o in outs):
                continue
            replacement: list[onnx.NodeProto] = []
            for name, value in zip([o for o in node.output if o], outs, strict=False):
                values[name] = value
                if name in index.graph_outputs:
                    replacement.append(make_constant_node(name, value, f"{name}_folded"))
                else:
                    add_initializer(model, name, value)
            remove.add(pos)
            insert[pos] = replacement
            orphans.update(i for i in node.input if i)
            folded.append(node_label(node))
        if not remove:
            return folded
        splice(graph, remove, insert)
        drop_value_info(graph, values)
        prune_unused(graph, orphans)
