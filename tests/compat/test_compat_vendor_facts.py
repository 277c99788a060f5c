"""Compat facts learned from recorded vendor runs (tests/fixtures/vendor/): rule `float16` (a profile's
`[float16] ops` become info findings, and the int8 `precision` warning for the same node is not
repeated), and pooling limits that only bite where the attribute changes the result."""

from __future__ import annotations

import numpy as np
import onnx

from builders import build, run
from quantscan.compat.check import check
from quantscan.toolchains import align

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
    assert align.predicted_placements(rows)[row["node"]] == "npu-float16"


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


FOCUS = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 3, 8, 8] x) => (float[1, 3, 4, 8] y) {
  y = Slice(x, starts, ends, axes, steps)
}
"""


def _focus_slice(step: int) -> onnx.ModelProto:
    consts = {"starts": np.array([0], np.int64), "ends": np.array([8], np.int64), "axes": np.array([2], np.int64),
              "steps": np.array([step], np.int64)}
    text = FOCUS if step == 2 else FOCUS.replace("float[1, 3, 4, 8] y", "float[1, 3, 8, 8] y")
    return build(text, consts)


def test_rk3588_puts_strided_slices_on_the_cpu() -> None:
    """A YOLOX Focus Slice (step 2, the row grid every other pixel: numpy's x[:, :, ::2]) is a CPU
    placement on rk3588; the same Slice with step 1 stays on the NPU."""
    x = np.arange(192, dtype=np.float32).reshape(1, 3, 8, 8)
    np.testing.assert_array_equal(run(_focus_slice(2), {"x": x})[0], x[:, :, ::2])
    rows = check(_focus_slice(2), ["rk3588"]).findings
    step = rows[rows["attribute"] == "slice_step"]
    assert list(step["value"]) == ["[2]"] and list(step["placement"]) == ["cpu"]
    assert "slice_step" not in set(check(_focus_slice(1), ["rk3588"]).findings["attribute"])


FLATTEN = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 6, H, W] x) => (float[1, 6, HW] y) {
  y = Reshape(x, shape)
}
"""


def _flatten(h: int, w: int) -> onnx.ModelProto:
    text = FLATTEN.replace("HW", str(h * w)).replace("H", str(h)).replace("W", str(w))
    return build(text, {"shape": np.array([1, 6, -1], np.int64)})


def test_rk3588_places_a_plane_flattening_reshape_by_its_row_length() -> None:
    """ddddocr's recorded run: (1,6,26,26) -> (1,6,676) on the CPU, (1,6,52,52) -> (1,6,2704) on the
    NPU; the row 676 is not a multiple of 16, 2704 is. A Reshape keeping the innermost dim is not
    concerned (no parameter)."""
    for h, cpu in ((26, True), (52, False)):
        rows = check(_flatten(h, h), ["rk3588", "rk3568"]).findings
        rows = rows[rows["attribute"] == "merged_row_alignment"]
        assert len(rows) == (2 if cpu else 0)
        assert set(rows["placement"]) == ({"cpu"} if cpu else set())
    keep = build(FLATTEN.replace("float[1, 6, HW] y", "float[1, 156, 26] y").replace("H", "26").replace("W", "26"),
                 {"shape": np.array([1, -1, 26], np.int64)})
    assert "merged_row_alignment" not in set(check(keep, ["rk3588"]).findings["attribute"])
