"""`--const` on an input that decides an If: the scan measures the graph `rewrite --freeze-input` writes.

The tiny graph is silero-vad's failure in small: an If on `sr`, the taken branch a MatMul, the other a
Squeeze of an axis that is free as declared and 8 in the data. Before, the analysis copy fixed the dims
and kept the If; onnxruntime's type inference rejected the untaken branch (exit 3, "a quantscan bug").
The oracle is the two-step route users were told to take: freeze first, then scan the frozen file.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from tests.builders import build

import quantscan
from quantscan.calib import load_calibration
from quantscan.errors import InternalError
from quantscan.model import load_model, set_input_dims
from quantscan.rewrites.pipeline import rewrite
from quantscan.runner import Runner
from quantscan.scanning.settings import setting_inputs

MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, T] x, int64 sr) => (float[N, 4] y) {
  rate = Constant <value = int64 {16000}> ()
  is_rate = Equal (sr, rate)
  y = If (is_rate) <
    then_branch = then_g () => (float[N, 4] y_then) {
      m = MatMul (x, w)
      y_then = Relu (m)
    },
    else_branch = else_g () => (float[N, 4] y_else) {
      one = Constant <value = int64[1] {1}> ()
      s = Squeeze (x, one)
      u = Unsqueeze (s, one)
      m8 = MatMul (x, w)
      y_else = Mul (m8, u)
    }
  >
}
"""


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    model = tmp_path / "m.onnx"
    onnx.save(build(MODEL, {"w": rng.normal(size=(8, 4)).astype(np.float32)}), model)
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", rng.normal(size=(6, 8)).astype(np.float32))
    return model, calib


def _frozen_first(model: Path, calib: Path, tmp_path: Path) -> Path:
    """`quantscan rewrite MODEL --freeze-input sr=16000 --calib DIR -o frozen.onnx`, proven on the data."""
    frozen = tmp_path / "frozen.onnx"
    data = load_calibration(calib, load_model(model).inputs, consts={"sr": 16000})
    report = rewrite(model, [], freeze_input=["sr=16000"], calib=data, out=frozen)
    assert report.passed and report.written
    return frozen


def test_the_tiny_graph_is_the_one_onnxruntime_rejected(tmp_path: Path) -> None:
    """The repro is faithful: the If kept with the data's dims fixed is what onnxruntime refuses."""
    model, _ = _setup(tmp_path)
    proto = onnx.load(model)
    set_input_dims(proto, {"x": (1, 8)})
    with pytest.raises(InternalError, match="Squeeze"):
        Runner().session(proto, built=True)


def test_const_on_the_setting_scans_as_the_frozen_model(tmp_path: Path) -> None:
    model, calib = _setup(tmp_path)
    unfrozen = quantscan.scan(model, calib, const={"sr": 16000}, gain_candidates=0, quiet=True)
    frozen = quantscan.scan(_frozen_first(model, calib, tmp_path), calib, gain_candidates=0, quiet=True)
    assert sorted(unfrozen.layers["op_type"]) == ["MatMul", "input"]  # the model input x is a site too
    pd.testing.assert_frame_equal(unfrozen.layers, frozen.layers, check_exact=False, rtol=0, atol=1e-9)
    pd.testing.assert_frame_equal(unfrozen.tensors, frozen.tensors, check_exact=False, rtol=0, atol=1e-9)
    (note,) = [w for w in unfrozen.warnings if "--const sr=16000" in w]
    assert "If" in note and "--freeze-input sr=16000" in note
    assert not any("not analysed" in w for w in unfrozen.warnings)


def test_the_cli_scan_with_the_const_exits_0(tmp_path: Path) -> None:
    model, calib = _setup(tmp_path)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "quantscan", "scan", str(model), "--calib", str(calib), "--const", "sr=16000",
         "--no-gain", "--quiet", "--out", str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--freeze-input sr=16000" in proc.stderr
    run = pd.read_json(tmp_path / "run" / "run.json", typ="series")
    assert run["options"]["const"] == {"sr": 16000.0}  # the user's const is still recorded
    assert [i["name"] for i in run["inputs"]] == ["x", "sr"]  # and the input contract is the user's


def test_only_consts_that_reach_an_if_condition_are_settings(tmp_path: Path) -> None:
    """A const that feeds data alone keeps feeding the graph as before (its tensors stay measured)."""
    model, _ = _setup(tmp_path)
    assert setting_inputs(load_model(model), {"sr": 16000}) == ["sr"]
    data_only = build(
        """<ir_version: 8, opset_import: ["" : 13]>
        g (float[N, 4] x, float[1, 4] b) => (float[N, 4] y) { y = Add (x, b) }"""
    )
    path = tmp_path / "data_only.onnx"
    onnx.save(data_only, path)
    assert setting_inputs(load_model(path), {"b": 0.5}) == []


DATA_DECIDED = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 8] x) => (float[N, 4] y) {
  total = ReduceSum <keepdims = 0> (x)
  zero = Constant <value = float {0}> ()
  positive = Greater (total, zero)
  y = If (positive) <
    then_branch = then_g () => (float[N, 4] y_then) { m = MatMul (x, w)  y_then = Relu (m) },
    else_branch = else_g () => (float[N, 4] y_else) { m2 = MatMul (x, w)  y_else = Neg (m2) }
  >
}
"""


def test_an_if_no_const_decides_stays_float_and_bisect_says_so(tmp_path: Path) -> None:
    """What the consts do not decide is left as it was: the scan says what stays float inside the If,
    and bisect (a valid model is never refused, issue 26) searches the top-level sites and records in
    its plan that every figure leaves the If's body float, rather than report a met target as the
    int8 model's."""
    from quantscan.api import run_bisect

    model, calib = _setup(tmp_path)
    onnx.save(build(DATA_DECIDED, {"w": np.ones((8, 4), np.float32)}), model)
    result = quantscan.scan(model, calib, gain_candidates=0, quiet=True)
    (warning,) = [w for w in result.warnings if "not analysed" in w]
    assert "If" in warning and "--freeze-input" in warning
    bisected = run_bisect(model, calib, target_cosine=0.99, out=tmp_path / "b")
    assert [u.split(" ")[0] for u in bisected.plan.unmeasured] == ["If_3"]
    assert any("not analysed" in w for w in bisected.warnings)
    assert json.loads((tmp_path / "b" / "plan.json").read_text())["unmeasured"] == list(bisected.plan.unmeasured)


def test_a_state_input_is_never_frozen(tmp_path: Path) -> None:
    """`--state` carries an input from sample to sample: its const is the first sample's value only, so
    even when it decides an If it stays an input."""
    from quantscan.scanning.settings import fold_setting_consts

    model, _ = _setup(tmp_path)
    loaded = load_model(model)
    kept = fold_setting_consts(loaded, {"sr": 16000}, {"x": (1, 8)}, carried=["sr"])
    assert kept.frozen == {} and kept.loaded is loaded
    folded = fold_setting_consts(loaded, {"sr": 16000}, {"x": (1, 8)})
    assert folded.frozen == {"sr": 16000.0} and "sr" not in folded.dims
    assert [n.op_type for n in folded.loaded.proto.graph.node] == ["MatMul", "Relu"]
    assert [i.name for i in folded.loaded.inputs] == ["x", "sr"]  # the user's input contract
