"""Rule: saturated channels: channels whose calibration range reaches past the tensor's quantization
range (a percentile/entropy/mse scale that clips them), so their peaks are cut, not rounded.

Fix: minmax calibration for this tensor (or int16).
"""

from __future__ import annotations

import math

import numpy as np

from quantscan.diagnose.base import Cause, CauseFinding, CauseFix, FixKind, SiteFacts, human

CODES_OVER = 2.0
"""A channel counts as saturated when it reaches this many codes beyond the representable range."""


def check(facts: SiteFacts) -> CauseFinding | None:
    if facts.ch_lo.size == 0 or not (facts.scale > 0 and math.isfinite(facts.scale)):
        return None
    rmin = (facts.qmin - facts.zero_point) * facts.scale
    rmax = (facts.qmax - facts.zero_point) * facts.scale
    over = np.maximum(facts.ch_hi - rmax, rmin - facts.ch_lo) / facts.scale
    over = np.nan_to_num(over, nan=0.0)
    n = int(np.count_nonzero(over > CODES_OVER))
    if n == 0:
        return None
    reason = (f"{n} channel(s) clipped, up to {human(float(over.max()))} codes past the range "
              f"[{human(rmin)}, {human(rmax)}]")
    fix = CauseFix(FixKind.CALIBRATION, "minmax", "--calib-method minmax (or int16) so peaks are not clipped")
    return CauseFinding(facts.node, Cause.SATURATED_CHANNELS, {"channels": n, "max_codes_over": float(over.max())},
                   reason, fix)
