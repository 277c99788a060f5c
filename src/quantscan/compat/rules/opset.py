"""Rule `opset`: the model's default-domain opset outside the range the converter accepts.

A model-level finding (node and op_type empty): converters check the opset before anything else. Above
the range, the fix is the `opset-down` rewrite, naming the ops that must be rewritten first; below it,
`--opset` (onnx.version_converter). Either way `rewrite_args` holds the target for the planner.

A control-flow node blocks opset-down (its bodies are not down-converted). An If a flag folds is a
rewrite away (its control-flow finding names the flags); a Loop or Scan, or an If whose condition reads
data, is not: the fix then says so and names the export, not a rewrite that would be skipped.
"""

from __future__ import annotations

from quantscan.compat.context import RuleContext
from quantscan.graph.edit import node_label
from quantscan.graph.index import CONTROL_FLOW_OPS
from quantscan.records import Finding, RewriteId
from quantscan.rewrites.opset_down import blocking_nodes

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
        fix, rewrite = _down_fix(ctx, int(target)), RewriteId.OPSET_DOWN  # type: ignore[arg-type]
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


def _down_fix(ctx: RuleContext, target: int) -> str:
    """The opset-down advice: plain, after the rewrites that remove its blockers, or the re-export when
    a control-flow node no flag folds blocks it (the `rewrite` run would skip opset-down and say why)."""
    blockers = blocking_nodes(ctx.view.model, target)  # type: ignore[arg-type]
    index = {node_label(n): i for i, n in enumerate(ctx.view.nodes)}
    stuck = sorted({op for label, op in blockers if op in CONTROL_FLOW_OPS and not _folds(ctx, index.get(label))})
    if stuck:
        return (f"re-export the model at opset {target}: opset-down cannot lower {', '.join(stuck)} (its bodies "
                f"are not down-converted, and no flag folds it; see its control-flow finding)")
    ops = sorted({op for _, op in blockers})
    blocked = f" after rewriting {', '.join(ops)} (they block opset {target})" if ops else ""
    return f"opset-down {target} (rewrite --opset {target}){blocked}"


def _folds(ctx: RuleContext, i: int | None) -> bool:
    """An If whose condition the control-flow rule folds with flags (--freeze-input, --fix-dim)."""
    cond = ctx.analysis.condition(ctx.name(i)) if i is not None else None
    return cond is not None and cond.foldable_by_flags
