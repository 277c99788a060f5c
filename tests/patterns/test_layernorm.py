"""patterns.layernorm: the arithmetic LayerNorm matches (Pow or Mul square, optional scale and bias,
axes as attribute or input); a different second mean or a missing epsilon does not."""

from __future__ import annotations

import onnx
import onnx.parser
import pytest

from builders import pattern_index
from quantscan.graph.index import GraphIndex
from quantscan.patterns import layernorm
from quantscan.patterns.base import NoMatch

LN = """
    m = ReduceMean <axes = [-1]> (x)
    d = Sub (x, m)
    p = {square}
    v = ReduceMean <axes = [{axes2}]> (p)
    ve = Add (v, eps)
    s = Sqrt (ve)
    n = Div (d, s)
"""


LN_CONSTS = f"""
    two = Constant <value = float {{2.0}}> ()
    eps = Constant <value = float {{1e-5}}> ()
    gamma = Constant <value = float[16] {{{",".join(["1.0"] * 16)}}}> ()
    beta = Constant <value = float[16] {{{",".join(["0.0"] * 16)}}}> ()
"""


def index_of(body: str, opset: int = 17) -> GraphIndex:
    return pattern_index(body, consts=LN_CONSTS, inputs="float[2,8,16] x", output="float[2,8,16] y", opset=opset)


@pytest.mark.parametrize("square", ["Pow (d, two)", "Mul (d, d)"])
def test_fires_with_scale_and_bias(square: str) -> None:
    index = index_of(LN.format(square=square, axes2="-1") + "sc = Mul (n, gamma)\n h = Add (sc, beta)")
    found = layernorm.match_from(index, "x")
    assert isinstance(found, layernorm.LayerNormMatch)
    assert len(found.nodes) == 9 and found.output == "h"
    assert found.axes == (-1,) and found.eps == pytest.approx(1e-5)
    assert (found.scale, found.bias) == ("gamma", "beta")
    assert not found.shared(index)


def test_fires_without_scale_and_with_axes_input() -> None:
    body = LN.replace("<axes = [-1]> (x)", "(x, ax)").replace("<axes = [{axes2}]> (p)", "(p, ax)")
    axes = "ax = Constant <value = int64[1] {-1}> ()\n"
    index = index_of(axes + body.format(square="Pow (d, two)") + "h = Identity (n)", 18)
    found = layernorm.match_from(index, "x")
    assert isinstance(found, layernorm.LayerNormMatch)
    assert found.output == "n" and found.scale is None and found.axes == (-1,)


def test_silent_when_second_mean_has_other_axes() -> None:
    index = index_of(LN.format(square="Pow (d, two)", axes2="1") + "h = Identity (n)")
    miss = layernorm.match_from(index, "x")
    assert isinstance(miss, NoMatch)
    first = layernorm.match_at(index, index.nodes[index.producer["m"]])
    assert isinstance(first, NoMatch) and "same axes" in first.reason


def test_silent_without_epsilon() -> None:
    body = LN.format(square="Pow (d, two)", axes2="-1").replace("ve = Add (v, eps)", "ve = Add (v, v)")
    index = index_of(body + "h = Identity (n)")
    first = layernorm.match_at(index, index.nodes[index.producer["m"]])
    assert isinstance(first, NoMatch) and "epsilon" in first.reason


EXTRA = """
    mhalf = Constant <value = float {-0.5}> ()
    one = Constant <value = float {1.0}> ()
"""
INVERSE_SPELLINGS = {
    "reciprocal": "r = Reciprocal (s)\n n = Mul (d, r)",
    "one over sqrt": "r = Div (one, s)\n n = Mul (d, r)",
    "reciprocal, operands swapped": "r = Reciprocal (s)\n n = Mul (r, d)",
    "pow -0.5": "r = Pow (ve, mhalf)\n n = Mul (d, r)",
}


@pytest.mark.parametrize("spelling", sorted(INVERSE_SPELLINGS))
def test_fires_on_each_spelling_of_the_division(spelling: str) -> None:
    body = LN.format(square="Pow (d, two)", axes2="-1").replace("n = Div (d, s)", INVERSE_SPELLINGS[spelling])
    index = index_of(EXTRA + body + "h = Identity (n)")
    found = layernorm.match_from(index, "x")
    assert isinstance(found, layernorm.LayerNormMatch), found
    assert found.output == "n"
    ops = [n.op_type for n in found.nodes]
    assert ops[-1] == "Mul" and ops[:5] == ["ReduceMean", "Sub", "Pow", "ReduceMean", "Add"]


