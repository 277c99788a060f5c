"""Rule `rank-size`: tensors on the NPU path past the profile's rank, dim, batch or element limits.

One finding per node (the first limit broken), so a 5-D attention block does not bury the table.
Shapes are read from the view with input dims fixed; unknown dims are skipped.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from quantscan.compat.context import RuleContext
from quantscan.compat.fixes import Fix, rewrite_fix
from quantscan.records import Finding, RewriteId

RULE_ID = "rank-size"


def run(ctx: RuleContext) -> list[Finding]:
    out = []
    for i in ctx.analysis.live():
        if ctx.on_npu_path(i):
            finding = next(_violations(ctx, i), None)
            if finding is not None:
                out.append(finding)
    return out


def _violations(ctx: RuleContext, i: int) -> Iterator[Finding]:
    p = ctx.profile
    tensors = [t for t in ctx.view.node_inputs(i) if not ctx.view.is_const(t)] + ctx.view.node_outputs(i)
    for t in tensors:
        shape = ctx.view.info(t).shape
        if shape is None:
            continue
        dims = [d for d in shape if isinstance(d, int)]
        if p.max_rank is not None and len(shape) > p.max_rank:
            yield _finding(ctx, i, t, "rank", len(shape), f"<= {p.max_rank}", "Reshape to fewer dims")
        if p.max_dim is not None and dims and max(dims) > p.max_dim:
            yield _finding(ctx, i, t, "dim", max(dims), f"<= {p.max_dim}", "split the tensor along that axis")
        if (
            p.max_batch is not None
            and len(shape) >= 2
            and isinstance(shape[0], int)
            and shape[0] > p.max_batch
        ):
            yield _finding(ctx, i, t, "batch", shape[0], f"<= {p.max_batch}", rewrite_fix(RewriteId.FIX_DIM, "batch=1"))
        n = int(np.prod(dims, dtype=np.int64)) if len(dims) == len(shape) else None
        if p.max_elements is not None and n is not None and n > p.max_elements:
            yield _finding(ctx, i, t, "elements", n, f"<= {p.max_elements}", "tile the input (smaller crops)")


def _finding(
    ctx: RuleContext, i: int, tensor: str, attribute: str, value: int, limit: str, fix: str | Fix
) -> Finding:
    p = ctx.profile
    fix = fix if isinstance(fix, Fix) else Fix(fix)
    return Finding(
        node=ctx.name(i),
        op_type=ctx.op(i),
        rule=RULE_ID,
        severity=ctx.severity(p.on_violation, p.tensor),
        reason=f"tensor '{tensor}' {attribute} {value} outside {limit} on {p.name}",
        attribute=attribute,
        value=str(value),
        limit=limit,
        fix=fix.text,
        rewrite=fix.rewrite,
        rewrite_args=fix.args,
        source=p.tensor.source,
        unverified=p.tensor.unverified,
        forces_cpu=True,
    )
