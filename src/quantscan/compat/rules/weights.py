"""Rule `weights`: a weight or constant that holds NaN or Inf values (an error on every chip).

A converter either rejects such a tensor or quantizes it into garbage (its range, and so its scale,
is not finite); the model was usually exported mid-training or from a diverged checkpoint. The check
runs on the stored values of initializers and Constant nodes that a node reads; one finding per
reading node, naming the tensor and how many of its values are not finite.

±inf alone is a value models use on purpose: the −inf identity of a max-reduction (jax2tf's
`Max(ReduceMax(x), -inf)`, magika) or an additive attention mask. Read as a weight (Conv, Gemm, MatMul)
it is still an error (no int8 scale holds it); read by anything else it is a warning, never a reason
to re-export (issue 26: the scan accepts the model, so the check must not reject it).
"""

from __future__ import annotations

import numpy as np

from quantscan.compat.context import RuleContext
from quantscan.records import Finding, Severity

RULE_ID = "weights"


WEIGHTED_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
"""Ops that read a constant as a weight, quantized per channel: an infinite value there has no scale."""


def run(ctx: RuleContext) -> list[Finding]:
    bad = _nonfinite_constants(ctx)
    out = []
    for i in ctx.analysis.live():
        for tensor in ctx.view.node_inputs(i):
            if tensor in bad:
                out.append(_finding(ctx, i, tensor, *bad[tensor]))
                break
    return out


def _nonfinite_constants(ctx: RuleContext) -> dict[str, tuple[int, int, int]]:
    """Constant tensor -> (non-finite count, NaN count, size), for float constants with any NaN/Inf."""
    found = {}
    for name in (*ctx.view.initializers, *ctx.view.constant_nodes):
        value = ctx.view.const_value(name)
        if value is None or value.size == 0 or not np.issubdtype(value.dtype, np.floating):
            continue
        finite = np.isfinite(value)
        if not finite.all():
            found[name] = (int(value.size - np.count_nonzero(finite)), int(np.count_nonzero(np.isnan(value))),
                           int(value.size))
    return found


def _finding(ctx: RuleContext, i: int, tensor: str, bad: int, nan: int, size: int) -> Finding:
    """An error for NaN, or ±inf read as a weight; a warning for ±inf anywhere else (identity, mask)."""
    fatal = nan > 0 or ctx.op(i) in WEIGHTED_OPS
    if fatal:
        reason = f"constant '{tensor}' holds {bad} NaN/Inf value(s) of {size}: its int8 scale is not finite"
        fix = "re-export from a checkpoint whose weights are finite (a diverged or mid-training export)"
    else:
        reason = (f"constant '{tensor}' holds {bad} ±inf value(s) of {size}, read by {ctx.op(i)}: valid in float "
                  "(a max-reduction's identity, an attention mask)")
        fix = ("none needed in float; a converter that cannot store ±inf needs a finite value there (an attention "
               "mask: rewrite --clamp-mask)")
    return Finding(
        node=ctx.name(i),
        op_type=ctx.op(i),
        rule=RULE_ID,
        severity=Severity.ERROR if fatal else Severity.WARN,
        reason=reason,
        attribute="weights",
        value=f"{bad} non-finite of {size}",
        limit="finite values",
        fix=fix,
    )
