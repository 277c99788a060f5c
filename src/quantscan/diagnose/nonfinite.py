"""Rule: a site whose own figures are not finite (NaN isolated SQNR...) is a finding, never a silent last rank.

Why: NaN sorts last, so the site that breaks a model (a float-min mask whose Σx² overflows float32)
used to rank ~172 of 209. The reason says whether the values themselves are finite but too large for
float32 error sums, and the fix follows from that: a Softmax mask -> clamp-mask; else keep float.
"""

from __future__ import annotations

import math

from quantscan.columns import Col
from quantscan.diagnose.base import (
    FLOAT32_SUM_LIMIT,
    SENTINEL,
    Cause,
    CauseFinding,
    CauseFix,
    FixKind,
    SiteFacts,
    human,
)

FIGURES = {Col.ISOLATED_SQNR_DB: "isolated SQNR", Col.ISOLATED_COSINE: "isolated cosine",
           Col.CUMULATIVE_SQNR_DB: "cumulative SQNR", Col.CUMULATIVE_COSINE: "cumulative cosine"}


def check(facts: SiteFacts) -> CauseFinding | None:
    """Fires when any measured figure is NaN (inf SQNR means identical and is fine)."""
    bad = [label for k, label in FIGURES.items() if k in facts.figures and math.isnan(facts.figures[k])]
    if not bad:
        return None
    peak = max(abs(facts.lo), abs(facts.hi))
    if math.isfinite(peak) and peak > FLOAT32_SUM_LIMIT:
        why = f"values reach {human(peak)} (finite), so float32 error sums overflow"
    else:
        why = "the values or their error sums are not finite"
    if facts.feeds_softmax and peak >= SENTINEL:
        fix = CauseFix(FixKind.REWRITE, "clamp-mask", "rewrite --clamp-mask (a finite mask, e.g. -1e4)")
    else:
        fix = CauseFix(FixKind.KEEP_FLOAT, facts.node, f"keep `{facts.node}` float until its range is finite and sane")
    return CauseFinding(facts.node, Cause.NONFINITE, {"peak_abs": peak}, f"{', '.join(bad)} NaN: {why}", fix, 0)
