"""`fix-ceil-mode`: MaxPool/AveragePool with ceil_mode=1 -> ceil_mode=0 with the extra end padding explicit.

Why: RKNN (rk3568/rk3588) pools only with ceil_mode 0, and PyTorch MTCNN exports every pool with
ceil_mode=1. ceil_mode=1 adds a last, partial window per spatial axis; padding the end of that axis by
just enough cells gives the same output size with ceil_mode=0, and the extra cells never change a
value: MaxPool ignores padding, AveragePool with count_include_pad=0 divides by the real cells only.
The padding goes into the node's own `pads` (not a separate Pad node): an explicit Pad would be
counted by AveragePool, and a Pad of -inf before MaxPool is one more op for the chip to place.

Needs the static spatial size of the pool's input (from shape inference); a free dim is refused with
the dim's name rather than guessed (fix it with `fix-dim` first). AveragePool with count_include_pad=1
is refused where the extra window exists: its divisor would count the new cells.
"""

from __future__ import annotations

import math

import onnx

from quantscan.graph.edit import attr_int, copy_model, get_attr, node_label, set_attr
from quantscan.graph.index import GraphIndex
from quantscan.graph.infer import infer_shapes
from quantscan.rewrites.base import Change, Refusal, RewriteResult

REWRITE_ID = "fix-ceil-mode"
_POOLS = ("MaxPool", "AveragePool")


def fix_ceil_mode(model: onnx.ModelProto) -> RewriteResult:
    """Turn every ceil_mode=1 pool into ceil_mode=0 with the same output; return the record."""
    out = copy_model(model)
    shapes = _shapes(out)
    result = RewriteResult(model=out)
    for node in out.graph.node:
        if node.op_type not in _POOLS or node.domain not in ("", "ai.onnx") or not attr_int(node, "ceil_mode", 0):
            continue
        label = node_label(node)
        extra_or_reason = _extra_pads(node, shapes.get(node.input[0]))
        if isinstance(extra_or_reason, str):
            result.refusals.append(Refusal(REWRITE_ID, label, extra_or_reason))
            continue
        pads, extra = extra_or_reason
        set_attr(node, "ceil_mode", 0)
        if any(extra):
            set_attr(node, "pads", pads)
        detail = f"ceil_mode=1 -> 0 with end pads +{extra}" if any(extra) else "ceil_mode=1 -> 0 (same size)"
        result.changes.append(Change(REWRITE_ID, label, detail))
    return result


def pool_out_size(size: int, kernel: int, stride: int, dilation: int, head: int, tail: int, ceil: bool) -> int:
    """Output length of one pooled axis as the ONNX spec computes it (the last ceil window must start
    inside the input or its head padding, else it is dropped)."""
    span = size + head + tail - ((kernel - 1) * dilation + 1)
    if not ceil:
        return span // stride + 1
    out = math.ceil(span / stride) + 1
    if (out - 1) * stride >= size + head:
        out -= 1
    return out


def _extra_pads(node: onnx.NodeProto, shape: tuple[int | str | None, ...] | None) -> tuple[list[int], list[int]] | str:
    """(new pads, extra end pad per axis), or why the pool is left alone."""
    auto_pad = get_attr(node, "auto_pad", b"NOTSET")
    if auto_pad not in (b"NOTSET", "NOTSET"):
        return f"auto_pad={auto_pad!r}: the padding is implicit; only explicit pads are rewritten"
    kernel = [int(k) for k in get_attr(node, "kernel_shape", [])]  # type: ignore[attr-defined]
    n = len(kernel)
    if shape is None or len(shape) != n + 2:
        return "input shape unknown: the spatial size decides the padding (fix it with fix-dim first)"
    spatial = shape[2:]
    free = [str(d) for d in spatial if not isinstance(d, int)]
    if free:
        return f"input spatial dim(s) {', '.join(free)} not fixed: the padding depends on them (fix-dim first)"
    strides = [int(s) for s in get_attr(node, "strides", [1] * n)]  # type: ignore[attr-defined]
    dilations = [int(d) for d in get_attr(node, "dilations", [1] * n)]  # type: ignore[attr-defined]
    pads = [int(p) for p in get_attr(node, "pads", [0] * (2 * n))]  # type: ignore[attr-defined]
    extra: list[int] = []
    for ax in range(n):
        size = int(spatial[ax])  # type: ignore[arg-type]
        args = (size, kernel[ax], strides[ax], dilations[ax], pads[ax], pads[ax + n])
        want = pool_out_size(*args, ceil=True)
        need = (want - 1) * strides[ax] + (kernel[ax] - 1) * dilations[ax] + 1 - (size + pads[ax] + pads[ax + n])
        extra.append(max(need, 0))
    if any(extra) and node.op_type == "AveragePool" and attr_int(node, "count_include_pad", 0):
        return "count_include_pad=1: the average of the last window would count the added cells"
    new = pads[:n] + [pads[n + ax] + extra[ax] for ax in range(n)]
    return new, extra


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int | str | None, ...] | None]:
    """Every tensor's shape shape inference knows (declared shapes when inference fails)."""
    try:
        inferred = infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - a model inference cannot type keeps its declared shapes
        inferred = model
    index = GraphIndex.of(inferred)
    return {name: info.shape for name, info in index.tensors.items()}
