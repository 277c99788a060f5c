"""patterns.layernorm: the arithmetic LayerNorm matches (Pow or Mul square, optional scale and bias,
axes as attribute or input); a different second mean or a missing epsilon does not."""

from __future__ import annotations

import onnx
import onnx.parser
import pytest

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


def index_of(body: str, opset: int = 17) -> GraphIndex:
    model = onnx.parser.parse_model(
        f"""<ir_version: 8, opset_import: ["" : {opset}]>
        g (float[2,8,16] x) => (float[2,8,16] y) {{
            two = Constant <value = float {{2.0}}> ()
            eps = Constant <value = float {{1e-5}}> ()
            gamma = Constant <value = float[16] {{{",".join(["1.0"] * 16)}}}> ()
            beta = Constant <value = float[16] {{{",".join(["0.0"] * 16)}}}> ()
            {body}
            y = Neg (h)
        }}"""
    )
    return GraphIndex.of(model)


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
