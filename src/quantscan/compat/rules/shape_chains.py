"""Rule `shape-chain`: Shape/Size subgraphs (Shape->Gather/Slice->Concat->Reshape...) in the graph.

Such a chain computes a shape at run time. Once every input dim is fixed, a chain whose Shape nodes
read static tensors is removed by constant folding (info, fix: fix-dim); a chain that reads a tensor
still dynamic after fixing (data-dependent sizes) survives and runs on the CPU, and its consumers get
a run-time shape (error where the profile compiles static shapes only).
"""

from __future__ import annotations

from quantscan.compat.analysis import ShapeChain
from quantscan.compat.context import RuleContext
from quantscan.compat.fixes import Fix
from quantscan.records import Finding, RewriteId, Severity

RULE_ID = "shape-chain"


def run(ctx: RuleContext) -> list[Finding]:
    return [_finding(ctx, c) for c in ctx.analysis.chains if c.roots]


def describe_chain(ctx: RuleContext, chain: ShapeChain) -> str:
    """`Shape→Slice→Concat→Reshape`: member op types in order, then the consumers fed."""
    ops: list[str] = []
    for i in [*chain.members, *chain.sinks]:
        op = ctx.op(i)
        if not ops or ops[-1] != op:
            ops.append(op)
    return "→".join(ops)


def _was_static(ctx: RuleContext, chain: ShapeChain) -> bool:
    view = ctx.analysis.original
    return all(view.info(view.node_inputs(r)[0]).is_static for r in chain.roots if view.node_inputs(r))


def _finding(ctx: RuleContext, chain: ShapeChain) -> Finding:
    p, root = ctx.profile, chain.roots[0]
    sinks = ", ".join(ctx.name(s) for s in chain.sinks[:3]) or "graph outputs"
    if _was_static(ctx, chain):
        severity, fix = Severity.INFO, Fix("none needed: constant folding (converter or onnxsim) removes it")
        verdict = "its inputs are static, constant folding removes it"
    elif chain.folds_after_fix:
        severity, fix = Severity.INFO, Fix(
            "fix-dim the symbolic input dims; constant folding then removes it", RewriteId.FIX_DIM
        )
        verdict = "constant folding removes it once the input dims are fixed"
    else:
        severity = ctx.severity("reject" if p.static_shapes else "cpu", p.tensor)
        fix = Fix("make the size static at export (fixed reshape targets) or move this logic out of the model")
        verdict = "it still computes shapes at run time after the input dims are fixed (survives folding)"
    return Finding(
        node=ctx.name(root),
        op_type=ctx.op(root),
        rule=RULE_ID,
        severity=severity,
        reason=f"shape computation of {len(chain.members)} nodes feeding {sinks}: {verdict}",
        attribute="shape_chain",
        value=describe_chain(ctx, chain),
        limit="static shapes",
        fix=fix.text,
        rewrite=fix.rewrite,
        rewrite_args=fix.args,
        source=p.tensor.source,
        unverified=p.tensor.unverified,
        forces_cpu=not chain.folds_after_fix,
    )
