"""Rule `precision`: ops that lose precision on an int8 NPU (info; they convert, but badly).

Listed per the contract's `sensitive_op` definition: LayerNormalization, Softmax, LogSoftmax,
Gelu/Erf, Exp, Log, Pow, Sqrt, Reciprocal, Div by a computed value, normalisations, recurrent cells,
Sigmoid/Tanh at a graph output; and LayerNorm decomposed into arithmetic (`patterns.layernorm`: the one
place a decomposed LayerNorm is recognised), reported once on its first ReduceMean. Power-of-two
scales (TIDL) make all of these coarser.
"""

from __future__ import annotations

from quantscan.columns import Col
from quantscan.compat.context import RuleContext
from quantscan.compat.fixes import Fix, rewrite_fix
from quantscan.patterns import layernorm, layernorm_moments
from quantscan.records import Finding, RewriteId, Severity

RULE_ID = "precision"
SENSITIVE: dict[str, str] = {
    "LayerNormalization": "normalises by a variance int8 cannot resolve",
    "GroupNormalization": "normalises by a variance int8 cannot resolve",
    "InstanceNormalization": "normalises by a variance int8 cannot resolve",
    "Softmax": "exponentials of int8 logits: small probabilities collapse to zero",
    "LogSoftmax": "exponentials of int8 logits",
    "Gelu": "non-linear on the range where int8 steps are coarse",
    "Erf": "non-linear on the range where int8 steps are coarse",
    "Exp": "output range explodes: one int8 scale cannot cover it",
    "Log": "steep near zero where int8 has few steps",
    "Pow": "squares the range: the scale is dominated by outliers",
    "Sqrt": "steep near zero where int8 has few steps",
    "Reciprocal": "1/x amplifies the quantization error of small x",
    "LSTM": "the recurrent state accumulates quantization error step after step",
    "GRU": "the recurrent state accumulates quantization error step after step",
    "RNN": "the recurrent state accumulates quantization error step after step",
}


def run(ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    in_pattern: set[int] = set()
    live = ctx.analysis.live()
    for i in live:
        if ctx.op(i) in ("ReduceMean", "ReduceSum") and i not in in_pattern:
            members = _layernorm(ctx, i)
            if members:
                in_pattern.update(members)
                out.append(_layernorm_finding(ctx, i, members))
    for i in live:
        if i not in in_pattern and ctx.op(i) not in ctx.profile.float16_ops:  # rule `float16` says it
            reason = _reason(ctx, i)
            if reason:
                out.append(_finding(ctx, i, reason, Col.OP_TYPE, ctx.op(i), _fix(ctx, ctx.op(i))))
    return out


def _reason(ctx: RuleContext, i: int) -> str | None:
    op = ctx.op(i)
    if op == "Div":
        inputs = ctx.view.node_inputs(i)
        return SENSITIVE["Reciprocal"] if len(inputs) == 2 and not _static(ctx, inputs[1]) else None
    if op in ("Sigmoid", "Tanh"):
        at_output = any(t in ctx.view.outputs for t in ctx.view.node_outputs(i))
        return (
            "saturating output at a graph output: int8 steps show directly in the result"
            if at_output
            else None
        )
    return SENSITIVE.get(op)


def _static(ctx: RuleContext, tensor: str) -> bool:
    producer = ctx.view.producer.get(tensor)
    return ctx.view.is_const(tensor) or (producer is not None and producer in ctx.analysis.removed())


def _layernorm(ctx: RuleContext, first: int) -> list[int]:
    """Positions of the decomposed LayerNorm (either spelling) whose first mean is `first`, or []."""
    found = layernorm_moments.either_at(ctx.view, ctx.view.nodes[first])
    if not isinstance(found, layernorm.LayerNormMatch):
        return []
    position = {id(n): k for k, n in enumerate(ctx.view.nodes)}
    return [position[id(n)] for n in found.nodes]


def _layernorm_finding(ctx: RuleContext, i: int, members: list[int]) -> Finding:
    ops = "/".join(ctx.op(m) for m in members)
    return _finding(
        ctx,
        i,
        f"LayerNorm decomposed into {ops} ({len(members)} nodes): mean, variance and 1/sqrt each "
        "requantized in int8",
        "pattern",
        f"decomposed LayerNorm ({ops})",
        _fix(ctx, "LayerNormalization"),
    )


def _fix(ctx: RuleContext, op: str) -> Fix:
    p = ctx.profile
    if op == "LayerNormalization" and "LayerNormalization" in p.npu_ops:
        return rewrite_fix(RewriteId.FUSE_LAYERNORM)
    if op in ("Gelu", "Erf") and "Tanh" in p.npu_ops:
        return rewrite_fix(RewriteId.GELU_TANH)
    return Fix(f"keep this node in {p.fallback_precision} (mixed precision) if its loss shows in the scan")


def _finding(ctx: RuleContext, i: int, reason: str, attribute: str, value: str, fix: Fix) -> Finding:
    p = ctx.profile
    if p.power_of_two_scales:
        reason += "; power-of-two scales make it coarser"
    return Finding(
        node=ctx.name(i),
        op_type=ctx.op(i),
        rule=RULE_ID,
        severity=Severity.INFO,
        reason=reason,
        attribute=attribute,
        value=value,
        limit=f"{p.activations} activations",
        fix=fix.text,
        rewrite=fix.rewrite,
        rewrite_args=fix.args,
        source=p.quantization.source,
        unverified=p.quantization.unverified,
    )
