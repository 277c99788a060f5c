"""patterns.hardswish: each spelling matches with the right nodes; near misses say why they don't."""

from __future__ import annotations

import pytest

from builders import pattern_index
from quantscan.graph.index import GraphIndex
from quantscan.patterns import hardswish
from quantscan.patterns.base import NoMatch

CONSTS = """
    three = Constant <value = float {3.0}> ()
    zero = Constant <value = float {0.0}> ()
    six = Constant <value = float {6.0}> ()
    five = Constant <value = float {5.0}> ()
    sixth = Constant <value = float {0.16666667}> ()
"""
SPELLINGS = {
    "mul-then-div": ("a = Add (x, three)\n c = Clip (a, zero, six)\n m = Mul (x, c)\n h = Div (m, six)", "clip"),
    "div-then-mul": ("a = Add (three, x)\n c = Clip (a, zero, six)\n d = Div (c, six)\n h = Mul (d, x)", "clip"),
    "mul-by-sixth": ("a = Add (x, three)\n c = Clip (a, zero, six)\n m = Mul (c, x)\n h = Mul (sixth, m)", "clip"),
    "hardsigmoid": ("s = HardSigmoid <alpha=0.16666667, beta=0.5> (x)\n h = Mul (x, s)", "hardsigmoid"),
    "native": ("h = HardSwish (x)", "native"),
}


def index_of(body: str) -> GraphIndex:
    return pattern_index(body, consts=CONSTS)


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_fires_on_each_spelling(name: str) -> None:
    body, spelling = SPELLINGS[name]
    index = index_of(body)
    found = hardswish.match_from(index, "x")
    assert isinstance(found, hardswish.HardSwishMatch)
    assert found.spelling.value == spelling
    assert found.x == "x" and found.output == "h"
    assert found.nodes[-1].output[0] == "h"
    assert not found.shared(index)


def test_shared_intermediate_is_reported() -> None:
    index = index_of("a = Add (x, three)\n c = Clip (a, zero, six)\n m = Mul (x, c)\n h = Div (m, six)\n z = Neg (c)")
    found = hardswish.match_from(index, "x")
    assert isinstance(found, hardswish.HardSwishMatch) and found.shared(index) == ["c"]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("a = Add (x, three)\n c = Clip (a, zero, five)\n m = Mul (x, c)\n h = Div (m, six)", "bounds"),
        ("a = Add (x, five)\n c = Clip (a, zero, six)\n m = Mul (x, c)\n h = Div (m, six)", "add 3"),
        ("a = Add (x, three)\n c = Clip (a, zero, six)\n m = Mul (x, c)\n h = Div (m, five)", "divided by 6"),
        ("s = HardSigmoid <alpha=0.2, beta=0.5> (x)\n h = Mul (x, s)", "alpha=0.2"),
    ],
)
def test_silent_on_near_miss(body: str, reason: str) -> None:
    index = index_of(body)
    assert isinstance(hardswish.match_from(index, "x"), NoMatch)
    anchor = next(n for n in index.nodes if n.op_type in ("Clip", "HardSigmoid"))
    miss = hardswish.match_at(index, anchor)
    assert isinstance(miss, NoMatch) and reason in miss.reason
