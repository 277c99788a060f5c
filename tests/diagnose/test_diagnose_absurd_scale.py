"""absurd_scale: sentinels and ranges > 1e4x the typical magnitude fire; ordinary spreads do not."""

from __future__ import annotations

from diag_facts import facts

from quantscan.diagnose import Cause, FixKind, absurd_scale

TYPICAL = [-4.0, -5.0, -3.0, -6.0]


def test_float_min_mask_feeding_softmax_names_clamp_mask() -> None:
    f = absurd_scale.check(facts([*TYPICAL, -3.4028235e38], [4.0, 5.0, 3.0, 6.0, 2.0], op_type="Add",
                                 feeds_softmax=True))
    assert f is not None and f.cause is Cause.ABSURD_SCALE and f.tier == 1
    assert (f.fix.kind, f.fix.value) == (FixKind.REWRITE, "clamp-mask")
    assert f.evidence["ratio"] > 1e37
    assert "3.4e38" in f.reason and "e37x" in f.reason  # human-sized, never 37 digits
    assert not any(len(tok) > 12 and tok.isdigit() for tok in f.reason.replace(".", " ").split())


def test_outlier_range_without_softmax_names_percentile() -> None:
    f = absurd_scale.check(facts([*TYPICAL, -2e5], [4.0, 5.0, 3.0, 6.0, 1.0]))
    assert f is not None and (f.fix.kind, f.fix.value) == (FixKind.CALIBRATION, "percentile")


def test_ordinary_range_stays_silent() -> None:
    assert absurd_scale.check(facts([*TYPICAL, -300.0], [4.0, 5.0, 3.0, 6.0, 1.0])) is None  # 60x: not absurd


def test_bounded_op_output_stays_silent() -> None:
    """A many-class Softmax: most channels peak near 1e-6, one near 1 — the op's range, not an outlier."""
    probs = [1e-6] * 50 + [0.99]
    assert absurd_scale.check(facts([0.0] * 51, probs, op_type="Softmax")) is None
    assert absurd_scale.check(facts([0.0] * 51, probs, op_type="Conv")) is not None  # the same range elsewhere
    # magika's Softmax written out: one kernel whose first node is the ReduceMax
    written_out = "Softmax[ReduceMax+Max+Reshape+Expand+Sub+Exp+ReduceSum+Reshape+Expand+Div]"
    assert absurd_scale.check(facts([0.0] * 51, probs, op_type="ReduceMax", kernel=written_out)) is None
    assert absurd_scale.check(facts([0.0] * 51, probs, op_type="ReduceMax", kernel="ReduceMax")) is not None
