"""Data-independent tensors are no sites: an LSTM's h0/c0 from ConstantOfShape, an anchor grid from Range
over the input's length. They are the same on every sample (a compiler folds them), so their zero range
and "dead channels" are their value, not a fault to rank. Oracle: the data dependence written out by hand
for this graph, and onnx's ReferenceEvaluator on the saved QDQ model for the headline.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnx.version_converter
import pytest
from onnx.reference import ReferenceEvaluator

import quantscan
from quantscan.report.summary import summary_markdown
from quantscan.sites import data_dependent

H = 8
LSTM_WITH_GRID = f"""
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 5, 4] xb) => (float[5, N, {H}] y, float[N, 6] box) {{
  x = Transpose <perm = [1, 0, 2]> (xb)
  xs = Shape (x)
  nb = Slice (xs, one, two, zero)
  hshape = Concat <axis = 0> (one, nb, hid)
  h0 = ConstantOfShape <value = float[1] {{0.0}}> (hshape)
  ys, hn, cn = LSTM <hidden_size = {H}> (x, W, R, B, , h0, h0)
  y = Squeeze (ys, one)
  last = Squeeze (hn, zero)
  t0 = Slice (xs, zero, one, zero)
  t1 = Add (t0, one)
  t1s = Squeeze (t1, zero)
  cnt = Cast <to = 1> (t1s)
  r = Range (zerof, cnt, onef)
  rc = Add (r, half)
  grid = Mul (rc, stride)
  p = MatMul (last, wp)
  box = Add (p, grid)
}}
"""


def lstm_with_grid(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    floats = {"W": rng.normal(0, 0.3, (1, 4 * H, 4)), "R": rng.normal(0, 0.3, (1, 4 * H, H)),
              "B": rng.normal(0, 0.1, (1, 8 * H)), "wp": rng.normal(0, 0.5, (H, 6)), "half": np.array(0.5),
              "stride": np.array(8.0), "zerof": np.array(0.0), "onef": np.array(1.0)}
    ints = {"one": [1], "two": [2], "zero": [0], "hid": [H]}
    model = onnx.parser.parse_model(LSTM_WITH_GRID)
    arrays = {**{k: np.asarray(v, np.float32) for k, v in floats.items()},
              **{k: np.array(v, np.int64) for k, v in ints.items()}}
    model.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in arrays.items())
    onnx.checker.check_model(model)
    path = tmp_path / "lstm.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(4):
        np.savez(calib / f"{i}.npz", xb=rng.normal(size=(2, 5, 4)).astype(np.float32))
    return path, calib


def test_data_dependence_follows_values_not_shapes(tmp_path: Path) -> None:
    path, _ = lstm_with_grid(tmp_path)
    dependent = data_dependent(onnx.load(path).graph)
    assert {"x", "ys", "hn", "y", "last", "p", "box"} <= dependent
    assert not {"xs", "hshape", "h0", "cnt", "r", "rc", "grid"} & dependent


def test_constant_tensors_are_no_sites_and_raise_no_warnings(tmp_path: Path) -> None:
    path, calib = lstm_with_grid(tmp_path)
    qdq = tmp_path / "qdq.onnx"
    result = quantscan.scan(path, calib, save_qdq=qdq)
    outputs = {s.output for s in result.sites}
    assert not {"h0", "r", "rc", "grid"} & outputs and {"ys", "box"} <= outputs
    assert not [w for w in result.warnings if "zero range" in w]
    assert not result.layers["diagnosis"].fillna("").str.contains("dead-channels").any()
    assert "`--output NAME` measures the one the application reads" in summary_markdown(result)  # two outputs
    fp32 = ReferenceEvaluator(str(path))
    fq = ReferenceEvaluator(onnx.version_converter.convert_version(onnx.load(qdq), 21))
    for name, k in (("y", 0), ("box", 1)):
        xs, ys = [], []
        for f in sorted(calib.glob("*.npz")):
            feed = dict(np.load(f))
            xs.append(np.asarray(fp32.run(None, feed)[k], np.float64))
            ys.append(np.asarray(fq.run(None, feed)[k], np.float64))
        x, y = np.concatenate(xs, axis=1 - k), np.concatenate(ys, axis=1 - k)
        cosine = float((x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum()))
        assert result.output_metrics[name].cosine == pytest.approx(cosine, abs=1e-5)
