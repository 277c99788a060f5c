"""patterns.gelu: the three Erf-GELU orders match; wrong constants do not."""

from __future__ import annotations

import pytest

from builders import pattern_index
from quantscan.graph.index import GraphIndex
from quantscan.patterns import gelu
from quantscan.patterns.base import Match, NoMatch

CONSTS = """
    sqrt2 = Constant <value = float {1.4142135}> ()
    inv_sqrt2 = Constant <value = float {0.70710678}> ()
    one = Constant <value = float {1.0}> ()
    half = Constant <value = float {0.5}> ()
    two = Constant <value = float {2.0}> ()
"""


def index_of(body: str) -> GraphIndex:
    return pattern_index(body, consts=CONSTS)


@pytest.mark.parametrize(
    ("body", "ops"),
    [
        ("d = Div (x, sqrt2)\n e = Erf (d)\n a = Add (e, one)\n m = Mul (x, a)\n h = Mul (m, half)",
         "Div+Erf+Add+Mul+Mul"),
        ("d = Mul (x, inv_sqrt2)\n e = Erf (d)\n a = Add (one, e)\n hx = Mul (x, half)\n h = Mul (hx, a)",
         "Mul+Mul+Erf+Add+Mul"),
        ("d = Div (x, sqrt2)\n e = Erf (d)\n a = Add (e, one)\n m = Mul (a, half)\n h = Mul (m, x)",
         "Div+Erf+Add+Mul+Mul"),
    ],
)
def test_fires_on_each_order(body: str, ops: str) -> None:
    index = index_of(body)
    found = gelu.match_from(index, "x")
    assert isinstance(found, Match) and found.kernel == "GELU"
    assert found.op_types() == ops and found.output == "h" and not found.shared(index)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("d = Div (x, two)\n e = Erf (d)\n a = Add (e, one)\n m = Mul (x, a)\n h = Mul (m, half)", "x/√2"),
        ("d = Div (x, sqrt2)\n e = Erf (d)\n a = Add (e, half)\n m = Mul (x, a)\n h = Mul (m, half)", "1 is not"),
        ("d = Div (x, sqrt2)\n e = Erf (d)\n a = Add (e, one)\n m = Mul (x, a)\n h = Mul (m, two)", "0.5"),
    ],
)
def test_silent_on_near_miss(body: str, reason: str) -> None:
    index = index_of(body)
    assert isinstance(gelu.match_from(index, "x"), NoMatch)
    miss = gelu.match_at(index, next(n for n in index.nodes if n.op_type == "Erf"))
    assert isinstance(miss, NoMatch) and reason in miss.reason
