"""Rule: an absurd scale: a sentinel (float-min/max mask) in the range, or a range > 1e4x the data's
typical magnitude, so every real value quantizes to one or two codes.

Tier 1 (ranked above measured figures); tier 0 when the scale also made the site's figures NaN,
since it is their cause. Fix: a mask that reaches a Softmax -> the `clamp-mask` rewrite; any other outlier range -> a
calibration method that ignores the tail (percentile).
"""

from __future__ import annotations

import math

from quantscan.diagnose.base import SENTINEL, Cause, CauseFinding, CauseFix, FixKind, SiteFacts, human

RATIO = 1.0e4
"""Range over typical magnitude beyond which the scale is absurd (~13 bits more than int8 holds)."""
BOUNDED = frozenset({"Softmax", "LogSoftmax", "Sigmoid", "Tanh", "HardSigmoid"})
"""Ops whose output range is set by the op itself: a 6625-class Softmax has most channels near 0 and
one near 1 by design; its scale (1/255) is not an outlier's doing, so only sentinels count there. A
Softmax written out (jax2tf's ReduceMax/.../Div, one kernel) is bounded the same: `SiteFacts.bounded_by`."""


def check(facts: SiteFacts) -> CauseFinding | None:
    peak = max(abs(facts.lo), abs(facts.hi))
    if not math.isfinite(peak) or peak == 0:
        return None
    typical = facts.typical_magnitude()
    ratio = peak / typical if typical > 0 else math.inf
    sentinel = peak >= SENTINEL
    if not sentinel and (facts.bounded_by(BOUNDED) or not (math.isfinite(ratio) and ratio > RATIO)):
        return None
    evidence = {"peak_abs": peak, "typical_abs": typical, "ratio": ratio, "scale": facts.scale}
    what = "a float-min/max sentinel" if sentinel else "outliers"
    codes = typical / facts.scale if facts.scale > 0 and math.isfinite(typical) else math.nan
    reason = (f"range reaches {human(peak)} ({what}), {human(ratio)}x the typical channel magnitude "
              f"{human(typical)}: scale {human(facts.scale)}, typical data spans {human(codes)} codes")
    nan = [k for k, v in facts.figures.items() if math.isnan(v)]
    if nan:  # the figures are a symptom of this scale: the cause goes first, at tier 0
        reason += "; its error figures are NaN (float32 sums overflow)" if peak > 1.8e19 else "; its figures are NaN"
    if sentinel and facts.feeds_softmax:
        fix = CauseFix(FixKind.REWRITE, "clamp-mask", "rewrite --clamp-mask (finite mask value, proven on data)")
    else:
        fix = CauseFix(FixKind.CALIBRATION, "percentile",
                       "--calib-method percentile (the tail stops setting the scale)")
    return CauseFinding(facts.node, Cause.ABSURD_SCALE, evidence, reason, fix, 0 if nan else 1)
