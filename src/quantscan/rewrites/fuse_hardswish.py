"""`fuse-hardswish`: recognise x·Clip(x+3, 0, 6)/6 (and its variants) and emit one HardSwish node.

Why: chips with a native HardSwish kernel (and quantscan's own site model) want one op, not four
quantization points. Recognised forms: the decomposed spellings of `quantscan.patterns.hardswish`
(Add/Clip/Mul/Div in both orders, and HardSigmoid(x; 1/6, 1/2)·x).
HardSwish exists from opset 14 on; below that the pass refuses (the model's opset is never changed by
a rewrite). It also refuses when an intermediate tensor has another reader, since removing it would
change that reader. The HardSwish node takes the pattern's first node's name and the last node's
output tensor, so downstream names are unchanged.
"""

from __future__ import annotations

import onnx

from quantscan.graph.edit import Replacements, copy_model, node_label
from quantscan.graph.index import GraphIndex, opset_version
from quantscan.patterns import hardswish
from quantscan.rewrites.base import Change, Refusal, RewriteResult

REWRITE_ID = "fuse-hardswish"
MIN_OPSET = 14


def fuse_hardswish(model: onnx.ModelProto) -> RewriteResult:
    """Fuse every recognised HardSwish pattern; return a new model plus changes and refusals."""
    out = copy_model(model)
    graph = out.graph
    index = GraphIndex(graph, ir_version=out.ir_version)
    opset = opset_version(out)
    edits = Replacements(graph)
    result = RewriteResult(model=out)
    for node in index.nodes:
        match = hardswish.match_at(index, node)
        if not isinstance(match, hardswish.HardSwishMatch) or match.spelling not in hardswish.DECOMPOSED:
            continue
        x, nodes = match.x, list(match.nodes)
        label = node_label(nodes[0])
        if edits.overlaps(nodes):
            continue
        if opset < MIN_OPSET:
            result.refusals.append(
                Refusal(REWRITE_ID, label, f"HardSwish needs opset >= {MIN_OPSET}, the model imports {opset}")
            )
            continue
        shared = match.shared(index)
        if shared:
            result.refusals.append(
                Refusal(
                    REWRITE_ID, label, f"intermediate {shared[0]!r} has another consumer (or is an output)"
                )
            )
            continue
        y = nodes[-1].output[0]
        fused = onnx.helper.make_node("HardSwish", [x], [y], name=nodes[0].name or f"HardSwish:{y}")
        edits.replace(nodes, [fused], keep=x)
        kinds = "+".join(n.op_type for n in nodes)
        result.changes.append(Change(REWRITE_ID, label, f"{kinds} -> HardSwish"))
    edits.apply()
    return result
