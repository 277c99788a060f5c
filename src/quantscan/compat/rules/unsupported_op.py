"""Rule `unsupported-op`: op types the profile does not run on the NPU, and custom-domain ops.

An op listed under `ops.cpu` runs but on the CPU (warn); an op in no list is rejected by the
converter (error) or left on the CPU (warn), as the profile's `ops.unsupported` says. Control-flow
ops are left to the control-flow rule so one node gets one explanation.
"""

from __future__ import annotations

from quantscan.compat.context import RuleContext
from quantscan.compat.fixes import unsupported_op_fix
from quantscan.graph.index import CONTROL_FLOW_OPS, IDENTITY_OPS
from quantscan.records import Finding, Severity

RULE_ID = "unsupported-op"


def run(ctx: RuleContext) -> list[Finding]:
    out = []
    for i in ctx.analysis.live():
        finding = _check(ctx, i)
        if finding is not None:
            out.append(finding)
    return out


def _check(ctx: RuleContext, i: int) -> Finding | None:
    node, p = ctx.view.nodes[i], ctx.profile
    op = node.op_type
    if op in CONTROL_FLOW_OPS or op in IDENTITY_OPS or op in p.npu_ops:
        return None
    base = dict(node=ctx.name(i), op_type=op, rule=RULE_ID, source=p.ops.source, unverified=p.ops.unverified)
    if node.domain not in ("", "ai.onnx"):
        return Finding(
            **base,  # type: ignore[arg-type]
            severity=ctx.severity(p.unsupported, p.ops),
            reason=f"custom-domain op {node.domain}::{op}: no NPU converter knows it",
            attribute="domain",
            value=node.domain,
            limit="ai.onnx",
            fix="implement it as a custom CPU op in the vendor runtime, or re-export with standard ops",
            forces_cpu=True,
        )
    fix = unsupported_op_fix(op, p)
    if op in p.cpu_ops or op in p.folded_ops:
        why = "listed as a CPU op" if op in p.cpu_ops else "only removed when constant folding applies"
        return Finding(
            **base,  # type: ignore[arg-type]
            severity=Severity.WARN,
            reason=f"{op} runs on the CPU on {p.name} ({why}); data crosses the NPU/CPU boundary",
            attribute="op_type",
            value=op,
            limit="NPU op list",
            fix=fix.text,
            rewrite=fix.rewrite,
            rewrite_args=fix.args,
            forces_cpu=True,
        )
    return Finding(
        **base,  # type: ignore[arg-type]
        severity=ctx.severity(p.unsupported, p.ops),
        reason=f"{op} is not in {p.name}'s supported op list",
        attribute="op_type",
        value=op,
        limit="NPU op list",
        fix=fix.text,
        rewrite=fix.rewrite,
        rewrite_args=fix.args,
        forces_cpu=True,
    )
