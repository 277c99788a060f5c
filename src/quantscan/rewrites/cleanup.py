"""`cleanup`: remove Identity and inference-mode Dropout, fold constant subgraphs, drop dead nodes.

Why: exporters leave Identity/Dropout chains and constant arithmetic (Paddle: Cast/Mul on constants,
PyTorch: shape arithmetic on fixed sizes). Each one is a tensor boundary where a naive quantizer puts a
fake-quant point or a converter gives up. Removing them is exact.

Names: when a removed node's input is read only by that node, its producer is renamed to write the
removed node's output, so downstream tensor names (and graph outputs) stay those of the original.
Refused: an Identity/Dropout linking a graph input straight to a graph output (nothing to rename), a
Dropout whose mask is read or whose training_mode is not constant false, tensors read inside subgraphs.
"""

from __future__ import annotations

import onnx

from quantscan.graph.edit import (
    copy_model,
    drop_value_info,
    node_label,
)
from quantscan.graph.fold import fold_constants
from quantscan.graph.index import GraphIndex, subgraph_inputs
from quantscan.rewrites.base import Change, Refusal, RewriteResult

REWRITE_ID = "cleanup"


def cleanup(model: onnx.ModelProto) -> RewriteResult:
    """Remove pass-through nodes, fold constants, drop dead nodes; return a new model and the record."""
    out = copy_model(model)
    result = RewriteResult(model=out)
    _remove_pass_through(out, result)
    for label in fold_constants(out):
        result.changes.append(Change(REWRITE_ID, label, "constant subgraph folded"))
    for label in _drop_dead(out):
        result.changes.append(Change(REWRITE_ID, label, "dead node removed (its outputs are never read)"))
    return result


def _pass_through_reason(node: onnx.NodeProto, index: GraphIndex) -> str | None:
    """None when the node is a pure pass-through in inference, else why it is not."""
    if node.op_type == "Dropout":
        if len(node.output) > 1 and node.output[1] and index.use_count(node.output[1]):
            return "Dropout mask output is read"
        if len(node.input) > 2 and node.input[2]:
            mode = index.constant(node.input[2])
            if mode is None or bool(mode.reshape(-1)[0]):
                return "Dropout training_mode is not constant false"
    return None


def _remove_pass_through(model: onnx.ModelProto, result: RewriteResult) -> None:
    graph = model.graph
    while True:
        index = GraphIndex(graph, ir_version=model.ir_version)
        sub_reads: set[str] = set()
        for n in graph.node:
            sub_reads |= subgraph_inputs(n)
        done = False
        for pos, node in enumerate(graph.node):
            if node.op_type not in ("Identity", "Dropout") or node.domain not in ("", "ai.onnx"):
                continue
            label = node_label(node)
            reason = _pass_through_reason(node, index)
            x, y = node.input[0], node.output[0]
            if reason is None and (x in sub_reads or y in sub_reads):
                reason = "its tensors are read inside a subgraph"
            x_private = x in index.producer and index.use_count(x) == 1
            if reason is None and not x_private and y in index.graph_outputs:
                reason = (
                    "it links a graph input or shared tensor to a graph output; removing it renames an output"
                )
            if reason is not None:
                if not any(r.node == label for r in result.refusals):
                    result.refusals.append(Refusal(REWRITE_ID, label, reason))
                continue
            if x_private:
                producer = index.nodes[index.producer[x]]
                for k, o in enumerate(producer.output):
                    if o == x:
                        producer.output[k] = y
                detail = f"{node.op_type} removed; producer now writes {y!r}"
                drop_value_info(graph, [x])
            else:
                for reader in index.readers(y):
                    for k, i in enumerate(reader.input):
                        if i == y:
                            reader.input[k] = x
                detail = f"{node.op_type} removed; readers of {y!r} now read {x!r}"
                drop_value_info(graph, [y])
            del graph.node[pos]
            result.changes.append(Change(REWRITE_ID, label, detail))
            done = True
            break
        if not done:
            return


def _drop_dead(model: onnx.ModelProto) -> list[str]:
    """Remove nodes whose outputs nobody reads and that are no graph output (repeatedly), then dead
    initializers."""
    graph = model.graph
    removed: list[str] = []
    while True:
        index = GraphIndex(graph, ir_version=model.ir_version)
        keep = []
        dead = []
        for node in graph.node:
            if any(o and index.use_count(o) for o in node.output):
                keep.append(node)
            else:
                dead.append(node)
        if not dead:
            break
        removed.extend(node_label(n) for n in dead)
        del graph.node[:]
        graph.node.extend(keep)
        drop_value_info(graph, [o for n in dead for o in n.output])
    index = GraphIndex(graph, ir_version=model.ir_version)
    live = [t for t in graph.initializer if index.use_count(t.name) or t.name in index.graph_input_names]
    for t in graph.initializer:
        if not (index.use_count(t.name) or t.name in index.graph_input_names):
            removed.append(f"initializer {t.name}")
    if len(live) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(live)
    return removed
