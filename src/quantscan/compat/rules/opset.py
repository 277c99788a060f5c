"""Rule `opset`: the model's default-domain opset outside the range the converter accepts.

A model-level finding (node and op_type empty): converters check the opset before anything else.
"""

from __future__ import annotations

from quantscan.compat.context import RuleContext
from quantscan.records import Finding

RULE_ID = "opset"


def run(ctx: RuleContext) -> list[Finding]:
    p, version = ctx.profile, ctx.view.opset()
    lo, hi = p.opset_min, p.opset_max
    if version == 0 or ((lo is None or version >= lo) and (hi is None or version <= hi)):
        return []
    target = hi if hi is not None and version > hi else lo
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
            fix=f"convert the model to opset {target} (onnx.version_converter) and re-check",
            source=p.opset.source,
            unverified=p.opset.unverified,
        )
    ]
