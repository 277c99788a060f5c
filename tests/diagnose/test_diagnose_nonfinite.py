"""nonfinite: NaN figures are a tier-0 finding; a float-min mask into a Softmax names clamp-mask."""

from __future__ import annotations

import math

from diag_facts import facts

from quantscan.diagnose import Cause, FixKind, nonfinite


def test_nan_isolated_sqnr_with_float_min_mask_fires_and_names_clamp_mask() -> None:
    f = nonfinite.check(facts([-3.4e38, -5.0], [4.0, 5.0], op_type="Add", feeds_softmax=True,
                              figures={"isolated_sqnr_db": math.nan, "cumulative_sqnr_db": math.nan}))
    assert f is not None and f.cause is Cause.NONFINITE and f.tier == 0
    assert (f.fix.kind, f.fix.value) == (FixKind.REWRITE, "clamp-mask")
    assert "3.4e38" in f.reason and "overflow" in f.reason and len(f.reason) < 200


def test_nan_without_a_mask_keeps_float() -> None:
    f = nonfinite.check(facts([-1.0], [1.0], figures={"isolated_sqnr_db": math.nan}))
    assert f is not None and f.fix.kind is FixKind.KEEP_FLOAT
    assert f.fix.value == f.node and "float float" not in f.text()  # "keep-float <site>", not "keep-float float"


def test_finite_and_infinite_figures_stay_silent() -> None:
    figures = {"isolated_sqnr_db": 31.0, "cumulative_sqnr_db": math.inf}
    assert nonfinite.check(facts([-1.0], [1.0], figures=figures)) is None
