"""freeze-input: the input becomes a constant, an If on it is replaced by the branch it takes, Shape/Where
fold; refusals and bad settings; the proof through the runner feeds the original the frozen value; on
the real silero-vad graph behind an If on `sr`, and on the If single-op case with its own expected output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from builders import build, if_wrapped, op_types, run
from conftest import asset_calib, asset_model
from quantscan.calib import load_calibration
from quantscan.errors import UsageError
from quantscan.model import graph_inputs
from quantscan.rewrites.freeze_input import freeze_input, parse_freeze_spec
from quantscan.rewrites.pipeline import rewrite
from quantscan.runner import Runner

X = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)

SR_IF = """<ir_version: 8, opset_import: ["" : 13]>
g (float[3,4] x, int64 sr) => (float[3,4] y) {
    rate = Constant <value = int64 {16000}> ()
    is16 = Equal (sr, rate)
    t = Relu (x)
    y = If (is16) <
        then_branch = g1 () => (float[3,4] a) { two = Constant <value = float {2.0}> ()  a = Mul (t, two) },
        else_branch = g2 () => (float[3,4] b) { u = Neg (x)  b = Sigmoid (u) }
    >
}"""

TWO_IFS = """<ir_version: 8, opset_import: ["" : 13]>
g (float[3,4] x, int64 sr) => (float[3,4] y) {
    rate = Constant <value = int64 {16000}> ()
    is16 = Equal (sr, rate)
    p = If (is16) <
        then_branch = g1 () => (float[3,4] a) { tmp = Relu (x)  a = Neg (tmp) },
        else_branch = g2 () => (float[3,4] b) { b = Identity (x) }
    >
    y = If (is16) <
        then_branch = g3 () => (float[3,4] c) { tmp = Sigmoid (p)  c = Neg (tmp) },
        else_branch = g4 () => (float[3,4] d) { d = Identity (p) }
    >
}"""


def test_if_on_the_frozen_input_becomes_the_taken_branch() -> None:
    m = build(SR_IF)
    for sr, expected in ((16000, 2 * np.maximum(X, 0)), (8000, 1 / (1 + np.exp(X)))):
        res = freeze_input(m, [f"sr={sr}"])
        onnx.checker.check_model(res.model, full_check=True)
        assert "If" not in op_types(res.model) and "Equal" not in op_types(res.model)
        assert [i.name for i in res.model.graph.input] == ["x"]
        # oracle: onnx.reference on the original fed the same sr, and the branch written out in numpy
        (want,) = run(m, {"x": X, "sr": np.array(sr, np.int64)})
        (got,) = run(res.model, {"x": X})
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert "If" in op_types(m)  # input untouched


def test_names_two_inlined_branches_share_are_made_unique() -> None:
    """Two sibling Ifs whose branches both define `tmp`: once both are inlined the names must not clash."""
    m = build(TWO_IFS)
    res = freeze_input(m, ["sr=16000"])
    onnx.checker.check_model(res.model, full_check=True)
    outputs = [o for n in res.model.graph.node for o in n.output]
    assert len(outputs) == len(set(outputs)) and "If" not in op_types(res.model)
    (got,) = run(res.model, {"x": X})
    np.testing.assert_allclose(got, -1 / (1 + np.exp(np.maximum(X, 0))), rtol=1e-6)  # -sigmoid(-relu(x))
    np.testing.assert_array_equal(got, run(m, {"x": X, "sr": np.array(16000, np.int64)})[0])


WHERE_SHAPE = """<ir_version: 8, opset_import: ["" : 13]>
g (float[3,4] x, bool flag) => (float[3,4] y) {
    a = Constant <value = float {2.0}> ()
    b = Constant <value = float {-1.0}> ()
    k = Where (flag, a, b)
    s = Shape (x)
    n = ReduceProd <keepdims = 0> (s)
    twelve = Constant <value = int64 {12}> ()
    full = Equal (n, twelve)
    y = If (full) <
        then_branch = g1 () => (float[3,4] p) { p = Mul (x, k) },
        else_branch = g2 () => (float[3,4] q) { q = Identity (x) }
    >
}"""


def test_where_and_a_shape_condition_fold_once_the_input_is_frozen() -> None:
    m = build(WHERE_SHAPE)
    res = freeze_input(m, ["flag=1"])
    assert set(op_types(res.model)) <= {"Mul", "Constant"}, op_types(res.model)
    (got,) = run(res.model, {"x": X})
    np.testing.assert_array_equal(got, run(m, {"x": X, "flag": np.array(True)})[0])


def test_bad_settings_are_usage_errors() -> None:
    m = build(SR_IF)
    with pytest.raises(UsageError, match="expected one of the inputs"):
        freeze_input(m, ["rate=1"])
    with pytest.raises(UsageError, match="NAME=NUMBER"):
        parse_freeze_spec("sr")
    with pytest.raises(UsageError, match="static shape"):
        freeze_input(build(SR_IF.replace("float[3,4] x,", "float[N,4] x,")), ["x=1"])
    with pytest.raises(UsageError, match="can hold"):
        freeze_input(m, ["sr=0.5"])


def test_a_loop_with_a_frozen_trip_count_is_refused_not_unrolled() -> None:
    body = helper.make_graph(
        [helper.make_node("Identity", ["c_in"], ["c_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1])],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "v0"], ["v"], name="Loop_0", body=body)], "g",
        [helper.make_tensor_value_info("n", TensorProto.INT64, []),
         helper.make_tensor_value_info("v0", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.array([1.0], np.float32), "one")],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    res = freeze_input(m, ["n=3"])
    assert [(r.node, "unrolling" in r.reason) for r in res.refusals] == [("Loop_0", True)]
    # onnxruntime as the oracle here: onnx.reference runs a Loop with an empty condition zero times
    v0 = np.array([1.0], np.float32)
    session = Runner()
    assert session.session(res.model).run({"v0": v0})["v"].tolist() == [4.0]
    assert session.session(m).run({"v0": v0, "n": np.array(3, np.int64)})["v"].tolist() == [4.0]


def test_runner_proves_the_frozen_model_against_the_original_fed_the_value() -> None:
    report = rewrite(build(SR_IF), [], freeze_input=["sr=16000"], write=False)
    assert report.passed and report.steps[0].rewrite == "freeze-input"
    assert "frozen inputs fed their value (sr)" in report.proof.data
    assert "If" not in report.op_counts_after


@pytest.mark.real
def test_silero_behind_an_if_on_sr_folds_to_the_16k_network(assets: Path) -> None:
    """silero-vad as its wheel ships it (If on `sr`), rebuilt from the asset's 16 kHz graph: freezing
    sr=16000 leaves the asset's own network (no If, no sr input), proven on the real audio windows."""
    original = onnx.load(asset_model(assets, "silero_vad_openvino_16k"))
    wrapped = if_wrapped(original)
    calib = load_calibration(asset_calib(assets, "silero_vad_openvino_16k"), graph_inputs(wrapped),
                             consts={"state": 0.0, "sr": 16000}, limit=16)
    report = rewrite(wrapped, [], freeze_input=["sr=16000"], calib=calib, write=False)
    assert report.passed, report.proof
    assert [i.name for i in report.model.graph.input] == ["input", "state"]
    assert report.op_counts_after.get("If", 0) == 0
    kernels = ("Conv", "LSTM", "Relu", "Sigmoid", "Pow", "Sqrt", "ReduceMean", "Add", "Pad")
    before = _op_counts(original)
    assert {op: report.op_counts_after.get(op) for op in kernels} == {op: before.get(op) for op in kernels}
    assert "Equal" not in report.op_counts_after
    assert all(o.max_abs == 0 for o in report.proof.outputs)  # the branch's own nodes: bit-identical


