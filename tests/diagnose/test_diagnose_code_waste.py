"""code_waste: post-ReLU data (>= 0) in symmetric int8 uses half the codes and fires; signed data in
int8, or one-sided data in asymmetric uint8, uses them all and stays silent."""

from __future__ import annotations

from diag_facts import facts

from quantscan.diagnose import Cause, FixKind, code_waste


def test_one_sided_data_in_int8_fires() -> None:
    f = code_waste.check(facts([0.0, 0.0], [3.0, 6.0], scheme="int8"))
    assert f is not None and f.cause is Cause.CODE_WASTE
    assert (f.fix.kind, f.fix.value) == (FixKind.SCHEME, "asymmetric")
    assert 0.45 < f.evidence["used_fraction"] < 0.55  # 127 of 255 codes: the formula written out


def test_signed_uint8_with_a_fixed_zero_point_fires() -> None:
    f = code_waste.check(facts([-6.0], [6.0], scale=12.0 / 127, zero_point=0))  # zero point stuck at 0
    assert f is not None and f.fix.value == "int8"


def test_full_use_stays_silent() -> None:
    assert code_waste.check(facts([-6.0, -1.0], [6.0, 2.0], scheme="int8")) is None
    assert code_waste.check(facts([0.0, 0.0], [3.0, 6.0], scheme="uint8")) is None
