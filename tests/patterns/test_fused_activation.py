"""patterns.fused_activation: a producer absorbs a listed activation or a private SiLU/HardSwish, and
nothing when the output is shared, is a graph output, or the activation is not on the profile's list."""

from __future__ import annotations

import onnx
import onnx.parser

from quantscan.graph.index import GraphIndex
from quantscan.patterns import fused_activation
from quantscan.patterns.base import Match, NoMatch

ALL = frozenset({"Relu", "SiLU", "HardSwish"})


def index_of(body: str, outputs: str = "float[4,16] y") -> GraphIndex:
    model = onnx.parser.parse_model(
        f"""<ir_version: 8, opset_import: ["" : 14]>
        g (float[4,16] x) => ({outputs}) {{
            three = Constant <value = float {{3.0}}> ()
            zero = Constant <value = float {{0.0}}> ()
            six = Constant <value = float {{6.0}}> ()
            t = Neg (x)
            {body}
        }}"""
    )
    return GraphIndex.of(model)


def test_listed_single_op_fuses() -> None:
    found = fused_activation.match(index_of("y = Relu (t)"), "t", ALL)
    assert isinstance(found, Match) and found.kernel == "Relu" and found.output == "y"


def test_unlisted_op_does_not_fuse() -> None:
    miss = fused_activation.match(index_of("y = Relu (t)"), "t", frozenset({"Clip"}))
    assert isinstance(miss, NoMatch)


def test_silu_fuses_when_listed_as_silu_or_swish() -> None:
    index = index_of("s = Sigmoid (t)\n y = Mul (t, s)")
    for names in (frozenset({"SiLU"}), frozenset({"Swish"})):
        found = fused_activation.match(index, "t", names)
        assert isinstance(found, Match) and found.kernel == "SiLU" and found.output == "y"
    assert isinstance(fused_activation.match(index, "t", frozenset({"Sigmoid"})), NoMatch)


def test_decomposed_hardswish_fuses() -> None:
    index = index_of("a = Add (t, three)\n c = Clip (a, zero, six)\n m = Mul (t, c)\n y = Div (m, six)")
    found = fused_activation.match(index, "t", ALL)
    assert isinstance(found, Match) and found.kernel == "HardSwish" and found.op_types() == "Add+Clip+Mul+Div"


def test_shared_or_output_producer_does_not_fuse() -> None:
    shared = index_of("r = Relu (t)\n y = Add (r, t)")
    assert isinstance(fused_activation.match(shared, "t", ALL), NoMatch)
    as_output = index_of("y = Relu (t)", outputs="float[4,16] y, float[4,16] t")
    assert "graph output" in fused_activation.match(as_output, "t", ALL).reason  # type: ignore[union-attr]


def test_pattern_with_a_shared_intermediate_does_not_fuse() -> None:
    index = index_of("s = Sigmoid (t)\n m = Mul (t, s)\n y = Add (m, s)")
    assert isinstance(fused_activation.decomposed("SiLU", index, "t"), NoMatch)
