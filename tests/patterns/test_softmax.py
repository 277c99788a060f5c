"""patterns.softmax: Exp/ReduceSum/Div (plain, max-shifted, Reciprocal) match and compute Softmax;
a sum over other axes, a shift by a max over other axes, or a division by something else do not."""

from __future__ import annotations

import numpy as np
import onnx.parser
import pytest
from onnx.reference import ReferenceEvaluator

from builders import pattern_index
from quantscan.graph.index import GraphIndex
from quantscan.patterns import softmax
from quantscan.patterns.base import NoMatch

AXES = """
    ax = Constant <value = int64[1] {-1}> ()
    ax1 = Constant <value = int64[1] {1}> ()
    rs = Constant <value = int64[3] {2, 4, 1}> ()
"""
SPELLINGS = {
    "plain": "e = Exp (x)\n s = ReduceSum <keepdims = 1> (e, ax)\n h = Div (e, s)",
    "stable": "m = ReduceMax <axes = [-1], keepdims = 1> (x)\n d = Sub (x, m)\n e = Exp (d)\n"
              " s = ReduceSum <keepdims = 1> (e, ax)\n h = Div (e, s)",
    "reciprocal": "e = Exp (x)\n s = ReduceSum <keepdims = 1> (e, ax)\n r = Reciprocal (s)\n h = Mul (r, e)",
    "restored": "m0 = ReduceMax <axes = [-1], keepdims = 0> (x)\n m = Unsqueeze (m0, ax)\n d = Sub (x, m)\n"
                " e = Exp (d)\n s0 = ReduceSum <keepdims = 0> (e, ax)\n shp = Shape (x)\n s1 = Reshape (s0, rs)\n"
                " s = Expand (s1, shp)\n h = Div (e, s)",
}
OPS = {
    "plain": "Exp+ReduceSum+Div",
    "stable": "ReduceMax+Sub+Exp+ReduceSum+Div",
    "reciprocal": "Exp+ReduceSum+Reciprocal+Mul",
    "restored": "ReduceMax+Unsqueeze+Sub+Exp+ReduceSum+Reshape+Expand+Div",
}


def index_of(body: str) -> GraphIndex:
    return pattern_index(body, consts=AXES, inputs="float[2,4,8] x", output="float[2,4,8] y", opset=13)


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_fires_on_each_spelling(spelling: str) -> None:
    index = index_of(SPELLINGS[spelling])
    found = softmax.match_from(index, "x")
    assert isinstance(found, softmax.SoftmaxMatch), found
    assert found.x == "x" and found.output == "h" and found.axes == (-1,)
    assert found.op_types() == OPS[spelling] and found.stable == (spelling in ("stable", "restored"))
    assert not found.shared(index)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (SPELLINGS["plain"].replace("(e, ax)", "(x, ax)"), "not summed"),  # sum of x, not of exp(x)
        (SPELLINGS["plain"].replace("h = Div (e, s)", "h = Div (s, e)"), "not divided"),
        (SPELLINGS["plain"].replace("h = Div (e, s)", "h = Mul (e, s)"), "not divided"),
        (SPELLINGS["plain"].replace("<keepdims = 1> (e, ax)", "<keepdims = 0> (e, ax)"), "keepdims"),
        (SPELLINGS["restored"].replace("s1 = Reshape (s0, rs)", "s1 = Identity (s0)"), "restoring"),
    ],
)
def test_silent_on_near_miss(body: str, reason: str) -> None:
    index = index_of(body)
    assert isinstance(softmax.match_from(index, "x"), NoMatch)
    exp = next(n for n in index.nodes if n.op_type == "Exp")
    miss = softmax.match_at(index, exp)
    assert isinstance(miss, NoMatch) and reason in miss.reason, miss


def test_a_max_over_other_axes_is_not_the_stable_shift() -> None:
    """ReduceMax over axis 1 then a sum over -1 is not the stable form: only Exp/ReduceSum/Div is the
    softmax (of x - m), and its input is the Sub's output, not x."""
    body = SPELLINGS["stable"].replace("ReduceMax <axes = [-1], keepdims = 1>", "ReduceMax <axes = [1], keepdims = 1>")
    index = index_of(body)
    assert isinstance(softmax.match_from(index, "x"), NoMatch)
    found = softmax.match_from(index, "d")
    assert isinstance(found, softmax.SoftmaxMatch) and not found.stable and found.op_types() == OPS["plain"]


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_each_spelling_computes_softmax(spelling: str) -> None:
    """Oracle: onnx's reference Softmax on the same input (inputs large enough that the plain form's
    lack of a shift would not matter in float32, but the numbers are not trivial)."""
    x = np.random.default_rng(0).normal(0, 4, (2, 4, 8)).astype(np.float32)

    def run(body: str) -> np.ndarray:
        model = onnx.parser.parse_model(
            f"""<ir_version: 8, opset_import: ["" : 13]>
            g (float[2,4,8] x) => (float[2,4,8] h) {{
                {AXES}
                {body}
            }}"""
        )
        return ReferenceEvaluator(model).run(None, {"x": x})[0]  # type: ignore[no-any-return]

    want = run("h = Softmax <axis = -1> (x)")
    np.testing.assert_allclose(run(SPELLINGS[spelling]), want, rtol=1e-5, atol=1e-7)
