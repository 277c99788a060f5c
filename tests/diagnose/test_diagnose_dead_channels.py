"""dead_channels: half the channels constant fires; one of sixteen, or a Softmax's masked zeros, do not."""

from __future__ import annotations

from diag_facts import facts

from quantscan.diagnose import Cause, dead_channels


def test_many_dead_channels_fire() -> None:
    f = dead_channels.check(facts([0.0] * 8, [0.0] * 4 + [1.0] * 4))
    assert f is not None and f.cause is Cause.DEAD_CHANNELS and f.evidence["dead"] == 4


def test_few_dead_or_softmax_stay_silent() -> None:
    assert dead_channels.check(facts([0.0] * 16, [0.0] + [1.0] * 15)) is None
    assert dead_channels.check(facts([0.0] * 8, [0.0] * 4 + [1.0] * 4, op_type="Softmax")) is None
    assert dead_channels.check(facts([0.0] * 8, [0.0] * 4 + [1.0] * 4, op_type="ReduceMax",
                                     kernel="Softmax[ReduceMax+Sub+Exp+ReduceSum+Div]")) is None
