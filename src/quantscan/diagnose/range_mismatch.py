"""Rule: Concat/Add/Sum inputs whose ranges differ > 16x: the shared output scale starves the narrow
branch (4 bits or more lost).

Fix: int16 at the join (or rescale the wide branch upstream).
"""

from __future__ import annotations

import math

from quantscan.diagnose.base import SENTINEL, Cause, CauseFinding, CauseFix, FixKind, SiteFacts, human

JOINS = frozenset({"Concat", "Add", "Sum"})
RATIO = 16.0


def check(facts: SiteFacts) -> CauseFinding | None:
    if facts.op_type not in JOINS or len(facts.input_ranges) < 2:
        return None
    widths = {k: hi - lo for k, (lo, hi) in facts.input_ranges.items()
              if math.isfinite(hi - lo) and 0 < hi - lo < SENTINEL}
    if len(widths) < 2:
        return None
    wide = max(widths, key=lambda k: widths[k])
    narrow = min(widths, key=lambda k: widths[k])
    ratio = widths[wide] / widths[narrow]
    if ratio <= RATIO:
        return None
    reason = (f"input '{narrow}' spans {human(widths[narrow])}, '{wide}' {human(widths[wide])} "
              f"({human(ratio)}x): one shared scale leaves '{narrow}' ~{human(255 / ratio)} codes")
    fix = CauseFix(FixKind.INT16, "int16", f"int16 at this {facts.op_type} (or rescale '{wide}' upstream)")
    return CauseFinding(facts.node, Cause.RANGE_MISMATCH, {"ratio": ratio}, reason, fix)
