"""`div-to-mul`: Div(x, c) with a constant float divisor c -> Mul(x, 1/c).

Why: chips such as horizon-x3 run Mul on the NPU but Div on the CPU, and Paddle spells HardSwish as
x·Clip(x+3, 0, 6)/6, so every activation of a detector became a CPU island with tensors crossing the
boundary twice. `fuse-hardswish` would remove the Div but needs opset 14, which X3 does not accept; a
Div by a constant is a Mul by its reciprocal at any opset.

Exactness: when every divisor element is a power of two (and its reciprocal a normal float), 1/c is
exact, so x·(1/c) and x/c are the same correctly rounded real number: bit-identical. Otherwise 1/c is
rounded once, and the result is within one float rounding of the Div; the runner's proof holds it to
the exact criterion either way. Integer Div truncates (not a Mul), a zero divisor has no reciprocal, a
subnormal divisor's reciprocal overflows: those are refused with the reason.
"""

from __future__ import annotations

import numpy as np
import onnx

from quantscan.graph.edit import add_initializer, copy_model, elem_types, node_label, unique_name
from quantscan.graph.index import GraphIndex
from quantscan.rewrites.base import FLOAT_TYPES, Change, Refusal, RewriteResult

REWRITE_ID = "div-to-mul"


def div_to_mul(model: onnx.ModelProto) -> RewriteResult:
    """Replace every Div by a constant float divisor with a Mul by the reciprocal; return the record."""
    out = copy_model(model)
    graph = out.graph
    index = GraphIndex.of(out)
    taken = index.taken_names()
    types = elem_types(out)
    result = RewriteResult(model=out)
    for pos, node in enumerate(graph.node):
        if node.op_type != "Div" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        label = node_label(node)
        divisor = node.input[1]
        value = index.constant(divisor)
        reason = _refusal(value, types.get(node.input[0]), divisor)
        if reason is not None:
            result.refusals.append(Refusal(REWRITE_ID, label, reason))
            continue
        assert value is not None  # _refusal returned None only for a float constant
        recip, exact = reciprocal(value)
        name = unique_name(f"{node.name or f'div_{pos}'}/reciprocal", taken)
        add_initializer(out, name, recip)
        node.op_type = "Mul"
        node.input[1] = name
        how = "exact (power-of-two divisor)" if exact else "reciprocal rounded once (within float rounding)"
        detail = f"Div by constant {_show(value)} -> Mul by {_show(recip)}: {how}"
        result.changes.append(Change(REWRITE_ID, label, detail))
    return result


def reciprocal(value: np.ndarray) -> tuple[np.ndarray, bool]:
    """1/value rounded once to value's dtype, and whether every element's reciprocal is exact.

    Computed in float64 and cast: one rounding, so the Mul is as close to the Div as a float allows.
    Exact means the reciprocal multiplied back gives 1 exactly and is a power of two (mantissa zero).
    """
    dtype = value.dtype
    recip = (1.0 / value.astype(np.float64)).astype(dtype)
    mantissa, _ = np.frexp(value.astype(np.float64))
    tiny = np.finfo(dtype).tiny
    exact = bool(np.all(np.abs(mantissa) == 0.5) and np.all(np.abs(recip) >= tiny))
    return recip, exact


def _refusal(value: np.ndarray | None, etype: int | None, divisor: str) -> str | None:
    """Why a Div is left alone, or None when its divisor is a float constant with finite reciprocals."""
    if value is None:
        return f"divisor {divisor!r} is computed (or a graph input), not a constant"
    if not np.issubdtype(value.dtype, np.floating) or (etype is not None and etype not in FLOAT_TYPES):
        return f"integer Div truncates; a Mul by the reciprocal is not the same (divisor dtype {value.dtype})"
    if np.any(value == 0):
        return "divisor contains 0: it has no reciprocal"
    with np.errstate(over="ignore", divide="ignore"):
        recip = (1.0 / value.astype(np.float64)).astype(value.dtype)
    if not np.all(np.isfinite(recip)) or not np.all(np.isfinite(value)):
        return "divisor's reciprocal is not a finite float (subnormal or non-finite divisor)"
    return None


def _show(value: np.ndarray) -> str:
    """A short rendering of a constant for the change record."""
    if value.size == 1:
        return f"{float(value.reshape(())):.9g}"
    return f"tensor{list(value.shape)}"
