"""Rule `param-limit`: a node parameter (kernel, stride, channels, axis, ...) past a profile limit.

Each `[[limit]]` names op types, one parameter (see profile_schema.ATTRIBUTES), a range or an allowed
list, and which Conv nodes it covers (`when`). List parameters (kernel, stride, pads) fail when any
element fails; the finding shows the whole list so `2x1` strides read as such.

A pool whose one window covers its whole input (`patterns.global_pool`: kernel = stride = H×W, as
TFLite writes MobileNetV3's squeeze-excite pools) is judged as the global pool it computes, by the
limits of its global op, when the profile runs that op: its stride is never applied, so a stride limit
says nothing about it. Within those limits it gets one `info` finding naming `rewrite --global-pool`
(the spelling no converter can misread) and stays on the NPU; past them, the global op's findings.
"""

from __future__ import annotations

from typing import Any

from quantscan.compat.context import RuleContext
from quantscan.compat.fixes import batch_fix, limit_fix
from quantscan.compat.params import Params
from quantscan.compat.profiles import Limit
from quantscan.compat.rules.rank_size import batch_origins
from quantscan.patterns import global_pool
from quantscan.records import Finding, RewriteId, Severity

RULE_ID = "param-limit"


def run(ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    for i in ctx.analysis.live():
        out.extend(violations(ctx, i))
    return out


def violations(ctx: RuleContext, i: int) -> list[Finding]:
    """Node i's findings: one per profile limit its parameters break (none off the NPU path). The
    float16 rule asks too, so that a node the limits send to the CPU gets one finding, not two fixes."""
    op = ctx.op(i)
    if op not in ctx.profile.npu_ops:
        return []
    params = ctx.analysis.params[i]
    whole = global_pool.match_at(ctx.view, ctx.view.nodes[i])
    if isinstance(whole, global_pool.GlobalPoolMatch) and whole.global_op in ctx.profile.npu_ops:
        found = _limit_findings(ctx, i, whole.global_op, params)
        return found or [_global_pool_note(ctx, i, whole)]
    return _limit_findings(ctx, i, op, params)


def _limit_findings(ctx: RuleContext, i: int, op: str, params: Params) -> list[Finding]:
    """Node i's parameters against every limit of op type `op` (its own, or the global op it computes)."""
    out: list[Finding] = []
    for limit in ctx.profile.limits:
        if (op in limit.ops or "*" in limit.ops) and _applies(limit.when, params):
            finding = _check(ctx, i, limit, params)
            if finding is not None:
                out.append(finding)
    return out


def _global_pool_note(ctx: RuleContext, i: int, found: global_pool.GlobalPoolMatch) -> Finding:
    """The info finding of a whole-input pool within its global op's limits: NPU, with the rewrite."""
    op, window = ctx.op(i), _show(list(found.window))
    return Finding(
        node=ctx.name(i),
        op_type=op,
        rule=RULE_ID,
        severity=Severity.INFO,
        reason=(f"{op} kernel={window} covers its whole {window} input: one window, so a global pool "
                f"({found.global_op}, within {ctx.profile.name}'s limits); its stride is never applied"),
        attribute="kernel",
        value=window,
        limit="the whole input",
        fix=f"rewrite --global-pool writes it as {found.global_op}, the spelling every converter reads as one",
        rewrite=RewriteId.GLOBAL_POOL,
        forces_cpu=False,
    )


def _applies(when: str, p: Params) -> bool:
    depthwise = bool(p.get("depthwise", False))
    if when == "depthwise":
        return depthwise
    if when == "not_depthwise":
        return not depthwise
    if when == "grouped":
        return int(p.get("group", 1)) > 1 and not depthwise
    if when == "plain":
        return int(p.get("group", 1)) == 1 and all(d == 1 for d in p.get("dilation", [1]))
    return True


def violates(limit: Limit, value: Any) -> bool:
    """True when the parameter value (scalar or list) falls outside the limit."""
    values = value if isinstance(value, list) else [value]
    for v in values:
        if limit.allowed is not None:
            if v not in limit.allowed:
                return True
            continue
        if isinstance(v, bool | str):
            continue
        if (limit.min is not None and v < limit.min) or (limit.max is not None and v > limit.max):
            return True
    return False


def _check(ctx: RuleContext, i: int, limit: Limit, params: Params) -> Finding | None:
    if limit.attribute not in params:
        return None
    value = params[limit.attribute]
    if not violates(limit, value):
        return None
    op = ctx.op(i)
    where = "" if limit.when == "any" else f" ({limit.when.replace('_', '-')})"
    fallback = "rejected by the converter" if limit.on_violation == "reject" else "falls back to the CPU"
    note = f"; {limit.note}" if limit.note else ""
    if op in ctx.profile.float16_ops:  # the float16 rule's fact, said once here rather than as a 2nd finding
        note += f"; within the limit, {ctx.profile.name} runs {op} in float16 (not an int8 site)"
    fix = batch_fix(value, *batch_origins(ctx)) if limit.attribute == "batch" else limit_fix(limit.attribute, op, value)
    return Finding(
        node=ctx.name(i),
        op_type=op,
        rule=RULE_ID,
        severity=ctx.severity(limit.on_violation, limit.origin),
        reason=f"{op}{where} {limit.attribute}={_show(value)} outside {limit.describe()}: {fallback}{note}",
        attribute=limit.attribute,
        value=_show(value),
        limit=limit.describe(),
        fix=fix.text,
        rewrite=fix.rewrite,
        rewrite_args=fix.args,
        source=limit.origin.source,
        unverified=limit.origin.unverified,
        forces_cpu=True,
    )


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)
