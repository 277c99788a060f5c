"""`fuse-hardswish`: recognise x·Clip(x+3, 0, 6)/6 (and its variants) and emit one HardSwish node.

Why: chips with a native HardSwish kernel (and quantscan's own site model) want one op, not four
quantization points. Recognised forms, with Add/Mul operands in either order:
    Mul(x, Clip(Add(x, 3), 0, 6)) then Div(·, 6) or Mul(·, 1/6)      (Mul-then-Div)
    Div(Clip(Add(x, 3), 0, 6), 6) or Mul(Clip(...), 1/6) then Mul(x, ·)  (Div-then-Mul)
    Mul(x, HardSigmoid(x; alpha=1/6, beta=1/2))
HardSwish exists from opset 14 on; below that the pass refuses (the model's opset is never changed by
a rewrite). It also refuses when an intermediate tensor has another reader, since removing it would
change that reader. The HardSwish node takes the pattern's first node's name and the last node's
output tensor, so downstream names are unchanged.
"""

from __future__ import annotations

import numpy as np
import onnx

from quantscan.rewrites._graph import (
    GraphIndex,
    attr_float,
    copy_model,
    get_attr,
    node_label,
    opset_version,
    prune_unused,
    splice,
)
from quantscan.rewrites.base import Change, Refusal, RewriteResult

REWRITE_ID = "fuse-hardswish"
MIN_OPSET = 14


def fuse_hardswish(model: onnx.ModelProto) -> RewriteResult:
    """Fuse every recognised HardSwish pattern; return a new model plus changes and refusals."""
    out = copy_model(model)
    graph = out.graph
    index = GraphIndex(graph, out.ir_version)
    opset = opset_version(out)
    position = {n.output[0]: k for k, n in enumerate(graph.node) if n.output}
    result = RewriteResult(model=out)
    remove: set[int] = set()
    insert: dict[int, list[onnx.NodeProto]] = {}
    orphans: set[str] = set()
    used: set[int] = set()
    for node in graph.node:
        match = _match(node, index)
        if match is None:
            continue
        x, nodes = match
        label = node_label(nodes[0])
        positions = [position[n.output[0]] for n in nodes]
        if used.intersection(positions):
            continue
        if opset < MIN_OPSET:
            result.refusals.append(
                Refusal(REWRITE_ID, label, f"HardSwish needs opset >= {MIN_OPSET}, the model imports {opset}")
            )
            continue
        shared = [t for n in nodes[:-1] for t in n.output if index.use_count(t) != 1]
        if shared:
            result.refusals.append(
                Refusal(
                    REWRITE_ID, label, f"intermediate {shared[0]!r} has another consumer (or is an output)"
                )
            )
            continue
        last = max(positions)
        y = nodes[-1].output[0]
        fused = onnx.helper.make_node("HardSwish", [x], [y], name=nodes[0].name or f"HardSwish:{y}")
        used.update(positions)
        remove.update(positions)
        insert[last] = [fused]
        orphans.update(i for n in nodes for i in n.input if i != x)
        kinds = "+".join(n.op_type for n in nodes)
        result.changes.append(Change(REWRITE_ID, label, f"{kinds} -> HardSwish"))
    if remove:
        splice(graph, remove, insert)
        prune_unused(graph, orphans)
    return result


def _near(value: np.ndarray | None, target: float) -> bool:
    return (
        value is not None
        and value.size == 1
        and bool(np.isclose(float(value.reshape(())), target, rtol=1e-5))
    )


def _const_operand(node: onnx.NodeProto, index: GraphIndex, target: float) -> str | None:
    """The non-constant input of a binary node whose other input is the scalar `target`, else None."""
    if len(node.input) != 2:
        return None
    a, b = node.input
    if _near(index.constant(b), target):
        return a
    if _near(index.constant(a), target):
        return b
    return None


def _clip_bounds(clip: onnx.NodeProto, index: GraphIndex) -> tuple[float, float] | None:
    if get_attr(clip, "min") is not None or get_attr(clip, "max") is not None:
        return attr_float(clip, "min", -np.inf), attr_float(clip, "max", np.inf)
    if len(clip.input) < 3 or not clip.input[1] or not clip.input[2]:
        return None
    lo, hi = index.constant(clip.input[1]), index.constant(clip.input[2])
    if lo is None or hi is None or lo.size != 1 or hi.size != 1:
        return None
    return float(lo.reshape(())), float(hi.reshape(()))


def _readers(name: str, index: GraphIndex) -> list[onnx.NodeProto]:
    return index.consumers.get(name, [])


def _is(node: onnx.NodeProto | None, op: str) -> bool:
    return node is not None and node.op_type == op and node.domain in ("", "ai.onnx")


def _match(anchor: onnx.NodeProto, index: GraphIndex) -> tuple[str, list[onnx.NodeProto]] | None:
    """(x, pattern nodes in order) when `anchor` is the Clip or HardSigmoid of a HardSwish pattern."""
    if _is(anchor, "HardSigmoid"):
        alpha = attr_float(anchor, "alpha", 0.2)
        beta = attr_float(anchor, "beta", 0.5)
        if not (np.isclose(alpha, 1 / 6, rtol=1e-5) and np.isclose(beta, 0.5, rtol=1e-5)):
            return None
        x = anchor.input[0]
        for mul in _readers(anchor.output[0], index):
            if _is(mul, "Mul") and set(mul.input) == {x, anchor.output[0]}:
                return x, [anchor, mul]
        return None
    if not _is(anchor, "Clip"):
        return None
    bounds = _clip_bounds(anchor, index)
    if bounds is None or not (np.isclose(bounds[0], 0.0) and np.isclose(bounds[1], 6.0, rtol=1e-5)):
        return None
    add = index.producer.get(anchor.input[0])
    if add is None or not _is(add, "Add"):
        return None
    x = _const_operand(add, index, 3.0)
    if x is None:
        return None
    c = anchor.output[0]
    for n1 in _readers(c, index):
        # Mul-then-Div / Mul-then-Mul(1/6)
        if _is(n1, "Mul") and set(n1.input) == {x, c}:
            for n2 in _readers(n1.output[0], index):
                if _scales_by_sixth(n2, n1.output[0], index):
                    return x, [add, anchor, n1, n2]
        # Div-then-Mul / Mul(1/6)-then-Mul
        if _scales_by_sixth(n1, c, index):
            for n2 in _readers(n1.output[0], index):
                if _is(n2, "Mul") and set(n2.input) == {x, n1.output[0]}:
                    return x, [add, anchor, n1, n2]
    return None


def _scales_by_sixth(node: onnx.NodeProto, operand: str, index: GraphIndex) -> bool:
    """True for Div(operand, 6) or Mul(operand, 1/6) (either order for Mul)."""
    if _is(node, "Div") and len(node.input) == 2 and node.input[0] == operand:
        return _near(index.constant(node.input[1]), 6.0)
    if _is(node, "Mul"):
        return _const_operand(node, index, 1 / 6) == operand
    return False
