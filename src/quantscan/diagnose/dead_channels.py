"""Rule: dead channels: channels constant on every calibration sample (a ReLU that never fires, a
pruned filter). Harmless to precision but a sign the calibration data misses part of the domain.
Silent for Softmax outputs (written out as ReduceMax/Exp/ReduceSum/Div too): masked positions are
constant zero by design.

Fix: calibration with data that exercises them (or prune them).
"""

from __future__ import annotations

import numpy as np

from quantscan.diagnose.base import Cause, CauseFinding, CauseFix, FixKind, SiteFacts, human

MIN_FRACTION = 0.25
"""Report when at least this share of the channels is dead (a few dead channels are normal)."""


def check(facts: SiteFacts) -> CauseFinding | None:
    widths = facts.ch_hi - facts.ch_lo
    if widths.size < 2 or facts.bounded_by(frozenset({"Softmax", "LogSoftmax"})):
        return None
    dead = int(np.count_nonzero(np.nan_to_num(widths, nan=0.0) == 0))
    if dead == 0 or dead / widths.size < MIN_FRACTION:
        return None
    reason = f"{dead} of {widths.size} channels ({human(100 * dead / widths.size)}%) constant on every sample"
    fix = CauseFix(FixKind.CALIBRATION, "data", "calibration data that exercises these channels (or prune them)")
    return CauseFinding(facts.node, Cause.DEAD_CHANNELS, {"dead": dead, "channels": int(widths.size)}, reason, fix)
