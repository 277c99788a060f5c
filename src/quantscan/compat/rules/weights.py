"""Rule `weights`: a weight or constant that holds NaN or Inf values (an error on every chip).

A converter either rejects such a tensor or quantizes it into garbage (its range, and so its scale,
is not finite); the model was usually exported mid-training or from a diverged checkpoint. The check
runs on the stored values of initializers and Constant nodes that a node reads; one finding per
reading node, naming the tensor and how many of its values are not finite.
"""

from __future__ import annotations

import numpy as np

from quantscan.compat.context import RuleContext
from quantscan.records import Finding, Severity

RULE_ID = "weights"


def run(ctx: RuleContext) -> list[Finding]:
    bad = _nonfinite_constants(ctx)
    out = []
    for i in ctx.analysis.live():
        for tensor in ctx.view.node_inputs(i):
            if tensor in bad:
                out.append(_finding(ctx, i, tensor, *bad[tensor]))
                break
    return out


def _nonfinite_constants(ctx: RuleContext) -> dict[str, tuple[int, int]]:
    """Constant tensor -> (non-finite count, size), for float constants with any NaN/Inf."""
    found = {}
    for name in (*ctx.view.initializers, *ctx.view.constant_nodes):
        value = ctx.view.const_value(name)
        if value is None or value.size == 0 or not np.issubdtype(value.dtype, np.floating):
            continue
        finite = np.isfinite(value)
        if not finite.all():
            found[name] = (int(value.size - np.count_nonzero(finite)), int(value.size))
    return found


def _finding(ctx: RuleContext, i: int, tensor: str, bad: int, size: int) -> Finding:
    return Finding(
        node=ctx.name(i),
        op_type=ctx.op(i),
        rule=RULE_ID,
        severity=Severity.ERROR,
        reason=f"constant '{tensor}' holds {bad} NaN/Inf value(s) of {size}: its int8 scale is not finite",
        attribute="weights",
        value=f"{bad} non-finite of {size}",
        limit="finite values",
        fix="re-export from a checkpoint whose weights are finite (a diverged or mid-training export)",
    )
