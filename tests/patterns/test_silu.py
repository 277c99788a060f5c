"""patterns.silu: x·sigmoid(x) and x·sigmoid(β·x) match; a Mul by another tensor does not."""

from __future__ import annotations

import onnx
import onnx.parser
import pytest

from quantscan.graph.index import GraphIndex
from quantscan.patterns import silu
from quantscan.patterns.base import Match, NoMatch


def index_of(body: str) -> GraphIndex:
    model = onnx.parser.parse_model(
        f"""<ir_version: 8, opset_import: ["" : 14]>
        g (float[4,16] x, float[4,16] w) => (float[4,16] y) {{
            beta = Constant <value = float {{1.702}}> ()
            {body}
            y = Neg (h)
        }}"""
    )
    return GraphIndex.of(model)


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
