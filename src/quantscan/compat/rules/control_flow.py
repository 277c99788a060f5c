"""Rule `control-flow`: If/Loop/Scan nodes, whose subgraphs no NPU compiles.

The nodes inside the bodies are checked by the other rules under their path names (see
`compat.check`); this rule reports the control-flow node itself. An If whose condition is a constant
folds away to one branch and is only noted. An If whose condition is computed from small graph inputs
alone (silero-vad's `sr == 16000`) is one `rewrite --freeze-input NAME=VALUE` folds: the finding names
those inputs, and the value is the user's to give (no number is suggested).
"""

from __future__ import annotations

import onnx

from quantscan.compat.context import RuleContext
from quantscan.compat.fixes import Fix, unsupported_op_fix
from quantscan.graph.index import CONTROL_FLOW_OPS, GraphIndex
from quantscan.records import Finding, RewriteId, Severity

RULE_ID = "control-flow"
SMALL_INPUT = 16
"""Graph inputs with at most this many elements count as settings (a sample rate, a flag), not data."""


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


def condition_inputs(view: GraphIndex, i: int) -> list[str] | None:
    """The graph inputs an If's condition is computed from, when they are all small settings and the
    computation reads nothing else but constants; None otherwise (data-dependent or shape-dependent)."""
    node = view.nodes[i]
    if node.op_type != "If" or not node.input:
        return None
    found: list[str] = []
    todo = [node.input[0]]
    seen: set[str] = set()
    while todo:
        t = todo.pop()
        if t in seen or view.is_const(t):
            continue
        seen.add(t)
        if t in view.graph_inputs:
            numel = view.info(t).numel()
            if numel is None or numel > SMALL_INPUT:
                return None
            found.append(t)
            continue
        j = view.producer.get(t)
        if j is None or view.nodes[j].op_type in CONTROL_FLOW_OPS or view.nodes[j].op_type in ("Shape", "Size"):
            return None
        todo.extend(view.node_inputs(j))
    return sorted(found) or None


def _fix(ctx: RuleContext, i: int) -> Fix:
    names = condition_inputs(ctx.view, i)
    if names is None:
        return unsupported_op_fix(ctx.op(i), ctx.profile)
    settings = " ".join(f"--freeze-input {n}=VALUE" for n in names)
    return Fix(
        f"freeze-input: rewrite {settings} (the value you deploy with) folds the If to its taken branch",
        RewriteId.FREEZE_INPUT,
        tuple(names),
    )


def _finding(ctx: RuleContext, i: int, n_sub: int) -> Finding:
    p, op = ctx.profile, ctx.op(i)
    folds = i in ctx.analysis.foldable
    if folds:
        severity, verdict = Severity.INFO, "its inputs are constant, so constant folding resolves it"
    else:
        severity = ctx.severity(p.unsupported, p.ops) if op not in p.npu_ops else Severity.WARN
        verdict = "it runs on the CPU at best"
    fix = _fix(ctx, i)
    return Finding(
        node=ctx.name(i),
        op_type=op,
        rule=RULE_ID,
        severity=severity,
        reason=f"{op} with {n_sub} subgraph nodes (checked as '{ctx.name(i)}/<body>/<node>' rows): {verdict}",
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
