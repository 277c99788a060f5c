"""Compat facts learned from recorded vendor runs (tests/fixtures/vendor/): rule `float16` (a profile's
`[float16] ops` become info findings, and the int8 `precision` warning for the same node is not
repeated), and pooling limits that only bite where the attribute changes the result."""

from __future__ import annotations

import numpy as np
import onnx

from builders import build, run
from quantscan.compat.check import check
from quantscan.vendor import align

SOFTMAX = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 8] x) => (float[1, 4] y) {
  h = MatMul(x, w)
  y = Softmax<axis = 1>(h)
}
"""


def _model() -> onnx.ModelProto:
    return build(SOFTMAX, {"w": np.ones((8, 4), np.float32)})


def test_softmax_is_float16_on_rk3588_and_not_an_int8_precision_risk() -> None:
    rows = check(_model(), ["rk3588"]).findings
    rules = set(rows[rows["op_type"] == "Softmax"]["rule"])
    assert "float16" in rules and "precision" not in rules
    row = rows[rows["rule"] == "float16"].iloc[0]
    assert (row["value"], row["placement"], row["severity"]) == ("float16", "npu", "info")
    assert align.check_placements(rows)[row["node"]] == "npu-float16"


def test_profiles_without_float16_facts_keep_the_precision_finding() -> None:
    rows = check(_model(), ["generic-npu"]).findings
    assert "float16" not in set(rows["rule"]) and "precision" in set(rows[rows["op_type"] == "Softmax"]["rule"])


POOL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 4, 6, 6] x) => (float[1, 4, 2, 3] y) {
  y = AveragePool<kernel_shape = [3, 2], strides = [3, 2], pads = [PADS], count_include_pad = 0>(x)
}
"""


def test_count_include_pad_matters_only_where_the_window_pads() -> None:
    """Unpadded, count_include_pad 0 and 1 compute the same thing (reference oracle), so rk3588's
    count_include_pad limit does not apply; padded, it does."""
    unpadded = build(POOL.replace("PADS", "0, 0, 0, 0"))
    x = np.random.default_rng(0).normal(size=(1, 4, 6, 6)).astype(np.float32)
    other = build(POOL.replace("PADS", "0, 0, 0, 0").replace("count_include_pad = 0", "count_include_pad = 1"))
    np.testing.assert_array_equal(run(unpadded, {"x": x})[0], run(other, {"x": x})[0])
    rows = check(unpadded, ["rk3588"]).findings
    assert "count_include_pad" not in set(rows["attribute"])
    padded = build(POOL.replace("PADS", "1, 0, 1, 0").replace("float[1, 4, 2, 3] y", "float[1, 4, 2, 3] y"))
    rows = check(padded, ["rk3588"]).findings
    assert "count_include_pad" in set(rows["attribute"])
