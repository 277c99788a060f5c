"""Analysis sessions (below ORT_ENABLE_ALL) must compute the fake-quant graph exactly as built.

onnxruntime's transformers would otherwise re-quantize float weights behind a DequantizeLinear
(WeightBiasQuantization) or copy a shared DequantizeLinear per reader (the QDQ transformers that
runner.FAKE_QUANT_SESSION_CONFIG turns off). The oracle is onnx's reference evaluator.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from builders import evaluator, rng_array
from quantscan.runner import Runner


def _shared_dequantize_into_two_convs() -> onnx.ModelProto:
    """x -> Q -> DQ, read by two Convs with float weights off any int8 grid and by a MaxPool; the first
    Conv's output fake-quantized again, the node unit WeightBiasQuantization looks for."""
    weights = {
        "scale": np.array(0.02, np.float32),
        "zero": np.array(0, np.int8),
        "w1": rng_array((4, 3, 3, 3), seed=1),
        "b1": rng_array((4,), seed=2),
        "w2": rng_array((4, 3, 1, 1), seed=3, low=-3.0, high=3.0),
    }
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["xq"], name="q"),
        helper.make_node("DequantizeLinear", ["xq", "scale", "zero"], ["xdq"], name="dq"),
        helper.make_node("Conv", ["xdq", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c1", "scale", "zero"], ["c1q"], name="q1"),
        helper.make_node("DequantizeLinear", ["c1q", "scale", "zero"], ["y1"], name="dq1"),
        helper.make_node("Conv", ["xdq", "w2"], ["y2"], name="conv2"),
        helper.make_node("MaxPool", ["xdq"], ["y3"], name="pool", kernel_shape=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes, "shared_dq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("y1", "y2", "y3")],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def test_an_analysis_session_computes_the_fake_quant_graph_as_built() -> None:
    model = _shared_dequantize_into_two_convs()
    feeds = {"x": rng_array((1, 3, 8, 8), seed=4, low=-2.0, high=2.0)}
    expected = evaluator(model).run(None, feeds)
    for level in ("basic", "extended"):
        runner = Runner(threads=1, opt_level=level)
        got = runner.session(model, built=True).run(feeds)
        for name, want in zip(("y1", "y2", "y3"), expected, strict=True):
            np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5, err_msg=f"{name} at {level}")
