"""Rule `weights`: NaN constants, and ±inf read as a weight, are an error naming the tensor; a −inf
identity feeding Max (jax2tf, magika) is a warning; finite ones stay silent."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper, parser

from quantscan.compat.check import check

CONV = "g (float[1,3,8,8] x) => (float[1,4,8,8] y) { y = Conv<pads=[1,1,1,1]>(x, w) }"


def conv(weight: np.ndarray) -> onnx.ModelProto:
    m = parser.parse_model(f'<ir_version: 8, opset_import: ["" : 13]>\n{CONV}')
    m.graph.initializer.append(numpy_helper.from_array(weight.astype(np.float32), "w"))
    return m


def test_nan_and_inf_weights_are_an_error_naming_the_tensor() -> None:
    w = np.ones((4, 3, 3, 3), np.float32)
    w[0, 0, 0, 0], w[1, 0, 0, 0] = np.nan, np.inf
    result = check(conv(w), ["generic-npu"])
    rows = result.findings[result.findings["rule"] == "weights"]
    assert len(rows) == 1
    row = rows.iloc[0]
    assert row["severity"] == "error" and row["op_type"] == "Conv"
    assert row["value"] == "2 non-finite of 108"
    assert "constant 'w' holds 2 NaN/Inf" in str(result.details.loc[rows.index[0], "reason"])


def test_finite_weights_stay_silent() -> None:
    found = check(conv(np.ones((4, 3, 3, 3), np.float32)), ["generic-npu"]).findings
    assert (found["rule"] == "weights").sum() == 0


def test_a_minus_inf_identity_is_a_warning_not_an_error() -> None:
    """jax2tf's Max(ReduceMax(x), -inf): the model is valid (the scan accepts it), so the check says so."""
    m = parser.parse_model('<ir_version: 8, opset_import: ["" : 13]>\n'
                           "g (float[2,5] x) => (float[2] y) { r = ReduceMax <axes = [1], keepdims = 0> (x)\n"
                           " y = Max (r, neginf) }")
    m.graph.initializer.append(numpy_helper.from_array(np.array(-np.inf, np.float32), "neginf"))
    found = check(m, ["generic-npu"]).findings
    rows = found[found["rule"] == "weights"]
    assert list(rows["severity"]) == ["warn"] and list(rows["op_type"]) == ["Max"]
    assert "re-export" not in str(rows.iloc[0]["fix"])
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.array(np.nan, np.float32), "neginf"))
    found = check(m, ["generic-npu"]).findings
    assert list(found.loc[found["rule"] == "weights", "severity"]) == ["error"]
