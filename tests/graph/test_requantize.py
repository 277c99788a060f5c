"""Which tensors RKNN requantizes after a float region, and the parts of a Conv it splits (graph/requantize.py).

Oracle: the graph written out by hand; what RKNN does with such graphs is checked on its recorded PicoDet
run in tests/toolchains/test_rknn_names.py.
"""

from __future__ import annotations

from quantscan.graph.requantize import NodeInfo, float_tails, split_parts

HEAD: dict[str, NodeInfo] = {
    # PicoDet's head, shape for shape: conv -> channel Split -> (Sigmoid -> Reshape -> Transpose) and
    # (Reshape -> Transpose), both Transposes graph outputs; the Reshape shapes come from Constant nodes
    "Conv.0": ("Conv", ["h", "w"], ["c"]),
    "Split.0": ("Split", ["c", "sizes"], ["s0", "s1"]),
    "Sigmoid.0": ("Sigmoid", ["s0"], ["g"]),
    "Const.0": ("Constant", [], ["shape0"]),
    "Reshape.0": ("Reshape", ["g", "shape0"], ["r0"]),
    "Transpose.0": ("Transpose", ["r0"], ["t0"]),
    "Const.1": ("Constant", [], ["shape1"]),
    "Reshape.1": ("Reshape", ["s1", "shape1"], ["r1"]),
    "Transpose.1": ("Transpose", ["r1"], ["t1"]),
}
OPS = frozenset({"Reshape", "Transpose", "Concat"})


def test_a_conv_read_only_by_a_split_is_named_by_its_parts() -> None:
    assert split_parts("c", HEAD) == ("s0", "s1")
    assert split_parts("g", HEAD) == ()  # a Sigmoid's output: no split Conv
    shared = {**HEAD, "Relu.9": ("Relu", ["c"], ["z"])}
    assert split_parts("c", shared) == ()  # the Conv's output is read elsewhere too: RKNN keeps it whole


def test_float_tails_follow_reshape_and_transpose_to_the_outputs() -> None:
    tails = float_tails(["g", "s0", "s1"], HEAD, OPS)
    assert tails == {"g": ("r0", "t0"), "s1": ("r1", "t1")}
    assert float_tails(["g"], HEAD, frozenset()) == {}  # a profile that records none


def test_a_concat_with_an_int8_input_is_no_tail() -> None:
    graph = {**HEAD, "Concat.0": ("Concat", ["t0", "t1"], ["cat"])}
    assert float_tails(["g", "s1"], graph, OPS) == {"g": ("r0", "t0", "cat"), "s1": ("r1", "t1")}
    # s1 int8: the Concat mixes a float and an int8 input, the chip quantizes it as any int8 layer
    assert float_tails(["g"], graph, OPS) == {"g": ("r0", "t0")}


def test_a_tail_stops_at_the_next_site() -> None:
    graph = {**HEAD, "Conv.1": ("Conv", ["t0", "w1"], ["y"]), "Reshape.2": ("Reshape", ["y", "shape0"], ["ry"])}
    assert float_tails(["g"], graph, OPS) == {"g": ("r0", "t0")}  # Conv.1 quantizes its input itself
