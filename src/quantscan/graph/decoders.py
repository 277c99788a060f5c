"""Which graph outputs an autoregressive decoder emits: a Loop or Scan whose body picks a token by
ArgMax/TopK and carries it (or a stop flag made from it) into the next iteration.

Why: a CTC head and an attention decoder both give `[N, T, C]` class scores, and both may carry a
`character` table in their metadata (PP-Structure's SLANet has 28 HTML tokens for 30 classes, a count
that also fits CTC's blank + space), yet they decode differently: CTC collapses repeats and drops a
blank, an attention decoder emits one token per step from sos until eos. The shape and the metadata
cannot tell them apart; the graph can, since only a decoder feeds its own choice back.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from quantscan.graph.index import stable_node_names

STEPWISE_OPS = frozenset({"Identity", "Cast", "Softmax", "LogSoftmax", "Sigmoid", "Reshape", "Squeeze",
                          "Unsqueeze", "Transpose"})
"""Ops between a Loop/Scan output and a graph output that keep one row per decoding step (walked back
through their first input)."""

CHOICE_OPS = frozenset({"ArgMax", "TopK"})
"""How a greedy (or beam) decoder picks its token inside the body."""


def decoder_outputs(graph: onnx.GraphProto, outputs: Sequence[str]) -> dict[str, str]:
    """{output: the Loop/Scan node's stable name} for each of `outputs` that an autoregressive decoder
    produces, through `STEPWISE_OPS` only."""
    producers = {o: n for n in graph.node for o in n.output if o}
    names = dict(zip((id(n) for n in graph.node), stable_node_names(list(graph.node)), strict=True))
    found: dict[str, str] = {}
    for name in outputs:
        node = producers.get(name)
        while node is not None and node.op_type in STEPWISE_OPS and node.input:
            node = producers.get(node.input[0])
        if node is not None and node.op_type in ("Loop", "Scan") and feeds_back_choice(node):
            found[name] = names[id(node)]
    return found


def feeds_back_choice(node: onnx.NodeProto) -> bool:
    """True when the Loop/Scan body's ArgMax/TopK reaches a state carried to the next iteration (or the
    Loop's continue condition): the body decides its next input from its own output."""
    body = next((a.g for a in node.attribute if a.name == "body"), None)
    if body is None:
        return False
    carried = _carried_outputs(node, body)
    reached = _reachable_from_choices(body)
    return any(name in reached for name in carried)


def _carried_outputs(node: onnx.NodeProto, body: onnx.GraphProto) -> list[str]:
    """Body outputs that feed the next iteration: Loop's condition and carried states, Scan's states."""
    outs = [o.name for o in body.output]
    if node.op_type == "Loop":
        return outs[: 1 + max(len(node.input) - 2, 0)]
    scan_inputs = next((a.i for a in node.attribute if a.name == "num_scan_inputs"), 0)
    return outs[: max(len(node.input) - scan_inputs, 0)]


def _reachable_from_choices(body: onnx.GraphProto) -> set[str]:
    """Every tensor of `body` computed (transitively, in node order: ONNX bodies are topologically
    sorted) from an ArgMax/TopK output."""
    reached: set[str] = set()
    for n in body.node:
        if n.op_type in CHOICE_OPS or any(i in reached for i in n.input if i):
            reached.update(o for o in n.output if o)
    return reached
