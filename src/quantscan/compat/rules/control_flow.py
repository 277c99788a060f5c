"""Rule `control-flow`: If/Loop/Scan nodes, whose subgraphs no NPU compiles.

The nodes inside the subgraphs are not checked (said in the reason). An If whose condition is a
constant folds away to one branch and is only noted.
"""

from __future__ import annotations

import onnx

from quantscan.compat.context import RuleContext
from quantscan.compat.fixes import unsupported_op_fix
from quantscan.graph.index import CONTROL_FLOW_OPS
from quantscan.records import Finding, Severity

RULE_ID = "control-flow"


def run(ctx: RuleContext) -> list[Finding]:
    view = ctx.view
    out = []
    for i, node in enumerate(view.nodes):
        if node.op_type in CONTROL_FLOW_OPS:
            out.append(_finding(ctx, i, _count(node)))
    return out


def _count(node: onnx.NodeProto) -> int:
    n = 0
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            n += len(g.node) + sum(_count(sub) for sub in g.node)
    return n


def _finding(ctx: RuleContext, i: int, n_sub: int) -> Finding:
    p, op = ctx.profile, ctx.op(i)
    folds = i in ctx.analysis.foldable
    if folds:
        severity, verdict = Severity.INFO, "its inputs are constant, so constant folding resolves it"
    else:
        severity = ctx.severity(p.unsupported, p.ops) if op not in p.npu_ops else Severity.WARN
        verdict = "it runs on the CPU at best"
    fix = unsupported_op_fix(op, p)
    return Finding(
        node=ctx.name(i),
        op_type=op,
        rule=RULE_ID,
        severity=severity,
        reason=f"{op} with {n_sub} subgraph nodes (not checked): {verdict}",
        attribute="subgraph_nodes",
        value=str(n_sub),
        limit="no control flow",
        fix=fix.text,
        rewrite=fix.rewrite,
        rewrite_args=fix.args,
        source=p.ops.source,
        unverified=p.ops.unverified,
        forces_cpu=not folds,
    )
