"""outlier_channels: one channel 50x the others fires (robust z-score); an even spread does not."""

from __future__ import annotations

import numpy as np
from diag_facts import facts

from quantscan.diagnose import Cause, FixKind, outlier_channels

RNG = np.random.default_rng(0)
WIDTHS = RNG.uniform(0.8, 1.2, 32)


def test_one_wide_channel_fires() -> None:
    hi = WIDTHS.copy()
    hi[7] = 50.0
    f = outlier_channels.check(facts(list(-0 * hi), list(hi)))
    assert f is not None and f.cause is Cause.OUTLIER_CHANNELS and f.fix.kind is FixKind.INT16
    assert f.evidence["channels"] == 1 and 40 < f.evidence["ratio"] < 60
    assert f.fix.text().split().count("int16") == 1  # "int16 activations at this site", not "int16 int16: ..."


def test_even_channels_stay_silent() -> None:
    assert outlier_channels.check(facts(list(-WIDTHS), list(WIDTHS))) is None
    assert outlier_channels.check(facts([-1.0, -1.0], [1.0, 30.0])) is None  # too few channels to judge


def test_names_the_no_latency_rewrite_that_applies() -> None:
    hi = WIDTHS.copy()
    hi[7] = 50.0
    for passes, value in [(("equalize",), "equalize"), (("smooth", "equalize"), "smooth"), ((), "int16")]:
        f = outlier_channels.check(facts(list(-0 * hi), list(hi), passes=passes))
        assert f is not None and f.fix.value == value
        assert (f.fix.kind is FixKind.REWRITE) == bool(passes)


def test_softmax_probabilities_stay_silent() -> None:
    """YOLOv12's area attention writes its softmax out (ReduceMax/Sub/Exp/ReduceSum/Div, one kernel): the
    last axis of the probabilities is key positions, not channels; the same wide column that fires on a
    Conv stays silent there, written out or not."""
    hi = WIDTHS.copy()
    hi[7] = 50.0
    assert outlier_channels.check(facts(list(-0 * hi), list(hi))) is not None
    written_out = facts(list(-0 * hi), list(hi), op_type="ReduceMax", kernel="Softmax[ReduceMax+Sub+Exp+ReduceSum+Div]")
    assert outlier_channels.check(written_out) is None
    assert outlier_channels.check(facts(list(-0 * hi), list(hi), op_type="Softmax")) is None
