"""Rule `dynamic-input`: graph inputs with symbolic dims.

NPU converters compile for one static shape. A symbolic dim the caller fixed (input_shapes) is an
info note; one left open is an error on profiles with `tensor.static_shapes` (warn otherwise), with
the exact `fix-dim` spelling that fixes it. A profile without static shapes (onnxruntime) gets no
row. The row names the graph input (op_type `graph-input`).

No guessed sizes in the suggestion: a dim's value is named only when it came from the user
(`--input-shape`) or is the batch axis (batch 1, the inference batch every profile's limit admits);
any other open dim is named as needing a size from `--input-shape` or the calibration data, and
`rewrite_args` carry only the settings with a known value (a token length or an OCR line width set
to an invented 224 made the suggested fix-dim fail against the real data).
"""

from __future__ import annotations

from quantscan.compat.context import RuleContext
from quantscan.compat.fixes import rewrite_fix
from quantscan.compat.loader import DimFill
from quantscan.records import Finding, RewriteId, Severity

RULE_ID = "dynamic-input"


def run(ctx: RuleContext) -> list[Finding]:
    if not ctx.profile.static_shapes:
        return []  # a runtime that runs dynamic shapes (profile onnxruntime) has nothing to fix here
    by_input: dict[str, list[DimFill]] = {}
    for fill in ctx.analysis.loaded.fills:
        by_input.setdefault(fill.input, []).append(fill)
    return [_finding(ctx, name, fills) for name, fills in by_input.items()]


def _fix_dim(fill: DimFill) -> str:
    if fill.axis == 0:
        return f"batch={fill.value}"
    return f"{fill.input}:{fill.axis}={fill.value}"


def _finding(ctx: RuleContext, name: str, fills: list[DimFill]) -> Finding:
    p = ctx.profile
    shape = ctx.analysis.original.info(name).shape or ()
    shown = "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
    dims = ", ".join(f"axis {f.axis} ({f.symbol})" for f in fills)
    user = all(f.from_user for f in fills)
    if user:
        severity, verb = Severity.INFO, "fixed by the given input shape"
    else:
        severity = ctx.severity("reject" if p.static_shapes else "cpu", p.tensor)
        verb = "not fixed; its size is unknown here, so the byte counts that depend on it are estimates"
    known = [f for f in fills if f.from_user or f.axis == 0]
    unknown = [f for f in fills if not (f.from_user or f.axis == 0)]
    fix = rewrite_fix(RewriteId.FIX_DIM, *(_fix_dim(f) for f in known)) if known else None
    text = fix.text if fix else ""
    if unknown:
        need = ", ".join(f"{f.input}:{f.axis} ({f.symbol})" for f in unknown)
        text = (text + "; " if text else "") + (
            f"fix-dim {need} with the size from --input-shape or the calibration data (unknown here)"
        )
    return Finding(
        node=name,
        op_type="graph-input",
        rule=RULE_ID,
        severity=severity,
        reason=f"input '{name}' has symbolic {dims}: {verb}; {p.name} compiles static shapes",
        attribute="shape",
        value=shown,
        limit="static dims",
        fix=text,
        rewrite=fix.rewrite if fix else None,
        rewrite_args=fix.args if fix else (),
        source=p.tensor.source,
        unverified=p.tensor.unverified,
    )
