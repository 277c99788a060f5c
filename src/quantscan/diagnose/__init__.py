"""Root causes with names and fixes: one rule per module, each `check(SiteFacts) -> CauseFinding | None`.

`diagnose(facts)` runs every rule on one site and returns its findings, most urgent first (by tier,
then rule order). The scan gathers the facts (scanning/causes.py), puts the first finding in
layers.csv (`diagnosis`, `diagnosis_cause`, `diagnosis_fix`, `diagnosis_tier`) and lists them in
summary.md. Pure numpy: no graph, no runtime.
"""

from __future__ import annotations

from collections.abc import Callable

from quantscan.diagnose import (
    absurd_scale,
    code_waste,
    dead_channels,
    inherited,
    nonfinite,
    outlier_channels,
    pair_equalization,
    range_mismatch,
    saturated_channels,
)
from quantscan.diagnose.base import Cause, CauseFinding, CauseFix, FixKind, SiteFacts, human

CauseRule = Callable[[SiteFacts], CauseFinding | None]

CAUSE_RULES: tuple[CauseRule, ...] = (
    absurd_scale.check,
    nonfinite.check,
    outlier_channels.check,
    pair_equalization.check,
    range_mismatch.check,
    saturated_channels.check,
    code_waste.check,
    dead_channels.check,
    inherited.check,
)
"""Every cause rule, most fundamental first: an absurd scale explains the non-finite figures it causes;
a site's own cause comes before the one it inherits."""


def diagnose(facts: SiteFacts) -> list[CauseFinding]:
    """Every rule's finding for one site, lowest tier first (stable in rule order)."""
    found = [f for f in (rule(facts) for rule in CAUSE_RULES) if f is not None]
    return sorted(found, key=lambda f: f.tier)


__all__ = ["CAUSE_RULES", "CauseRule", "Cause", "CauseFinding", "CauseFix", "FixKind", "SiteFacts", "diagnose", "human"]
