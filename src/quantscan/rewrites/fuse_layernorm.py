"""`fuse-layernorm`: recognise the arithmetic LayerNorm and emit one LayerNormalization node.

Why: chips with a native LayerNorm kernel run it in higher precision as one op; left decomposed, a
quantizer puts fake-quant points on the variance (Pow/ReduceMean), the most int8-hostile tensors in a
transformer. Recognised: `quantscan.patterns.layernorm` (Paddle and PyTorch exports) and
`quantscan.patterns.layernorm_moments` (jax2tf's E[x²] − E[x]², its scale folded into 1/√: the same
scale, multiplied at another place) with A the trailing axes (a contiguous range ending at the last axis).
LayerNormalization exists from opset 17: below that the pass refuses (the opset is never changed by a
rewrite). Refused too: an intermediate read elsewhere, non-trailing axes, a scale/bias whose shape is not
the normalized shape, no scale and unknown normalized shape.
"""

from __future__ import annotations

import numpy as np
import onnx

from quantscan.graph.edit import (
    Replacements,
    add_initializer,
    copy_model,
    node_label,
    unique_name,
)
from quantscan.graph.index import GraphIndex, opset_version
from quantscan.graph.infer import infer_shapes
from quantscan.patterns import layernorm, layernorm_moments
from quantscan.rewrites.base import Change, Refusal, RewriteResult

REWRITE_ID = "fuse-layernorm"
MIN_OPSET = 17


def fuse_layernorm(model: onnx.ModelProto) -> RewriteResult:
    """Fuse every recognised arithmetic LayerNorm; new model plus changes and refusals."""
    out = copy_model(model)
    graph = out.graph
    index = GraphIndex(graph, ir_version=out.ir_version)
    taken = index.taken_names()
    opset = opset_version(out)
    ranks = tensor_ranks(out)
    edits = Replacements(graph)
    result = RewriteResult(model=out)
    for node in index.nodes:
        found = layernorm_moments.either_at(index, node)
        if not isinstance(found, layernorm.LayerNormMatch):
            continue
        label = node_label(found.nodes[0])
        axes = _trailing_axes(list(found.axes), ranks.get(found.x))
        if axes is None:
            reason = f"normalises axes {list(found.axes)}, not a trailing range LayerNormalization can express"
            result.refusals.append(Refusal(REWRITE_ID, label, reason))
            continue
        shared = found.shared(index)
        if shared:
            reason = f"intermediate {shared[0]!r} has another consumer or is an output"
            result.refusals.append(Refusal(REWRITE_ID, label, reason))
            continue
        if opset < MIN_OPSET:
            reason = f"LayerNormalization needs opset >= {MIN_OPSET}, the model imports {opset}"
            result.refusals.append(Refusal(REWRITE_ID, label, reason))
            continue
        n_axes = len(axes)
        scale = index.constant(found.scale) if found.scale else None
        bias = index.constant(found.bias) if found.bias else None
        if scale is None:
            result.refusals.append(
                Refusal(REWRITE_ID, label, "no constant scale (Mul) after the normalisation")
            )
            continue
        scale_v = _trailing(scale, n_axes)
        bias_v = _trailing(bias, n_axes) if bias is not None else None
        if scale_v is None or (bias is not None and bias_v is None):
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
            "LayerNormalization", inputs, [y], name=base, axis=axes[0], epsilon=found.eps
        )
        edits.replace(found.nodes, [fused], keep=found.x)
        detail = f"{len(found.nodes)} ops -> LayerNormalization(axis {axes[0]}, eps {found.eps:g})"
        result.changes.append(Change(REWRITE_ID, label, detail))
    edits.apply()
    return result


def tensor_ranks(model: onnx.ModelProto) -> dict[str, int]:
    """Each tensor's rank where shape inference knows it (empty when inference fails)."""
    try:
        g = infer_shapes(model, strict_mode=False).graph
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


def _trailing_axes(axes: list[int], rank: int | None) -> list[int] | None:
    """Axes as negative numbers when they are the trailing range (-k..-1), else None."""
    if any(a >= 0 for a in axes):
        if rank is None:
            return None
        axes = [a - rank if a >= 0 else a for a in axes]
    axes = sorted(axes)
    return axes if axes == list(range(-len(axes), 0)) else None
