"""range_mismatch: Concat inputs 40x apart fire; 4x apart, or a non-join op, stay silent."""

from __future__ import annotations

from diag_facts import facts

from quantscan.diagnose import Cause, range_mismatch


def test_concat_of_mismatched_ranges_fires() -> None:
    f = range_mismatch.check(facts(op_type="Concat", input_ranges={"a": (-1.0, 1.0), "b": (-40.0, 40.0)}))
    assert f is not None and f.cause is Cause.RANGE_MISMATCH and f.evidence["ratio"] == 40.0
    assert "'a'" in f.reason and "'b'" in f.reason


def test_close_ranges_and_other_ops_stay_silent() -> None:
    assert range_mismatch.check(facts(op_type="Add", input_ranges={"a": (-1.0, 1.0), "b": (-4.0, 4.0)})) is None
    assert range_mismatch.check(facts(op_type="Mul", input_ranges={"a": (-1.0, 1.0), "b": (-40.0, 40.0)})) is None