def test_numerics_of_the_spellings_agree_with_layernormalization() -> None:
    """The spellings the pattern accepts compute LayerNormalization (onnx's reference evaluator as oracle)."""
    import numpy as np
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(0).normal(size=(2, 8, 16)).astype(np.float32)
    ones = ",".join(["1.0"] * 16)
    ln = onnx.parser.parse_model(
        f"""<ir_version: 8, opset_import: ["" : 17]>
        g (float[2,8,16] x) => (float[2,8,16] y) {{
            gamma = Constant <value = float[16] {{{ones}}}> ()
            y = LayerNormalization <axis = -1, epsilon = 1e-5> (x, gamma)
        }}"""
    )
    want = ReferenceEvaluator(ln).run(None, {"x": x})[0]
    for spelling, division in INVERSE_SPELLINGS.items():
        body = LN.format(square="Pow (d, two)", axes2="-1").replace("n = Div (d, s)", division)
        model = onnx.parser.parse_model(
            f"""<ir_version: 8, opset_import: ["" : 17]>
            g (float[2,8,16] x) => (float[2,8,16] n) {{
                two = Constant <value = float {{2.0}}> ()
                eps = Constant <value = float {{1e-5}}> ()
                {EXTRA}
                {body}
            }}"""
        )
        got = ReferenceEvaluator(model).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=spelling)


def test_silent_when_multiplied_by_the_square_root() -> None:
    body = LN.format(square="Pow (d, two)", axes2="-1").replace("n = Div (d, s)", "n = Mul (d, s)")
    index = index_of(body + "h = Identity (n)")
    miss = layernorm.match_from(index, "x")
    assert isinstance(miss, NoMatch)


# --- the mean written as a MatMul by a constant 1/C matrix (TF / hand-written exports) -------------------


def mean_matrix(shape: tuple[int, int], value: float = 1 / 16) -> str:
    """`wm`, a Constant of `shape` filled with `value` (the mean over a 16-wide last axis when 1/16)."""
    values = ",".join([repr(value)] * (shape[0] * shape[1]))
    return f"wm = Constant <value = float[{shape[0]},{shape[1]}] {{{values}}}> ()\n"


def matmul_ln(shape: tuple[int, int], value: float = 1 / 16, division: str = "n = Div (d, s)") -> str:
    body = LN.format(square="Mul (d, d)", axes2="-1").replace(
        "m = ReduceMean <axes = [-1]> (x)", "m = MatMul (x, wm)"
    ).replace("v = ReduceMean <axes = [-1]> (p)", "v = MatMul (p, wm)")
    if "Pow (ve" in division:  # no Sqrt in this spelling (left in, it would read ve outside the kernel)
        body = body.replace("s = Sqrt (ve)", "")
    return mean_matrix(shape, value) + EXTRA + body.replace("n = Div (d, s)", division)


@pytest.mark.parametrize("shape", [(16, 1), (16, 16)])
@pytest.mark.parametrize("division", ["n = Div (d, s)", *INVERSE_SPELLINGS.values()])
def test_fires_with_the_mean_as_a_matmul(shape: tuple[int, int], division: str) -> None:
    index = index_of(matmul_ln(shape, division=division) + "sc = Mul (n, gamma)\n h = Add (sc, beta)")
    found = layernorm.match_from(index, "x")
    assert isinstance(found, layernorm.LayerNormMatch), found
    assert found.output == "h" and found.axes == (-1,) and (found.scale, found.bias) == ("gamma", "beta")
    assert [n.op_type for n in found.nodes][:4] == ["MatMul", "Sub", "Mul", "MatMul"]
    assert not found.shared(index)


@pytest.mark.parametrize(
    ("shape", "value"),
    [((16, 1), 1 / 15), ((16, 16), 1 / 32), ((16, 2), 1 / 16)],
    ids=["1/15", "1/32 square", "two columns"],
)
def test_silent_when_the_matmul_is_not_a_mean(shape: tuple[int, int], value: float) -> None:
    index = index_of(matmul_ln(shape, value) + "h = Identity (n)")
    assert isinstance(layernorm.match_from(index, "x"), NoMatch)
    assert layernorm.mean_axes(index.nodes[index.producer["m"]], index) is None


@pytest.mark.parametrize("shape", [(16, 1), (16, 16)])
def test_the_matmul_mean_computes_layernormalization(shape: tuple[int, int]) -> None:
    """Oracle: onnx's reference LayerNormalization, every division spelling with the MatMul mean."""
    import numpy as np
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(1).normal(1.0, 3.0, size=(2, 8, 16)).astype(np.float32)
    ones = ",".join(["1.0"] * 16)

    def run(body: str) -> np.ndarray:
        model = onnx.parser.parse_model(
            f"""<ir_version: 8, opset_import: ["" : 17]>
            g (float[2,8,16] x) => (float[2,8,16] n) {{
                two = Constant <value = float {{2.0}}> ()
                eps = Constant <value = float {{1e-5}}> ()
                gamma = Constant <value = float[16] {{{ones}}}> ()
                {body}
            }}"""
        )
        return ReferenceEvaluator(model).run(None, {"x": x})[0]  # type: ignore[no-any-return]

    want = run("n = LayerNormalization <axis = -1, epsilon = 1e-5> (x, gamma)")
    for division in ["n = Div (d, s)", *INVERSE_SPELLINGS.values()]:
        np.testing.assert_allclose(run(matmul_ln(shape, division=division)), want, rtol=1e-4, atol=1e-4,
                                   err_msg=division)
