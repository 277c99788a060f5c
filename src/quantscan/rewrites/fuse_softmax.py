"""`fuse-softmax`: recognise a Softmax written out in arithmetic and emit one Softmax node.

Why: exports of hand-written attention (YOLOv12's area attention: `exp(a - a.max()) / sum`), TF and
jax2tf spell Softmax as ReduceMax, Sub, Exp, ReduceSum, Div. A chip that runs Softmax natively (Ethos-U,
RK3588) may run none of those parts (Ethos-U has no Exp, ReduceSum, ReduceMax or Div): each attention
row then crosses to the CPU and back. One Softmax node is the same function, in one kernel.
Recognised: `quantscan.patterns.softmax` (plain or max-shifted, keepdims or a restore chain), over one
axis. Softmax before opset 13 normalises over every axis from `axis` on, so there only a last-axis
softmax is fused. Refused: several axes, an intermediate read elsewhere, an unknown rank below opset 13.
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx

from quantscan.graph.edit import Replacements, copy_model, node_label, unique_name
from quantscan.graph.index import GraphIndex, opset_version
from quantscan.patterns import softmax
from quantscan.rewrites.base import Change, Refusal, RewriteResult
from quantscan.rewrites.fuse_layernorm import tensor_ranks

REWRITE_ID = "fuse-softmax"
PER_AXIS_OPSET = 13
"""From opset 13 Softmax normalises over `axis` alone (before, over the flattened axes from `axis` on)."""


def fuse_softmax(model: onnx.ModelProto) -> RewriteResult:
    """Fuse every recognised written-out Softmax; new model plus changes and refusals."""
    out = copy_model(model)
    graph = out.graph
    index = GraphIndex(graph, ir_version=out.ir_version)
    taken = index.taken_names()
    opset = opset_version(out)
    ranks = tensor_ranks(out) if opset < PER_AXIS_OPSET else {}
    edits = Replacements(graph)
    result = RewriteResult(model=out)
    for node in index.nodes:
        found = softmax.match_at(index, node) if node.op_type == "Exp" else None
        if not isinstance(found, softmax.SoftmaxMatch):
            continue
        label = node_label(found.nodes[0])
        refusal = refusal_of(found, index, opset, ranks)
        if refusal:
            result.refusals.append(Refusal(REWRITE_ID, label, refusal))
            continue
        axis = int(found.axes[0])
        name = unique_name(found.nodes[0].name or f"softmax:{found.output}", taken)
        fused = onnx.helper.make_node("Softmax", [found.x], [found.output], name=name, axis=axis)
        edits.replace(found.nodes, [fused], keep=found.x)
        ops = "/".join(n.op_type for n in found.nodes)
        result.changes.append(Change(REWRITE_ID, label, f"{len(found.nodes)} ops ({ops}) -> Softmax(axis {axis})"))
    edits.apply()
    return result


def refusal_of(found: softmax.SoftmaxMatch, index: GraphIndex, opset: int, ranks: Mapping[str, int]) -> str:
    """Why this match cannot become one Softmax node ("" when it can); `check` asks it too, so that it
    names the rewrite only where the rewrite applies."""
    if len(found.axes) != 1:
        return f"normalises over axes {list(found.axes)}: Softmax takes one axis"
    shared = found.shared(index)
    if shared:
        return f"intermediate {shared[0]!r} has another consumer or is an output"
    if opset < PER_AXIS_OPSET:
        rank = ranks.get(found.x)
        axis = int(found.axes[0])
        if rank is None or axis not in (-1, rank - 1):
            return (f"opset {opset} Softmax normalises every axis from `axis` on: only a last-axis softmax "
                    "fuses below opset 13")
    return ""
