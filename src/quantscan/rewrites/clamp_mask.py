"""`clamp-mask`: float-min / -inf attention-mask constants -> a finite value Softmax cannot tell apart.

Why: exporters write the attention mask as `scores + (1 - mask) * finfo(float32).min` (-3.4e38) or as
-inf. In float the masked scores vanish in Softmax either way, but a per-tensor int8 scale that must
cover -3.4e38 is ~1.3e36 per code: every real attention score quantizes to one code and the layer's
output is noise. Any value far enough below the scores gives the same Softmax (exp underflows to 0
in float32 below about -104 relative to the row maximum), and a finite, modest one leaves the Add's
range to the scores. The default -1e4 is what BERT-family exporters used before float-min; it is
proven on data like every rewrite (the runner's exact criterion), so a model whose scores reach 1e4
fails the proof instead of changing silently.

Recognised: a float initializer or Constant node holding values <= -1e30 (or -inf) whose value
reaches, through elementwise/shape ops, an Add whose output reaches a Softmax (or LogSoftmax).
Refused: such a constant that reaches no Softmax through an Add (a sentinel with another purpose).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import onnx
from onnx import numpy_helper

from quantscan.graph.edit import copy_model, node_label
from quantscan.graph.index import GraphIndex
from quantscan.rewrites.base import Change, Refusal, RewriteResult

REWRITE_ID = "clamp-mask"
CLAMP_VALUE = -1.0e4
"""The finite mask value written in place of float-min / -inf when no smaller one is proven."""
CLAMP_CANDIDATES: tuple[float, ...] = (-100.0, -1000.0)
"""Values tried first (smallest magnitude first) when the user names none: the smaller the mask, the
more int8 codes the Add's per-tensor scale leaves to the real scores (all-MiniLM-L6-v2: output cosine
0.43 at -1e4, 0.58 at -1000, 0.77 at -100). The first whose proof is exact on the data is kept."""
MASK_THRESHOLD = -1.0e30
"""Values at or below this are mask sentinels (float32's min is -3.4e38; no real weight is this large)."""
MAX_DEPTH = 12
"""How many nodes a mask may pass through on its way to the Softmax (Cast/Unsqueeze/Mul/Sub/Add/Reshape...)."""
SOFTMAX_OPS = frozenset({"Softmax", "LogSoftmax"})


def clamp_mask(model: onnx.ModelProto, value: float = CLAMP_VALUE) -> RewriteResult:
    """Replace every float-min / -inf mask constant that reaches a Softmax through an Add by `value`."""
    out = copy_model(model)
    graph = out.graph
    index = GraphIndex(graph, ir_version=out.ir_version)
    result = RewriteResult(model=out)
    for init in graph.initializer:
        arr = numpy_helper.to_array(init)
        if _is_mask(arr):
            fixed = _clamp(arr, value)
            if _record(index, init.name, arr, value, f"initializer {init.name!r}", result):
                init.CopyFrom(numpy_helper.from_array(fixed, init.name))
    for node in graph.node:
        if node.op_type != "Constant" or not node.output:
            continue
        attr = next((a for a in node.attribute if a.name == "value"), None)
        if attr is None:
            continue
        arr = numpy_helper.to_array(attr.t)
        if _is_mask(arr):
            fixed = _clamp(arr, value)
            if _record(index, node.output[0], arr, value, f"Constant {node_label(node)!r}", result):
                attr.t.CopyFrom(numpy_helper.from_array(fixed, attr.t.name))
    return result


def _is_mask(arr: np.ndarray) -> bool:
    """A float constant holding float-min-like or -inf values."""
    return bool(np.issubdtype(arr.dtype, np.floating) and arr.size and (arr <= MASK_THRESHOLD).any())


def _clamp(arr: np.ndarray, value: float) -> np.ndarray:
    """The sentinel values replaced by `value`; every other value kept bit for bit."""
    return np.where(arr <= MASK_THRESHOLD, np.asarray(value, dtype=arr.dtype), arr).astype(arr.dtype)


def _record(
    index: GraphIndex, tensor: str, arr: np.ndarray, value: float, what: str, result: RewriteResult
) -> bool:
    """Note the change (True) or the refusal (False) for one sentinel constant."""
    path = reaches_softmax_through_add(index, tensor)
    if path is None:
        result.refusals.append(Refusal(REWRITE_ID, what, "its value reaches no Softmax through an Add"))
        return False
    add, softmax = path
    sentinel = float(arr[arr <= MASK_THRESHOLD].min())
    count = int((arr <= MASK_THRESHOLD).sum())
    result.changes.append(Change(
        REWRITE_ID, what,
        f"{count} mask value(s) {sentinel:.3g} -> {value:g} (Add {add!r} feeds Softmax {softmax!r})",
    ))
    return True


def reaches_softmax_through_add(index: GraphIndex, tensor: str) -> tuple[str, str] | None:
    """(Add node, Softmax node) when `tensor` flows into an Add whose output reaches a Softmax."""
    queue: deque[tuple[str, int, str | None]] = deque([(tensor, 0, None)])
    seen: set[tuple[str, str | None]] = set()
    while queue:
        name, depth, add = queue.popleft()
        if (name, add) in seen or depth > MAX_DEPTH:
            continue
        seen.add((name, add))
        for user in index.users(name):
            if user.op_type in SOFTMAX_OPS and add is not None:
                return add, node_label(user)
            via = add if add is not None or user.op_type != "Add" else node_label(user)
            for o in user.output:
                if o:
                    queue.append((o, depth + 1, via))
    return None
