"""patterns.silu: x·sigmoid(x) and x·sigmoid(β·x) match; a Mul by another tensor does not."""

from __future__ import annotations

import pytest

from builders import pattern_index
from quantscan.graph.index import GraphIndex
from quantscan.patterns import silu
from quantscan.patterns.base import Match, NoMatch


def index_of(body: str) -> GraphIndex:
    return pattern_index(body, consts="beta = Constant <value = float {1.702}> ()",
                         inputs="float[4,16] x, float[4,16] w")


@pytest.mark.parametrize(
    ("body", "ops"),
    [
        ("s = Sigmoid (x)\n h = Mul (x, s)", "Sigmoid+Mul"),
        ("s = Sigmoid (x)\n h = Mul (s, x)", "Sigmoid+Mul"),
        ("b = Mul (x, beta)\n s = Sigmoid (b)\n h = Mul (s, x)", "Mul+Sigmoid+Mul"),
    ],
)
def test_fires(body: str, ops: str) -> None:
    index = index_of(body)
    found = silu.match_from(index, "x")
    assert isinstance(found, Match) and found.kernel == "SiLU"
    assert found.op_types() == ops and found.output == "h" and found.x == "x"


def test_silent_when_sigmoid_is_multiplied_by_another_tensor() -> None:
    index = index_of("s = Sigmoid (x)\n h = Mul (w, s)")
    assert isinstance(silu.match_from(index, "x"), NoMatch)
    miss = silu.match_at(index, next(n for n in index.nodes if n.op_type == "Sigmoid"))
    assert isinstance(miss, NoMatch) and "multiplied by x" in miss.reason


def test_silent_on_other_ops() -> None:
    index = index_of("h = Relu (x)")
    miss = silu.match_at(index, next(n for n in index.nodes if n.op_type == "Relu"))
    assert isinstance(miss, NoMatch) and "not a Sigmoid" in miss.reason
