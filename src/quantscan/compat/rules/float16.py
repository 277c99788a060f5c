"""Rule `float16`: ops the toolkit runs in float16 inside an int8 model (info); where (NPU or CPU)
is the check's placement, as for every finding.

Why a rule of its own: a profile learns this from a recorded vendor run (`[float16] ops`, e.g.
rknn-toolkit2 2.5.0 ran Softmax as exSoftmax13 FLOAT16: on the NPU for rk3588, on the CPU for
rk3568), not from an op list. Such a node is not an int8 precision risk (the `precision` rule leaves
it out) but a mixed-precision boundary the user should know about: DataConvert layers around it, and
float16 figures in the vendor's analysis. `quantscan vendor` compares this prediction with the vendor's placement.

A node that breaks one of the profile's limits (an attention Softmax on an axis rk3588's list does not
name) gets no note here: its param-limit warning carries the fix and says the float16 fact, so the user
reads one finding, not "Transpose" and "none needed" side by side.
"""

from __future__ import annotations

from quantscan.compat.context import RuleContext
from quantscan.compat.rules import param_limits
from quantscan.patterns import layernorm, layernorm_moments
from quantscan.records import Finding, Severity

RULE_ID = "float16"


def decomposed_layernorms(ctx: RuleContext) -> set[int]:
    """Positions of every node of a LayerNorm written out as ReduceMean/Sub/Pow/.../Div/Mul/Add: a profile
    that lists LayerNormalization as float means the toolkit fuses the pattern into one float op
    (tpu-mlir 1.30.2 lowers PP-OCRv4 rec's five into `tpu.LayerNorm` in float32)."""
    if "LayerNormalization" not in ctx.profile.float16_ops:
        return set()
    position = {id(n): k for k, n in enumerate(ctx.view.nodes)}
    members: set[int] = set()
    for i in ctx.analysis.live():
        if ctx.op(i) in ("ReduceMean", "ReduceSum") and i not in members:
            found = layernorm_moments.either_at(ctx.view, ctx.view.nodes[i])
            if isinstance(found, layernorm.LayerNormMatch):
                members.update(position[id(n)] for n in found.nodes)
    return members


def run(ctx: RuleContext) -> list[Finding]:
    p = ctx.profile
    if not p.float16_ops:
        return []
    origin = p.float16
    pattern = decomposed_layernorms(ctx)
    return [
        Finding(
            node=ctx.name(i),
            op_type=ctx.op(i),
            rule=RULE_ID,
            severity=Severity.INFO,
            reason=f"{p.name} runs {ctx.op(i)} in float16 (int8 around it, converted at both ends)",
            attribute="dtype",
            value="float16",
            limit=f"{p.activations} activations",
            fix="none needed: the toolkit keeps it in float16 (scan keeps it float, not an int8 site); "
                "its loss is the int8 input it is fed",
            source=origin.source if origin else "",
            unverified=origin.unverified if origin else False,
        )
        for i in ctx.analysis.live()
        if (ctx.op(i) in p.float16_ops or i in pattern) and not param_limits.violations(ctx, i)
    ]
