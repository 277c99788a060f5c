"""Rule: inherited error: the site's own quantization is fine (isolated SQNR high) but what reaches it
is not (cumulative SQNR low), so the cause is upstream. Which upstream site is decided by measurement:
the one whose float version lifts the model output most (`gain_if_float`, scanning.impact).

Why measured gain and not the upstream site with the lowest SQNR: a site's own SQNR says little about
what reaches later layers (issue 10: the scan's #1 by isolated error was not the Conv worth keeping
float). Silent until gains are measured, and when no upstream site has a gain worth naming.

Fix: keep that upstream site float (its own finding, if any, says why it loses precision).
"""

from __future__ import annotations

import math

from quantscan.columns import Col
from quantscan.diagnose.base import Cause, CauseFinding, CauseFix, FixKind, SiteFacts, human

CUMULATIVE_DB = 25.0
"""Cumulative SQNR below this is a large error (the scan's 'intrinsic' limit, scanning.tables)."""
GAP_DB = 10.0
"""...and the isolated SQNR must be at least this much better: the site itself adds little of it."""
MIN_GAIN = 1e-4
"""An upstream gain below this is noise (report.verdict.NOTABLE_GAIN): nothing worth naming."""


def looks_inherited(isolated_sqnr_db: float, cumulative_sqnr_db: float) -> bool:
    """Large cumulative error, small isolated error: the figures alone, before any upstream is named."""
    iso, cum = isolated_sqnr_db, cumulative_sqnr_db
    return not math.isnan(iso) and math.isfinite(cum) and cum < CUMULATIVE_DB and iso - cum >= GAP_DB


def check(facts: SiteFacts) -> CauseFinding | None:
    iso = facts.figures.get(Col.ISOLATED_SQNR_DB, math.nan)
    cum = facts.figures.get(Col.CUMULATIVE_SQNR_DB, math.nan)
    if not looks_inherited(iso, cum):
        return None
    measured = {node: g for node, g in facts.upstream_gains.items() if math.isfinite(g)}
    if not measured:
        return None
    upstream, gain = max(measured.items(), key=lambda item: item[1])
    if gain < MIN_GAIN or gain < facts.figures.get(Col.GAIN_IF_FLOAT, -math.inf):
        return None  # nothing upstream worth naming, or keeping this site float helps more itself
    reason = (f"isolated {human(iso)} dB is fine, cumulative {human(cum)} dB is inherited: keeping upstream "
              f"`{upstream}` float lifts the output cosine by {human(gain)} (measured), the most of "
              f"{len(measured)} measured upstream site(s)")
    fix = CauseFix(FixKind.KEEP_FLOAT, upstream, f"keep `{upstream}` float / see its cause")
    evidence = {Col.ISOLATED_SQNR_DB: iso, Col.CUMULATIVE_SQNR_DB: cum, "upstream_gain": gain}
    return CauseFinding(facts.node, Cause.INHERITED, evidence, reason, fix)
