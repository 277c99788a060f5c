"""`fuse-layernorm`: recognise the arithmetic LayerNorm and emit one LayerNormalization node.

Why: chips with a native LayerNorm kernel run it in higher precision as one op; left decomposed, a
quantizer puts fake-quant points on the variance (Pow/ReduceMean), the most int8-hostile tensors in a
transformer. Recognised (Paddle and PyTorch exports):
    m = ReduceMean(x, A); d = Sub(x, m); p = Pow(d, 2) | Mul(d, d); v = ReduceMean(p, A)
    s = Sqrt(Add(v, eps)); n = Div(d, s); [y = Mul(n, scale)]; [y = Add(y, bias)]
with A the trailing axes (a contiguous range ending at the last axis), eps/scale/bias constant.
LayerNormalization exists from opset 17: below that the pass refuses (the opset is never changed by a
rewrite). Refused too: an intermediate read elsewhere, non-trailing axes, a scale/bias whose shape is not
the normalized shape, no scale and unknown normalized shape.
"""

from __future__ import annotations

import numpy as np
import onnx

from quantscan.rewrites._graph import (
    GraphIndex,
    add_initializer,
    attr_int,
    copy_model,
    get_attr,
    node_label,
    opset_version,
    prune_unused,
    splice,
    unique_name,
)
from quantscan.rewrites.base import Change, Refusal, RewriteResult

REWRITE_ID = "fuse-layernorm"
MIN_OPSET = 17


class _Match:
    def __init__(self, x: str, axes: list[int], eps: float, nodes: list[onnx.NodeProto]) -> None:
        self.x, self.axes, self.eps, self.nodes = x, axes, eps, nodes
        self.scale: np.ndarray | None = None
        self.bias: np.ndarray | None = None


def fuse_layernorm(model: onnx.ModelProto) -> RewriteResult:
    """Fuse every recognised arithmetic LayerNorm; new model plus changes and refusals."""
    out = copy_model(model)
    graph = out.graph
    index = GraphIndex(graph, out.ir_version)
    taken = index.names()
    opset = opset_version(out)
    ranks = _ranks(out)
    position = {n.output[0]: k for k, n in enumerate(graph.node) if n.output}
    result = RewriteResult(model=out)
    remove: set[int] = set()
    insert: dict[int, list[onnx.NodeProto]] = {}
    orphans: set[str] = set()
    for node in graph.node:
        found = _match(node, index, ranks)
        if found is None:
            continue
        if isinstance(found, tuple):
            result.refusals.append(Refusal(REWRITE_ID, found[0], found[1]))
            continue
        label = node_label(found.nodes[0])
        if opset < MIN_OPSET:
            reason = f"LayerNormalization needs opset >= {MIN_OPSET}, the model imports {opset}"
            result.refusals.append(Refusal(REWRITE_ID, label, reason))
            continue
        n_axes = len(found.axes)
        scale = found.scale
        if scale is None:
            result.refusals.append(
                Refusal(REWRITE_ID, label, "no constant scale (Mul) after the normalisation")
            )
            continue
        scale_v = _trailing(scale, n_axes)
        bias_v = _trailing(found.bias, n_axes) if found.bias is not None else None
        if scale_v is None or (found.bias is not None and bias_v is None):
            result.refusals.append(Refusal(REWRITE_ID, label, "scale/bias do not have the normalized shape"))
            continue
        base = found.nodes[0].name or f"layernorm:{found.nodes[-1].output[0]}"
        s_name = unique_name(f"{base}/scale", taken)
        add_initializer(out, s_name, scale_v.astype(np.float32))
        inputs = [found.x, s_name]
        if bias_v is not None:
            b_name = unique_name(f"{base}/bias", taken)
            add_initializer(out, b_name, bias_v.astype(np.float32))
            inputs.append(b_name)
        y = found.nodes[-1].output[0]
        fused = onnx.helper.make_node(
            "LayerNormalization", inputs, [y], name=base, axis=found.axes[0], epsilon=found.eps
        )
        positions = [position[n.output[0]] for n in found.nodes]
        remove.update(positions)
        insert[max(positions)] = [fused]
        orphans.update(i for n in found.nodes for i in n.input if i != found.x)
        detail = f"{len(found.nodes)} ops -> LayerNormalization(axis {found.axes[0]}, eps {found.eps:g})"
        result.changes.append(Change(REWRITE_ID, label, detail))
    if remove:
        splice(graph, remove, insert)
        prune_unused(graph, orphans)
    return result


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    try:
        g = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    except Exception:  # noqa: BLE001 - ranks stay unknown
        return {}
    return {
        vi.name: len(vi.type.tensor_type.shape.dim)
        for vi in list(g.input) + list(g.value_info) + list(g.output)
        if vi.type.tensor_type.HasField("shape")
    }