def _op_counts(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in model.graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


@pytest.mark.real
def test_if_case_frozen_gives_its_expected_output(assets: Path) -> None:
    """The onnx If test case: cond frozen to the value its test data feeds gives the output it expects."""
    case = assets / "ops" / "if"
    m = onnx.load(case / "model.onnx")
    cond = onnx.numpy_helper.to_array(onnx.load_tensor(case / "test_data_set_0" / "input_0.pb"))
    want = onnx.numpy_helper.to_array(onnx.load_tensor(case / "test_data_set_0" / "output_0.pb"))
    res = freeze_input(m, [f"cond={int(bool(cond))}"])
    assert "If" not in op_types(res.model) and not res.model.graph.input
    np.testing.assert_array_equal(run(res.model, {})[0], want)


@pytest.mark.real
def test_cli_freeze_input_with_the_calibration_set(assets: Path, tmp_path: Path) -> None:
    """`quantscan rewrite M --freeze-input sr=16000 --calib DIR`: the frozen input needs no data of its own."""
    import subprocess
    import sys

    path = tmp_path / "silero_if.onnx"
    onnx.save(if_wrapped(onnx.load(asset_model(assets, "silero_vad_openvino_16k"))), path)
    out = tmp_path / "silero_16k.onnx"
    proc = subprocess.run(
        [sys.executable, "-m", "quantscan", "rewrite", str(path), "--freeze-input", "sr=16000", "--calib",
         str(asset_calib(assets, "silero_vad_openvino_16k")), "--const", "state=0", "--limit", "8", "-o", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "freeze-input:" in proc.stdout and "FAILED" not in proc.stdout
    assert [i.name for i in onnx.load(out).graph.input] == ["input", "state"]
    bad = subprocess.run([sys.executable, "-m", "quantscan", "rewrite", str(path), "--freeze-input", "rate=1",
                          "-o", str(tmp_path / "x.onnx")], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and bad.stderr.startswith("quantscan: error: ")
