"""The compatibility rules, one per module, each `run(ctx) -> list[Finding]`.

Order matters only for the row order of the findings table (model-level first, then by kind).
"""

from __future__ import annotations

from collections.abc import Callable

from quantscan.compat.context import RuleContext
from quantscan.compat.rules import (
    control_flow,
    dtype,
    dynamic_inputs,
    fusion,
    opset,
    param_limits,
    precision,
    rank_size,
    shape_chains,
    unsupported_op,
    weights,
)
from quantscan.records import Finding

Rule = Callable[[RuleContext], list[Finding]]

RULES: tuple[tuple[str, Rule], ...] = tuple(
    (m.RULE_ID, m.run)
    for m in (
        opset,
        weights,
        dynamic_inputs,
        shape_chains,
        control_flow,
        unsupported_op,
        param_limits,
        dtype,
        rank_size,
        fusion,
        precision,
    )
)
"""(rule id, run) for every rule, in report order."""

BODY_RULES: tuple[tuple[str, Rule], ...] = tuple(
    (rule_id, run) for rule_id, run in RULES if rule_id not in (opset.RULE_ID, dynamic_inputs.RULE_ID)
)
"""The rules that apply to the nodes of an If/Loop/Scan body: not the model's opset nor its graph inputs
(a body's formal inputs are the owner's business, not the user's)."""
