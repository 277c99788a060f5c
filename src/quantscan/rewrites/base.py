"""Result records every rewrite pass returns.

A pass never prints and never raises because a pattern is absent: it returns what it changed and, for
every candidate it left alone, why. The CLI and the rewrite report render those lists; the scan's graph
preparation only reads `model`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from quantscan.graph.edit import copy_model, elem_types, node_label, np_dtype, splice
from quantscan.graph.index import GraphIndex


@dataclass
class Change:
    """One edit a pass made: which rule, at which node (original name), and what it did."""

    rewrite: str
    node: str
    detail: str


@dataclass
class Refusal:
    """A candidate a pass looked at and left unchanged, with the reason (shown to the user)."""

    rewrite: str
    node: str
    reason: str


@dataclass
class RewriteResult:
    """The new model (the input model is never mutated) plus what changed and what was refused.

    `exact` is False for approximations (e.g. `gelu-tanh`): their numeric proof is labelled
    approximate instead of being held to float32 rounding.
    """

    model: onnx.ModelProto
    changes: list[Change] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    exact: bool = True

    @property
    def applied(self) -> bool:
        return bool(self.changes)


FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE})
"""Element types a numeric rewrite may touch (integer tensors keep their exact kernels)."""

Expansion = Callable[[onnx.ModelProto, onnx.NodeProto, str, np.dtype, set[str]], tuple[list[onnx.NodeProto], str]]
"""How one node is spelled out: (model being edited, the node, a base name for new tensors, its float
dtype, names taken) -> (the nodes replacing it, the last one writing the node's output; what changed)."""


def expand_nodes(model: onnx.ModelProto, op_type: str, rewrite: str, expansion: Expansion) -> RewriteResult:
    """Replace every standard-domain `op_type` node with float input by what `expansion` builds.

    Why shared: the decomposition rules (HardSwish, HardSigmoid) differ only in the nodes they write;
    the walk, the float-type refusal, the naming and the splice are the same, and one copy of them
    keeps the rules small (one file each, like compat/rules/).
    """
    out = copy_model(model)
    graph = out.graph
    taken = GraphIndex(graph).taken_names()
    types = elem_types(out)
    result = RewriteResult(model=out)
    remove: set[int] = set()
    insert: dict[int, list[onnx.NodeProto]] = {}
    for pos, node in enumerate(graph.node):
        if node.op_type != op_type or node.domain not in ("", "ai.onnx"):
            continue
        label = node_label(node)
        etype = types.get(node.input[0])
        if etype is not None and etype not in FLOAT_TYPES:
            result.refusals.append(Refusal(rewrite, label, f"input is not float (type {etype})"))
            continue
        nodes, detail = expansion(out, node, node.name or f"{op_type.lower()}_{pos}", np_dtype(etype), taken)
        remove.add(pos)
        insert[pos] = nodes
        result.changes.append(Change(rewrite, label, detail))
    if remove:
        splice(graph, remove, insert)
    return result
