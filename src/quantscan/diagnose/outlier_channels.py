"""Rule: outlier channels: one or a few channels whose range is far beyond the rest (robust z-score of
channel widths), so a per-tensor scale leaves the others a handful of codes.

Fix: `rewrite --smooth` or `--equalize` where the graph lets them rescale these channels (exact in FP32,
no latency: the channels' range moves into the next layer's per-channel weights); else int16 at this
site (or per-channel activations where the chip has them).

Silent for a Softmax's output, written out or not: its range is [0, 1] by construction, its last axis
holds key positions or classes (an attention row's keys, not channels a scale could be split by), and
no rewrite rescales them; its precision shows in its own isolated SQNR instead.
"""

from __future__ import annotations

import numpy as np

from quantscan.diagnose.base import SENTINEL, Cause, CauseFinding, CauseFix, FixKind, SiteFacts, human

Z_LIMIT = 8.0
"""Robust z-score (median/MAD) of the widest channel beyond which it is an outlier."""
MIN_RATIO = 8.0
"""...and it must be this many times the median width (3 bits lost), or the spread is harmless."""
MIN_CHANNELS = 4
PROBABILITIES = frozenset({"Softmax", "LogSoftmax"})


def check(facts: SiteFacts) -> CauseFinding | None:
    if facts.bounded_by(PROBABILITIES):
        return None
    widths = facts.ch_hi - facts.ch_lo
    widths = widths[np.isfinite(widths) & (widths > 0) & (widths < SENTINEL)]
    if widths.size < MIN_CHANNELS:
        return None
    med = float(np.median(widths))
    mad = float(np.median(np.abs(widths - med))) * 1.4826
    top = float(widths.max())
    z = (top - med) / mad if mad > 0 else (np.inf if top > med else 0.0)
    if z <= Z_LIMIT or top / med <= MIN_RATIO:
        return None
    n_out = int(np.count_nonzero((widths - med) > Z_LIMIT * max(mad, 1e-30)))
    reason = (f"{n_out} channel(s) up to {human(top / med)}x the median channel range "
              f"(robust z {human(float(z))}): the other channels get {human(255 * med / top)} of 255 codes")
    fix = _fix(facts.passes)
    return CauseFinding(facts.node, Cause.OUTLIER_CHANNELS, {"z": float(z), "ratio": top / med, "channels": n_out},
                   reason, fix)


NO_LATENCY_HOW = {
    "smooth": "rewrite --smooth --calib DIR (or --recover): moves these channels' range into the next layer's "
              "per-channel weights, exact in FP32, no latency cost; else int16 here",
    "equalize": "rewrite --equalize (or --recover): rescales these channels against the next layer's weights, "
                "exact in FP32, no latency cost; else int16 here",
}


def _fix(passes: tuple[str, ...]) -> CauseFix:
    """The first no-latency pass that applies at the site (smooth uses the measured ranges), else int16."""
    for name in ("smooth", "equalize"):
        if name in passes:
            return CauseFix(FixKind.REWRITE, name, NO_LATENCY_HOW[name])
    return CauseFix(FixKind.INT16, "int16", "int16 activations at this site (or per-channel activation scales)")
