"""Rule `opset`: the model's default-domain opset outside the range the converter accepts.

A model-level finding (node and op_type empty): converters check the opset before anything else. Above
the range, the fix is the `opset-down` rewrite, naming the ops that must be rewritten first; below it,
`--opset` (onnx.version_converter). Either way `rewrite_args` holds the target for the planner.
"""

from __future__ import annotations

from quantscan.compat.context import RuleContext
from quantscan.records import Finding, RewriteId
from quantscan.rewrites.opset_down import blocking_ops

RULE_ID = "opset"


def run(ctx: RuleContext) -> list[Finding]:
    p, version = ctx.profile, ctx.view.opset()
    lo, hi = p.opset_min, p.opset_max
    if version == 0 or ((lo is None or version >= lo) and (hi is None or version <= hi)):
        return []
    down = hi is not None and version > hi
    target = hi if down else lo
    fix, rewrite = f"rewrite --opset {target} (onnx.version_converter raises it) and re-check", None
    if down and ctx.view.model is not None:
        blockers = blocking_ops(ctx.view.model, int(target))  # type: ignore[arg-type]
        blocked = f" after rewriting {', '.join(blockers)} (they block opset {target})" if blockers else ""
        fix, rewrite = f"opset-down {target} (rewrite --opset {target}){blocked}", RewriteId.OPSET_DOWN
    return [
        Finding(
            node="",
            op_type="",
            rule=RULE_ID,
            severity=ctx.severity("reject", p.opset),
            reason=f"model opset {version} is outside the {lo}..{hi} range {p.name}'s converter accepts",
            attribute="opset",
            value=str(version),
            limit=f"[{lo}, {hi}]",
            fix=fix,
            rewrite=rewrite,
            rewrite_args=(str(target),),
            source=p.opset.source,
            unverified=p.opset.unverified,
        )
    ]
