"""Rule `fusion`: patterns that keep a chip from fusing an activation or a BatchNorm into its Conv.

A fused activation costs nothing; an unfused one is a separate kernel with its own int8 requantization
(time and precision). Reported: activations the profile cannot fuse, activations or BNs whose Conv
output also feeds another node, BNs with no Conv to fold into, and decomposed HardSwish the chip
could run fused (`fuse-hardswish`).
"""

from __future__ import annotations

from quantscan.compat.context import RuleContext
from quantscan.compat.fixes import Fix, rewrite_fix
from quantscan.patterns import hardswish, silu
from quantscan.patterns.base import Match
from quantscan.records import Finding, RewriteId, Severity

RULE_ID = "fusion"
PRODUCERS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
ACTIVATIONS = frozenset(
    {
        "Relu",
        "Clip",
        "LeakyRelu",
        "PRelu",
        "HardSwish",
        "HardSigmoid",
        "Sigmoid",
        "Tanh",
        "Elu",
        "Selu",
        "Softplus",
        "Mish",
        "Gelu",
        "ThresholdedRelu",
    }
)


def run(ctx: RuleContext) -> list[Finding]:
    out: list[Finding] = []
    if ctx.profile.recipe == "onnxruntime":  # quantize_static fuses no kernel: an unfused op costs nothing there
        return out
    live = ctx.analysis.live()
    hswish_muls = _decomposed_hardswish_muls(ctx) if "HardSwish" in ctx.profile.fused_activations else set()
    for i in live:
        op = ctx.op(i)
        if op in ACTIVATIONS and ctx.on_npu_path(i):
            out.extend(_activation(ctx, i))
        elif op == "BatchNormalization":
            out.extend(_batchnorm(ctx, i))
        elif op == "Mul" and i in hswish_muls:
            out.append(
                _finding(
                    ctx,
                    i,
                    Severity.INFO,
                    "decomposed HardSwish (x·relu6(x+3)/6) after a Conv: the chip fuses a native HardSwish",
                    "pattern",
                    "decomposed HardSwish",
                    rewrite_fix(RewriteId.FUSE_HARDSWISH),
                )
            )
    return out


def _conv_source(ctx: RuleContext, tensor: str) -> tuple[int, str] | None:
    """(Conv node, tensor it hands to the activation) when `tensor` comes from Conv or Conv+BN."""
    j = ctx.view.producer.get(tensor)
    if j is None:
        return None
    if ctx.op(j) == "BatchNormalization":
        k = ctx.view.producer.get(ctx.view.nodes[j].input[0])
        return (k, tensor) if k is not None and ctx.op(k) in PRODUCERS else None
    return (j, tensor) if ctx.op(j) in PRODUCERS else None


def _others(ctx: RuleContext, tensor: str, me: int) -> list[int]:
    return [c for c in ctx.view.consumers.get(tensor, []) if c != me]


def _activation(ctx: RuleContext, i: int) -> list[Finding]:
    inputs = ctx.view.node_inputs(i)
    src = _conv_source(ctx, inputs[0]) if inputs else None
    if src is None:
        return []
    conv, tensor = src
    p, op = ctx.profile, ctx.op(i)
    if op == "Sigmoid" and _is_silu(ctx, i, tensor):
        return []
    if op not in p.fused_activations:
        fused = ", ".join(sorted(p.fused_activations)) or "none"
        return [
            _finding(
                ctx,
                i,
                Severity.WARN,
                f"{op} after {ctx.name(conv)} does not fuse on {p.name} (fuses: {fused}): "
                "a separate kernel with its own requantization",
                "fused_activation",
                op,
                f"use an activation {p.name} fuses ({fused}), or accept the extra kernel",
            )
        ]
    others = _others(ctx, tensor, i)
    if others:
        return [
            _finding(
                ctx,
                i,
                Severity.WARN,
                f"{op} cannot fuse into {ctx.name(conv)}: its input also feeds {ctx.name(others[0])}",
                "fusion_blocked_by",
                ctx.name(others[0]),
                "give the other consumer its own copy of the pre-activation value, or move it after "
                f"the {op}",
            )
        ]
    return []


def _is_silu(ctx: RuleContext, sig: int, x: str) -> bool:
    found = silu.match_at(ctx.view, ctx.view.nodes[sig])
    return isinstance(found, Match) and found.x == x


def _batchnorm(ctx: RuleContext, i: int) -> list[Finding]:
    x = ctx.view.nodes[i].input[0]
    j = ctx.view.producer.get(x)
    if j is None or ctx.op(j) not in PRODUCERS:
        return [
            _finding(
                ctx,
                i,
                Severity.INFO,
                "BatchNormalization has no Conv/Gemm before it: it runs as a separate "
                "per-channel scale kernel",
                "fold_into",
                "none",
                "fold it into the next Conv by hand, or accept an extra kernel",
            )
        ]
    others = _others(ctx, x, i)
    if others or x in ctx.view.outputs:
        other = ctx.name(others[0]) if others else "a graph output"
        return [
            _finding(
                ctx,
                i,
                Severity.WARN,
                f"BatchNormalization cannot fold into {ctx.name(j)}: the Conv output also feeds {other}",
                "fold_into",
                ctx.name(j),
                "duplicate the Conv for the other consumer, then fold-bn",
            )
        ]
    return []


def _decomposed_hardswish_muls(ctx: RuleContext) -> set[int]:
    """Positions of the Mul where a decomposed HardSwish of a Conv (or Conv+BN) output meets x again."""
    found: set[int] = set()
    position = {id(n): k for k, n in enumerate(ctx.view.nodes)}
    for node in ctx.view.nodes:
        match = hardswish.match_at(ctx.view, node)
        if not isinstance(match, hardswish.HardSwishMatch) or match.spelling not in hardswish.DECOMPOSED:
            continue
        mul = match.mul_of_x()
        if mul is not None and _conv_source(ctx, match.x) is not None:
            found.add(position[id(mul)])
    return found


def _finding(
    ctx: RuleContext, i: int, severity: Severity, reason: str, attribute: str, value: str, fix: str | Fix
) -> Finding:
    p = ctx.profile
    fix = fix if isinstance(fix, Fix) else Fix(fix)
    return Finding(
        node=ctx.name(i),
        op_type=ctx.op(i),
        rule=RULE_ID,
        severity=severity,
        reason=reason,
        attribute=attribute,
        value=value,
        limit=", ".join(sorted(p.fused_activations)) if attribute == "fused_activation" else "",
        fix=fix.text,
        rewrite=fix.rewrite,
        rewrite_args=fix.args,
        source=p.fusion.source,
        unverified=p.fusion.unverified,
    )
