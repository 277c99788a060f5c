"""Byte counts and size findings without guesses: a tensor whose size rests on a dim nobody gave is
"unknown", not a count at 224; the batch limit is not applied to a recurrent state's layer axis."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import parser

from quantscan.compat.check import check

MODEL = """<ir_version: 8, opset_import: ["" : 13]>
g (float[1,3,H,W] x) => (float[1,3,1,1] y) {
    two = Constant <value = float {2.0}> ()
    a = Relu (x)
    b = Pow (a, two)
    c = Relu (b)
    d = GlobalAveragePool (c)
    y = Pow (d, two)
}"""


def _crossing(model: onnx.ModelProto, **kw: object) -> tuple[int, int]:
    parts = check(model, ["horizon-x3"], **kw).partitions  # type: ignore[arg-type]
    return int(parts["bytes_in"].sum()), int(parts["bytes_unknown"].sum())


def test_sizes_resting_on_an_unsized_dim_are_unknown_not_224() -> None:
    """horizon-x3 runs Pow on the CPU: a [1,3,H,W] tensor crosses twice and a [1,3,1,1] one once."""
    model = parser.parse_model(MODEL)
    counted, unknown = _crossing(model)
    assert counted == 3 * 4  # only the pooled [1,3,1,1] float32: its size needs no H or W
    assert unknown == 2
    counted, unknown = _crossing(model, input_shapes={"x": [1, 3, 32, 40]})
    assert counted == 2 * 3 * 32 * 40 * 4 + 3 * 4 and unknown == 0  # numpy-free arithmetic: C*H*W*4 bytes


LSTM_STATE = """<ir_version: 8, opset_import: ["" : 13]>
g (float[5,1,4] x, float[2,1,8] state) => (float[5,1,8] y, float[2,1,8] stateN) {
    h = Gather <axis = 0> (state, zero)
    h1 = Unsqueeze (h, zero1)
    seq = LSTM <hidden_size = 8> (x, w, r, , , h1)
    y = Squeeze (seq, one1)
    stateN = Concat <axis = 0> (h1, h1)
}"""


def test_a_recurrent_state_layer_axis_is_not_a_batch() -> None:
    model = parser.parse_model(LSTM_STATE)
    rng = np.random.default_rng(0)
    for name, value in {"w": rng.normal(size=(1, 32, 4)), "r": rng.normal(size=(1, 32, 8))}.items():
        model.graph.initializer.append(onnx.numpy_helper.from_array(value.astype(np.float32), name))
    for name, value in {"zero": np.array(0), "zero1": np.array([0]), "one1": np.array([1])}.items():
        model.graph.initializer.append(onnx.numpy_helper.from_array(value.astype(np.int64), name))
    found = check(model, ["rk3588"]).findings
    assert found[found["attribute"] == "batch"].empty, found[found["attribute"] == "batch"]


@pytest.mark.real
def test_silero_has_no_batch_finding_on_its_state(assets: Path) -> None:
    found = check(assets / "models" / "silero_vad_openvino_16k.onnx", ["rk3588", "rk3568"]).findings
    assert found[found["attribute"] == "batch"].empty


AREA_ATTENTION = """<ir_version: 8, opset_import: ["" : 13]>
g (float[1,8,4,4] x) => (float[4,2,16] y) {
    areas = Constant <value = int64[3] {4, 2, 16}> ()
    r = Reshape (x, areas)
    y = Softmax <axis = -1> (r)
}"""
PER_SAMPLE = """<ir_version: 8, opset_import: ["" : 13]>
g (float[N,8,16] x) => (float[N,8,16] y) {
    y = Softmax <axis = -1> (x)
}"""


def test_a_batch_built_inside_the_graph_names_no_fix_dim() -> None:
    """YOLOv12's area attention folds 4 areas into axis 0 of a batch-1 model: rk3588's batch limit on
    Slice/Softmax fires, and `fix-dim batch=1` would change nothing. Oracle: the fix-dim rewrite itself
    (no change on that model; a change where the batch is a symbolic input's, which keeps the fix)."""
    from quantscan.rewrites.fix_dim import fix_dim

    inner = parser.parse_model(AREA_ATTENTION)
    records = [r for r in check(inner, ["rk3588"]).records if r.attribute == "batch"]
    assert [r.value for r in records] == ["4"] and not fix_dim(inner, ["batch=1"]).changes
    assert records[0].rewrite is None and "CPU" in records[0].fix
    outer = parser.parse_model(PER_SAMPLE)
    found = check(outer, ["rk3588"], input_shapes={"x": [2, 8, 16]}).findings
    batch = found[(found["attribute"] == "batch") & (found["rule"] == "param-limit")]
    assert batch["fix"].tolist() == ["fix-dim batch=1"] and fix_dim(outer, ["batch=1"]).changes
    static = parser.parse_model(PER_SAMPLE.replace("N,8,16", "2,8,16"))  # batch 2 written in the file
    found = check(static, ["rk3588"]).findings
    fixes = set(found[found["attribute"] == "batch"]["fix"])
    assert fixes and all(f.startswith("re-export the model with batch 1") for f in fixes)
    assert not fix_dim(static, ["batch=1"]).changes
