"""human(): numbers a person reads at a glance; diagnose(): every rule, most urgent first."""

from __future__ import annotations

import math

from diag_facts import facts

from quantscan.diagnose import Cause, diagnose, human


def test_human_numbers() -> None:
    assert human(3.7e37) == "3.7e37"
    assert human(-3.4028235e38) == "-3.4e38"
    assert human(1.2e-5) == "1.2e-5"
    assert human(12.34) == "12.3"
    assert human(math.nan) == "nan"


def test_diagnose_orders_by_tier() -> None:
    found = diagnose(facts([-3.4e38, -1.0, -1.0, -1.0], [1.0, 1.0, 1.0, 1.0], op_type="Add", feeds_softmax=True,
                           figures={"isolated_sqnr_db": math.nan}))
    assert [f.cause for f in found[:2]] == [Cause.ABSURD_SCALE, Cause.NONFINITE]  # the cause, then its symptom
    assert [f.tier for f in found[:2]] == [0, 0]


def test_human_edges() -> None:
    assert human(9999.9) == "1.0e4" and human(5e-4) == "5.0e-4" and human(0.0) == "0"
