"""A scikit-learn GBDT (one ai.onnx.ml TreeEnsembleClassifier): the true reason, one severity everywhere.

The fixture `tests/fixtures/sklearn/iris_gbdt.onnx` is a GradientBoostingClassifier trained on sklearn's
iris data and exported by skl2onnx (`make_gbdt.py` beside it makes it again). Issue 40: `scan` refused it
with "nothing computes float tensors", which is false (it maps float features to float probabilities),
and `check` called its one op an error on rk3588 but a warning on horizon-x3. Oracles: onnxruntime runs
the file (float probabilities, rows summing to 1, argmax = the label output); the CLI's exit code and
its one stderr line; every shipped chip profile's finding for the op.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from quantscan.compat.check import check
from quantscan.compat.profiles import list_profiles
from quantscan.records import Severity

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sklearn"
GBDT = FIXTURES / "iris_gbdt.onnx"
CHIPS = [p.name for p in list_profiles() if p.name != "onnxruntime"]


def test_the_gbdt_computes_float_probabilities() -> None:
    """What the old message denied: float features in, float class probabilities out."""
    model = onnx.load(GBDT)
    assert [(n.domain, n.op_type) for n in model.graph.node if n.domain] == [("ai.onnx.ml", "TreeEnsembleClassifier")]
    x = np.load(FIXTURES / "iris_features.npy")
    session = ort.InferenceSession(str(GBDT), providers=["CPUExecutionProvider"])
    label, probabilities = session.run(["label", "probabilities"], {"X": x})
    assert probabilities.dtype == np.float32 and probabilities.shape == (150, 3)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    assert (probabilities.argmax(axis=1) == label).all()


def test_scan_names_the_ml_op_and_where_it_runs(tmp_path: Path) -> None:
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "X.npy", np.load(FIXTURES / "iris_features.npy"))
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "quantscan", "scan", str(GBDT), "--calib", str(calib),
                           "--out", str(out), "--quiet"], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantscan: error: expected "), done.stderr
    assert "ai.onnx.ml::TreeEnsembleClassifier" in lines[0] and "CPU" in lines[0]
    assert "nothing computes float tensors" not in lines[0]
    assert not out.exists()


def test_the_ml_op_is_an_error_placed_on_the_cpu_on_every_chip() -> None:
    """One severity per op across profiles, whatever a profile's policy for standard ops it does not list
    (horizon-x3's list is unverified, which caps those at warn; ethos-u leaves them to the CPU)."""
    assert {"rk3588", "horizon-x3", "ethos-u"} <= set(CHIPS)
    for name in CHIPS:
        found = [f for f in check(GBDT, [name]).records if f.op_type == "TreeEnsembleClassifier"]
        assert len(found) == 1, name
        finding = found[0]
        assert finding.severity is Severity.ERROR and finding.forces_cpu, (name, finding)
        assert finding.placement is not None and finding.placement.value == "cpu", name
        assert "runs on the CPU" in finding.reason and "every chip profile" in finding.reason
    assert not [f for f in check(GBDT, ["onnxruntime"]).records if f.op_type == "TreeEnsembleClassifier"]


def test_a_custom_domain_op_gets_one_severity_too() -> None:
    node = helper.make_node("Bar", ["x"], ["y"], domain="com.example", name="bar")
    graph = helper.make_graph([node], "custom", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.example", 1)])
    severities = {name: {f.severity for f in check(model, [name]).records if f.op_type == "Bar"} for name in CHIPS}
    assert all(s == {Severity.ERROR} for s in severities.values()), severities
