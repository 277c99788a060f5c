"""Rule `control-flow`: If/Loop/Scan nodes, whose subgraphs no NPU compiles.

The nodes inside the bodies are checked by the other rules under their path names (see
`compat.check`); this rule reports the control-flow node itself. An If whose condition is a constant
folds away to one branch and is only noted. Any other If has its condition traced back to the graph
inputs (`graph.conditions`): a condition on small setting inputs (silero-vad's `sr == 16000`) and on
symbolic input dims (its "squeeze if dim == 1" tests on the batch and length) is folded by
`rewrite --freeze-input NAME=VALUE --fix-dim ...`, and the finding names exactly those flags. The
value a setting is compared with is named as the one that takes the then branch; the deployed value
is still the user's to give.
"""

from __future__ import annotations

import onnx

from quantscan.compat.analysis import ModelAnalysis
from quantscan.compat.context import RuleContext
from quantscan.compat.fixes import Fix, unsupported_op_fix
from quantscan.graph.conditions import Condition
from quantscan.graph.index import CONTROL_FLOW_OPS
from quantscan.records import Finding, RewriteId, Severity

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


def _fix(ctx: RuleContext, i: int) -> Fix:
    """The flags that fold this If, from its condition traced back to the inputs (`graph.conditions`).
    A condition on data values keeps the plain advice: no flag folds it."""
    cond = ctx.analysis.condition(ctx.name(i)) if ctx.op(i) == "If" else None
    if cond is None or not cond.foldable_by_flags:
        plain = unsupported_op_fix(ctx.op(i), ctx.profile)
        if cond is not None and cond.data:
            return Fix(f"{plain.text} (its condition reads the values of {', '.join(cond.data)}: no flag folds it)")
        return plain
    flags = condition_flags(ctx.analysis, cond)
    read = [f"the value of {s}" for s in cond.settings] + [f"{n} axis {a}" for n, a in cond.dims]
    text = f"rewrite {' '.join(flags)} folds it (its condition reads {', '.join(read)})"
    if any(f.endswith(("=VALUE", "=V")) for f in flags):
        text += "; VALUE/V: what you deploy with"
    elif cond.compared:
        tested = ", ".join(f"{s}={_setting_value(cond, s)}" for s in cond.compared)
        text += f"; {tested} takes the then branch: give the value you deploy with"
    if cond.settings:
        return Fix(text, RewriteId.FREEZE_INPUT, cond.settings)
    concrete = tuple(f.split(" ", 1)[1] for f in flags if not f.endswith("=V"))
    return Fix(text, RewriteId.FIX_DIM if concrete else None, concrete)


def condition_flags(analysis: ModelAnalysis, cond: Condition) -> list[str]:
    """`--freeze-input NAME=C` per setting input (C the constant the condition compares it with, the
    value that takes the then branch; VALUE when none), `--fix-dim` per input dim it tests (batch=N on
    axis 0, INPUT:AXIS=N elsewhere; N from --input-shape, else 1 for the batch and V otherwise)."""
    freeze = [f"--freeze-input {s}={_setting_value(cond, s)}" for s in cond.settings]
    dims = [f"--fix-dim {_dim_spec(analysis, cond, name, axis)}" for name, axis in cond.dims]
    return freeze + list(dict.fromkeys(dims))


def fold_flags(analysis: ModelAnalysis) -> list[str]:
    """The flags that fold every If of the model a flag can fold (the union, in a stable order)."""
    flags: list[str] = []
    for cond in analysis.conditions.values():
        if cond.foldable_by_flags:
            flags += [f for f in condition_flags(analysis, cond) if f not in flags]
    return sorted(flags, key=lambda f: (not f.startswith("--freeze-input"), "batch=" not in f, f))


def _setting_value(cond: Condition, name: str) -> str:
    """The constant the condition compares `name` with (e.g. 16000), VALUE when none or several."""
    values = cond.compared.get(name, ())
    return f"{values[0]:g}" if len(values) == 1 else "VALUE"


def _dim_spec(analysis: ModelAnalysis, cond: Condition, name: str, axis: int) -> str:
    """The fix-dim setting for one input dim, in the contract's syntax: `batch=N` for axis 0 and for a
    dim sharing the batch's dim_param (fix-dim sets every dim of that name); `PARAM=N` for another named
    dim, `INPUT:AXIS=N` for an unnamed one. N comes from --input-shape, else 1 for the batch, else V."""
    param = cond.params.get((name, axis))
    given = analysis.given_dims.get((name, axis))
    if (name, axis) in cond.batch_like:
        return f"batch={given or 1}"
    return f"{param or f'{name}:{axis}'}={given or 'V'}"


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
