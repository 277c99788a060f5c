"""`global-pool`: an AveragePool/MaxPool whose one window covers its whole input -> GlobalAveragePool /
GlobalMaxPool.

Why: TFLite-exported MobileNetV3 blocks pool for squeeze-excite with kernel = stride = H×W (64×64 in a
segmenter). A converter that reads the stride rejects it (rk3588: stride [1, 8]) or sends it to the CPU
(ten CPU islands in one model), though with one window the stride never applies. Written as the global
op, the pool is what every NPU list has and no stride is left to misread. Which pools qualify is
`quantscan.patterns.global_pool`: kernel = the input's static spatial size, no padding, no dilation,
no Indices output. The output tensor, its shape ([N, C, 1, ...]) and the node name stay; the edit is
exact (the same sum or max over the same cells), and the pipeline proves it on data like every pass.

A pool whose input size is not static is refused with the free dims named (fix-dim first); a pool with
a smaller window is not a candidate and is not listed.
"""

from __future__ import annotations

import onnx

from quantscan.graph.edit import copy_model, node_label
from quantscan.graph.index import GraphIndex
from quantscan.graph.infer import infer_shapes
from quantscan.patterns import global_pool
from quantscan.rewrites.base import Change, Refusal, RewriteResult

REWRITE_ID = "global-pool"


def rewrite_global_pools(model: onnx.ModelProto) -> RewriteResult:
    """Replace every whole-input pool by its global op; return the new model and the record."""
    out = copy_model(model)
    index = GraphIndex.of(_with_shapes(out))
    result = RewriteResult(model=out)
    for pos, node in enumerate(index.nodes):
        found = global_pool.match_at(index, node)
        label = node_label(node)
        if isinstance(found, global_pool.GlobalPoolMatch):
            out.graph.node[pos].CopyFrom(
                onnx.helper.make_node(found.global_op, [found.x], [found.output], name=node.name)
            )
            window = "x".join(str(k) for k in found.window)
            detail = f"{node.op_type} {window} over its whole {window} input -> {found.global_op}"
            result.changes.append(Change(REWRITE_ID, label, detail))
        elif node.op_type in global_pool.GLOBAL_FORM and "not fixed" in found.reason:
            result.refusals.append(Refusal(REWRITE_ID, label, f"{found.reason} (fix-dim first)"))
    return result


def _with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with inferred shapes (as declared when inference fails): the windows are compared with them."""
    try:
        return infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - a model inference cannot type keeps its declared shapes
        return model
