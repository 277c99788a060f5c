"""cleanup: Identity/Dropout removal keeps downstream names, constant folding, refusals; vs onnx.reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from builders import assert_same_outputs, build, calib_images, op_types, rng_array
from conftest import asset_calib, asset_model
from quantscan.rewrites.cleanup import cleanup

H13 = '<ir_version: 8, opset_import: ["" : 13]>'
X = {"x": rng_array((2, 4))}


def test_identity_chain_removed_names_kept() -> None:
    m = build(H13 + "g (float[2,4] x) => (float[2,4] y) { a = Relu (x)\n b = Identity (a)\n y = Neg (b) }")
    res = cleanup(m)
    assert op_types(res.model) == ["Relu", "Neg"]
    assert list(res.model.graph.node[0].output) == ["b"]  # the producer now writes the downstream name
    assert "producer now writes 'b'" in res.changes[0].detail
    onnx.checker.check_model(res.model, full_check=True)
    assert_same_outputs(m, res.model, X)


def test_identity_on_shared_tensor_rewires_readers() -> None:
    m = build(
        H13 + "g (float[2,4] x) => (float[2,4] y, float[2,4] z) "
        "{ a = Relu (x)\n b = Identity (a)\n y = Neg (b)\n z = Abs (a) }"
    )
    res = cleanup(m)
    assert op_types(res.model) == ["Relu", "Neg", "Abs"]
    assert list(res.model.graph.node[1].input) == ["a"]
    assert_same_outputs(m, res.model, X)


def test_identity_between_graph_input_and_output_refused() -> None:
    m = build(H13 + "g (float[2,4] x) => (float[2,4] y) { y = Identity (x) }")
    res = cleanup(m)
    assert not res.changes and "graph output" in res.refusals[0].reason


def test_dropout_inference_removed_opset_10_and_13() -> None:
    m10 = build(
        '<ir_version: 8, opset_import: ["" : 10]>'
        "g (float[2,4] x) => (float[2,4] y) { d = Dropout <ratio=0.5> (x)\n y = Relu (d) }"
    )
    m13 = build(
        H13 + "g (float[2,4] x) => (float[2,4] y) { r = Constant <value = float {0.5}> ()\n"
        " t = Constant <value = bool {0}> ()\n d = Dropout (x, r, t)\n y = Relu (d) }"
    )
    for m in (m10, m13):
        res = cleanup(m)
        assert op_types(res.model) == ["Relu"], op_types(res.model)
        onnx.checker.check_model(res.model, full_check=True)
        assert_same_outputs(m, res.model, X)


def test_dropout_with_read_mask_refused() -> None:
    m = build(H13 + "g (float[2,4] x) => (float[2,4] y, bool[2,4] mk) { d, mk = Dropout (x)\n y = Relu (d) }")
    res = cleanup(m)
    assert op_types(res.model) == ["Dropout", "Relu"] and "mask" in res.refusals[0].reason


def test_constant_subgraph_folded_and_dead_nodes_dropped() -> None:
    m = build(
        H13
        + """g (float[2,4] x) => (float[2,4] y) {
            c = Constant <value = int64[4] {1, 2, 3, 4}> ()
            f = Cast <to = 1> (c)
            s = Mul (f, two)
            y = Add (x, s)
            dead = Sqrt (x)
        }""",
        {"two": np.array(2.0, np.float32)},
    )
    res = cleanup(m)
    assert op_types(res.model) == ["Add"]
    (init,) = res.model.graph.initializer
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(init), [2, 4, 6, 8])
    assert any("dead node" in c.detail for c in res.changes)
    onnx.checker.check_model(res.model, full_check=True)
    assert_same_outputs(m, res.model, X)


def test_dequantize_of_weights_is_not_folded() -> None:
    m = build(
        H13 + "g (float[2,4] x) => (float[2,4] y) { w = DequantizeLinear (q, sc)\n y = Mul (x, w) }",
        {"q": np.arange(4, dtype=np.int8), "sc": np.array(0.5, np.float32)},
    )
    assert op_types(cleanup(m).model) == ["DequantizeLinear", "Mul"]


@pytest.mark.real
def test_ppocr_cls(assets) -> None:  # type: ignore[no-untyped-def]
    model = onnx.load(asset_model(assets, "ppocr_mobile_v2_cls"))
    res = cleanup(model)
    assert "Identity" not in op_types(res.model) and not res.refusals
    onnx.checker.check_model(res.model, full_check=True)
    for x in calib_images(asset_calib(assets, "ppocr_mobile_v2_cls"), limit=2):
        assert_same_outputs(model, res.model, {"x": x})
