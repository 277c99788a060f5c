"""saturated_channels: a channel past the quantization range (a clipping calibration) fires; the
minmax hull never clips and stays silent."""

from __future__ import annotations

from diag_facts import facts

from quantscan.diagnose import Cause, FixKind, saturated_channels


def test_clipped_channel_fires() -> None:
    # uint8 range [0, 2.55] (scale 0.01): channel 1 reaches 6.0, 345 codes past the top
    f = saturated_channels.check(facts([0.0, 0.0], [1.0, 6.0], scale=0.01, zero_point=0))
    assert f is not None and f.cause is Cause.SATURATED_CHANNELS and f.fix.kind is FixKind.CALIBRATION
    assert f.evidence["channels"] == 1 and abs(f.evidence["max_codes_over"] - 345.0) < 1e-6


def test_minmax_hull_stays_silent() -> None:
    assert saturated_channels.check(facts([0.0, -2.0], [1.0, 6.0])) is None
