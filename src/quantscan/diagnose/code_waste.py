"""Rule: data that uses about half the codes it is given: one-sided data (e.g. after ReLU) in a
symmetric int8 tensor, or signed data in a uint8 tensor whose zero point cannot follow it.

Fix: an asymmetric scale for one-sided data (int8 with zero point -128, or uint8).
"""

from __future__ import annotations

import math

from quantscan.diagnose.base import Cause, CauseFinding, CauseFix, FixKind, SiteFacts, human

USED_LIMIT = 0.55
"""Fraction of the code range the data covers below which about half the codes are wasted."""


def check(facts: SiteFacts) -> CauseFinding | None:
    if not (facts.scale > 0 and math.isfinite(facts.scale)) or not (facts.hi > facts.lo):
        return None
    lo_code = facts.lo / facts.scale + facts.zero_point
    hi_code = facts.hi / facts.scale + facts.zero_point
    lo_code, hi_code = max(lo_code, facts.qmin), min(hi_code, facts.qmax)
    used = (hi_code - lo_code) / (facts.qmax - facts.qmin)
    if used >= USED_LIMIT:
        return None
    if facts.lo >= 0 and facts.qmin < 0:
        what, fix = "one-sided data (>= 0) in a symmetric int8 tensor", CauseFix(
            FixKind.SCHEME, "asymmetric",
            "an asymmetric scale for this tensor (int8 zero point -128, as TFLite does after ReLU/Softmax; "
            "or --activations uint8)")
    elif facts.lo < 0 and facts.qmin == 0:
        what, fix = "signed data in a uint8 tensor", CauseFix(
            FixKind.SCHEME, "int8", "a zero point that follows the data (asymmetric) or int8")
    else:
        what, fix = "data narrower than its range", CauseFix(
            FixKind.CALIBRATION, "minmax", "calibrate the range on representative data")
    reason = f"{what}: uses {human(100 * used)}% of the codes (about 1 bit lost)"
    return CauseFinding(facts.node, Cause.CODE_WASTE, {"used_fraction": used}, reason, fix)
