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


# --- tanh form: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) -----------------------------------------------

TANH_CONSTS = CONSTS + """
    three = Constant <value = float {3.0}> ()
    cubic = Constant <value = float {0.044715}> ()
    k = Constant <value = float {0.7978846}> ()
"""
CUBES = {
    "pow": "c = Pow (x, three)",
    "mul x·x·x": "x2 = Mul (x, x)\n c = Mul (x2, x)",
    "mul x·(x·x)": "x2 = Mul (x, x)\n c = Mul (x, x2)",
}
TANH_BODY = """
    {cube}
    kc = Mul ({cubic}, c)
    u = Add (x, kc)
    v = Mul (u, {k})
    t = Tanh (v)
    a = Add (t, one)
    {tail}
"""
TAILS = {
    "x·a·0.5": "m = Mul (x, a)\n h = Mul (m, half)",
    "(0.5·x)·a": "hx = Mul (half, x)\n h = Mul (hx, a)",
    "(a·0.5)·x": "m = Mul (a, half)\n h = Mul (m, x)",
}


def tanh_body(cube: str = "pow", tail: str = "x·a·0.5", cubic: str = "cubic", k: str = "k") -> str:
    return TANH_BODY.format(cube=CUBES[cube], tail=TAILS[tail], cubic=cubic, k=k)


def tanh_index(body: str) -> GraphIndex:
    return pattern_index(body, consts=TANH_CONSTS)


@pytest.mark.parametrize("cube", sorted(CUBES))
@pytest.mark.parametrize("tail", sorted(TAILS))
def test_tanh_form_fires_on_each_cube_and_tail(cube: str, tail: str) -> None:
    index = tanh_index(tanh_body(cube, tail))
    found = gelu.match_from(index, "x")
    assert isinstance(found, Match) and found.kernel == "GELU", found
    assert found.x == "x" and found.output == "h" and not found.shared(index)
    assert {"Tanh", "Add"} <= {n.op_type for n in found.nodes}
    assert len(found.nodes) == (8 if cube == "pow" else 9)


def test_tanh_form_constants_within_float32_rounding() -> None:
    # the float32 spellings exporters write: 0.7978845608 rounds to 0.79788456, 0.044715 to 0.044714998
    body = tanh_body().replace("{0.7978846}", "{0.79788456}")
    consts = TANH_CONSTS.replace("{0.7978846}", "{0.79788456}").replace("{0.044715}", "{0.044714998}")
    assert isinstance(gelu.match_from(pattern_index(body, consts=consts), "x"), Match)


@pytest.mark.parametrize(
    ("consts", "body", "reason"),
    [
        (TANH_CONSTS.replace("{0.044715}", "{0.04}"), tanh_body(), "0.044715"),  # wrong cubic coefficient
        (TANH_CONSTS.replace("{0.7978846}", "{0.8}"), tanh_body(), "√(2/π)"),  # wrong outer constant
        (TANH_CONSTS, tanh_body().replace("Pow (x, three)", "Pow (x, two)"), "0.044715"),  # x² not x³
        (TANH_CONSTS, tanh_body().replace("a = Add (t, one)", "a = Add (t, half)"), "1 is not"),
        (TANH_CONSTS, tanh_body().replace("h = Mul (m, half)", "h = Mul (m, two)"), "0.5"),
    ],
)
def test_tanh_form_silent_on_near_miss(consts: str, body: str, reason: str) -> None:
    index = pattern_index(body, consts=consts)
    assert isinstance(gelu.match_from(index, "x"), NoMatch)
    miss = gelu.match_tanh_at(index, next(n for n in index.nodes if n.op_type == "Tanh"))
    assert isinstance(miss, NoMatch) and reason in miss.reason, miss


def test_erf_only_match_at_leaves_the_tanh_form_alone() -> None:
    """The gelu-tanh rewrite asks `match_at`: a tanh GELU is already what it would write."""
    index = tanh_index(tanh_body())
    assert all(isinstance(gelu.match_at(index, n), NoMatch) for n in index.nodes)


@pytest.mark.parametrize("cube", sorted(CUBES))
@pytest.mark.parametrize("tail", sorted(TAILS))
def test_tanh_form_computes_the_tanh_gelu(cube: str, tail: str) -> None:
    """What the pattern accepts computes the formula (onnx's reference evaluator as the oracle), and that
    formula is GELU: within 1e-3 of the exact 0.5·x·(1 + erf(x/√2))."""
    import math

    import numpy as np
    import onnx.parser
    from onnx.reference import ReferenceEvaluator

    model = onnx.parser.parse_model(
        f"""<ir_version: 8, opset_import: ["" : 14]>
        g (float[4,16] x) => (float[4,16] h) {{
            {TANH_CONSTS}
            {tanh_body(cube, tail)}
        }}"""
    )
    x = np.random.default_rng(0).normal(0, 2, (4, 16)).astype(np.float32)
    got = ReferenceEvaluator(model).run(None, {"x": x})[0]
    xd = x.astype(np.float64)
    want = 0.5 * xd * (1 + np.tanh(math.sqrt(2 / math.pi) * (xd + 0.044715 * xd**3)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    exact = 0.5 * xd * (1 + np.vectorize(math.erf)(xd / math.sqrt(2)))
    assert np.abs(got - exact).max() < 1e-3
