"""Reshape targets pinned to static shapes (graph/static_reshape.py), the fix that lets tpu-mlir 1.30.2 convert
PP-OCRv4 rec: a target computed by Shape -> Gather -> Concat with a 0 ("copy this dim") becomes a constant.
Oracle: onnx's ReferenceEvaluator runs the original and the pinned model; same outputs, and each new
constant is the shape the original Reshape produced."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from quantscan.graph.static_reshape import pin_reshape_shapes, reshape_outputs, with_outputs

COMPUTED = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[N, T, 6] x) => (float[N, T, 2, 3] y) {
    s = Shape(x)
    i1 = Constant<value = int64[1] {1}>()
    t = Gather<axis = 0>(s, i1)
    zero = Constant<value = int64[1] {0}>()
    tail = Constant<value = int64[2] {2, 3}>()
    target = Concat<axis = 0>(zero, t, tail)
    r = Reshape(x, target)
    y = Relu(r)
}
"""


def test_pinned_targets_are_the_shapes_produced_and_outputs_do_not_move() -> None:
    model = onnx.parser.parse_model(COMPUTED)
    x = np.random.default_rng(0).normal(size=(1, 5, 6)).astype(np.float32)
    names = reshape_outputs(model)
    assert names == ["r"]
    shapes = {n: v.shape for n, v in zip(names, ReferenceEvaluator(with_outputs(model, names)).run(names, {"x": x}),
                                          strict=True)}
    pinned, count = pin_reshape_shapes(model, shapes)
    assert count == 1 and model.graph.node[-2].input[1] == "target"  # the caller's model is not edited
    node = next(n for n in pinned.graph.node if n.op_type == "Reshape")
    constant = next(i for i in pinned.graph.initializer if i.name == node.input[1])
    assert numpy_helper.to_array(constant).tolist() == [1, 5, 2, 3]  # no 0, no -1: the produced shape
    onnx.checker.check_model(pinned)
    before = ReferenceEvaluator(model).run(None, {"x": x})[0]
    after = ReferenceEvaluator(pinned).run(None, {"x": x})[0]
    np.testing.assert_array_equal(before, after)


def test_reshapes_not_probed_are_left_alone() -> None:
    model = onnx.parser.parse_model(COMPUTED)
    pinned, count = pin_reshape_shapes(model, {})
    assert count == 0 and pinned.graph.node[-2].input[1] == "target"
