"""Already-quantized models are named as such by every command (issue 26): the op list is the oracle."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from quantscan.errors import ModelError
from quantscan.model import ensure_not_quantized


def _one_node(op_type: str, domain: str) -> onnx.ModelProto:
    node = helper.make_node(op_type, ["x"], ["y"], domain=domain)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
    return helper.make_model(graph)


@pytest.mark.parametrize("op_type, domain", [
    ("QuantizeLinear", ""), ("MatMulInteger", ""), ("DynamicQuantizeLSTM", "com.microsoft"),
    ("MatMulNBits", "com.microsoft"), ("QLinearReduceMean", "com.microsoft"),
])
def test_quantized_ops_are_refused_with_their_name(op_type: str, domain: str) -> None:
    with pytest.raises(ModelError, match=f"expected a float model, found an already-quantized one \\({op_type} in m"):
        ensure_not_quantized(_one_node(op_type, domain), "m.onnx")


@pytest.mark.parametrize("op_type", ["Conv", "LSTM", "MatMul", "Quantile"])
def test_float_ops_pass(op_type: str) -> None:
    ensure_not_quantized(_one_node(op_type, ""), "m.onnx")
