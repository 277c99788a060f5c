"""A scan that leaves a quantizable If body float must not headline a figure it did not measure.

silero-vad's wheel model after `--freeze-input sr=16000` alone keeps Ifs whose conditions test sizes; the
LSTM inside stayed float and the scan reported output cosine 1.00000 while the deployed int8 model gave
0.96. The tiny graph here is that case in small: a top-level MatMul, then an If on `x`'s batch size whose
branches each hold a MatMul. The oracle is the loop itself: check names `--fix-dim batch=1`, the rewrite
folds the If, and the scan of the folded model measures the body (its headline is then measured).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import build
from quantscan.api import scan
from quantscan.compat.check import check
from quantscan.rewrites.pipeline import rewrite

MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 8] x) => (float[N, 4] y) {
  m0 = MatMul (x, w0)
  r0 = Relu (m0)
  s = Shape (x)
  zero = Constant <value = int64 {0}> ()
  one = Constant <value = int64 {1}> ()
  n = Gather <axis = 0> (s, zero)
  single = Equal (n, one)
  y = If (single) <
    then_branch = then_g () => (float[N, 4] y_then) {
      m = MatMul (r0, w)
      y_then = Tanh (m)
    },
    else_branch = else_g () => (float[N, 4] y_else) {
      m2 = MatMul (r0, w)
      y_else = Sigmoid (m2)
    }
  >
}
"""


@pytest.fixture()
def setup(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    model = tmp_path / "m.onnx"
    onnx.save(build(MODEL, {"w0": rng.normal(size=(8, 8)).astype(np.float32),
                            "w": rng.normal(size=(8, 4)).astype(np.float32)}), model)
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", rng.normal(size=(6, 8)).astype(np.float32))
    return model, calib


def test_the_headline_says_the_body_was_not_measured_and_the_loop_closes(setup: tuple[Path, Path],
                                                                         tmp_path: Path) -> None:
    model, calib = setup
    partial = scan(model, calib, out=tmp_path / "partial", no_report=True, gain_candidates=0)
    assert not partial.headline.measured and partial.headline.unmeasured == ["If_7 (4 nodes)"]
    summary = (tmp_path / "partial" / "summary.md").read_text(encoding="utf-8")
    assert "Not measured on the int8 model" in summary and "If_7 (4 nodes)" in summary
    assert '"unmeasured": [' in (tmp_path / "partial" / "run.json").read_text(encoding="utf-8")
    # check names the flag that folds the If; the rewrite applies it; the scan then measures the body
    assert check(model, ["rk3588"]).fold_flags == ["--fix-dim batch=1"]
    folded = tmp_path / "folded.onnx"
    assert rewrite(model, [], fix_dim=["batch=1"], out=folded).passed
    assert "If" not in {n.op_type for n in onnx.load(folded).graph.node}
    full = scan(folded, calib, out=tmp_path / "full", no_report=True, gain_candidates=0)
    assert full.headline.measured and len(full.sites) > len(partial.sites)
    assert "Not measured" not in (tmp_path / "full" / "summary.md").read_text(encoding="utf-8")


def test_the_cli_warns_loudly(setup: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = setup
    proc = subprocess.run([sys.executable, "-m", "quantscan", str(model), "--calib", str(calib), "--out",
                           str(tmp_path / "r"), "--no-report", "--no-gain", "--quiet"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr
    assert "NOT MEASURED on the int8 model" in proc.stdout
    assert "NOT the int8 model's" in proc.stderr and "If_7 (4 nodes)" in proc.stderr


def test_a_cosine_gate_does_not_pass_on_an_unmeasured_headline(setup: tuple[Path, Path], tmp_path: Path) -> None:
    """`--fail-below-cosine` exits 1 when the headline is the float model's (its cosine is 1.0 there, so
    any gate would pass on a figure that says nothing about int8)."""
    model, calib = setup
    proc = subprocess.run([sys.executable, "-m", "quantscan", str(model), "--calib", str(calib), "--out",
                           str(tmp_path / "r"), "--no-report", "--no-gain", "--quiet", "--fail-below-cosine", "0.5"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 1, proc.stderr
    assert "was not measured on the int8 model" in proc.stderr


def test_the_vad_pattern_folded_by_const_measures_its_lstm(tmp_path: Path) -> None:
    """`builders.vad_like` scanned with `--const sr=16000` and the data's sizes: every If folds, and the
    LSTM (exported for its final state only, `LSTM -> ("", Y_h)`) is a site; it used to be refused as
    "no quantization site" because its first output is empty."""
    from builders import VAD_HIDDEN, vad_like

    path = tmp_path / "vad.onnx"
    onnx.save(vad_like(), path)
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(0)
    for k in range(3):
        np.savez(calib / f"{k}.npz", x=rng.normal(size=(1, 12)).astype(np.float32),
                 state=np.zeros((2, 1, VAD_HIDDEN), np.float32))
    result = scan(path, calib, const={"sr": 16000}, input_shape={"x": [1, 12], "state": [2, 1, VAD_HIDDEN]},
                  no_report=True, gain_candidates=0)
    # x is a site (the model input); `state` is not: the LSTM reads it as its initial state, a parameter
    assert [(s.node, s.op_type, s.output) for s in result.sites] == [("x", "input", "x"), ("LSTM_0", "LSTM", "hn")]
    assert result.headline.measured and 0 < result.headline.cosine <= 1