def _trailing(value: np.ndarray, n_axes: int) -> np.ndarray | None:
    """The value reshaped to its last `n_axes` dims when the leading ones are all 1, else None."""
    shape = value.shape
    if len(shape) > n_axes and any(d != 1 for d in shape[: len(shape) - n_axes]):
        return None
    if len(shape) < n_axes:
        return None
    return value.reshape(shape[len(shape) - n_axes :])


def _is(node: onnx.NodeProto | None, op: str) -> bool:
    return node is not None and node.op_type == op and node.domain in ("", "ai.onnx")


def _reduce_axes(node: onnx.NodeProto, index: GraphIndex) -> list[int] | None:
    if attr_int(node, "keepdims", 1) != 1:
        return None
    axes = get_attr(node, "axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        value = index.constant(node.input[1])
        axes = None if value is None else [int(a) for a in value.reshape(-1)]
    return None if axes is None else [int(a) for a in axes]  # type: ignore[attr-defined]


def _trailing_axes(axes: list[int], rank: int | None) -> list[int] | None:
    """Axes as negative numbers when they are the trailing range (-k..-1), else None."""
    if any(a >= 0 for a in axes):
        if rank is None:
            return None
        axes = [a - rank if a >= 0 else a for a in axes]
    axes = sorted(axes)
    return axes if axes == list(range(-len(axes), 0)) else None


def _scalar(index: GraphIndex, name: str) -> float | None:
    value = index.constant(name)
    return None if value is None or value.size != 1 else float(value.reshape(()))


def _other(node: onnx.NodeProto, name: str) -> str | None:
    if len(node.input) != 2 or name not in node.input:
        return None
    return node.input[1] if node.input[0] == name else node.input[0]


def _match(
    anchor: onnx.NodeProto, index: GraphIndex, ranks: dict[str, int]
) -> _Match | tuple[str, str] | None:
    """A full match, (node, refusal reason) for a near-match worth reporting, or None."""
    if not _is(anchor, "ReduceMean"):
        return None
    x = anchor.input[0]
    axes1 = _reduce_axes(anchor, index)
    subs = [
        n
        for n in index.consumers.get(anchor.output[0], [])
        if _is(n, "Sub") and list(n.input) == [x, anchor.output[0]]
    ]
    if axes1 is None or len(subs) != 1:
        return None
    sub = subs[0]
    d = sub.output[0]
    readers = index.consumers.get(d, [])
    sq = next(
        (n for n in readers if _is(n, "Pow") and n.input[0] == d and _scalar(index, n.input[1]) == 2.0), None
    )
    if sq is None:
        sq = next((n for n in readers if _is(n, "Mul") and list(n.input) == [d, d]), None)
    div = next((n for n in readers if _is(n, "Div") and n.input[0] == d), None)
    if sq is None or div is None:
        return None
    rm2 = next((n for n in index.consumers.get(sq.output[0], []) if _is(n, "ReduceMean")), None)
    if rm2 is None or _reduce_axes(rm2, index) != axes1:
        return None
    add = next((n for n in index.consumers.get(rm2.output[0], []) if _is(n, "Add")), None)
    eps = _scalar(index, _other(add, rm2.output[0]) or "") if add is not None else None
    if add is None or eps is None:
        return None
    sqrt = next((n for n in index.consumers.get(add.output[0], []) if _is(n, "Sqrt")), None)
    if sqrt is None or div.input[1] != sqrt.output[0]:
        return None
    label = node_label(anchor)
    axes = _trailing_axes(axes1, ranks.get(x))
    if axes is None:
        return label, f"normalises axes {axes1}, not a trailing range LayerNormalization can express"
    nodes = [anchor, sub, sq, rm2, add, sqrt, div]
    found = _Match(x, axes, eps, nodes)
    tail = div.output[0]
    mul = next((n for n in index.consumers.get(tail, []) if _is(n, "Mul")), None)
    if mul is not None and index.use_count(tail) == 1:
        scale_name = _other(mul, tail)
        scale = index.constant(scale_name) if scale_name else None
        if scale is not None:
            found.scale = scale
            nodes.append(mul)
            tail = mul.output[0]
            badd = next((n for n in index.consumers.get(tail, []) if _is(n, "Add")), None)
            if badd is not None and index.use_count(tail) == 1:
                bias_name = _other(badd, tail)
                bias = index.constant(bias_name) if bias_name else None
                if bias is not None:
                    found.bias = bias
                    nodes.append(badd)
    expected_uses = {anchor.output[0]: 1, d: 1 + list(sq.input).count(d)}  # Div + Pow(d,2) or Mul(d,d)
    for n in nodes[:-1]:
        o = n.output[0]
        if index.use_count(o) != expected_uses.get(o, 1):
            return label, f"intermediate {o!r} has another consumer or is an output"
    return found
