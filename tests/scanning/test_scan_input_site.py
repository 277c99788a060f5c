"""The model input measured as a site: a speaker encoder fed power mel frames (heavy-tailed, >= 0) puts
most values into uint8 code 0; quantizing the input alone costs most of the output's loss, and the
summary says so before blaming the first layer. Oracle: the FP32 model run by onnx's ReferenceEvaluator
on the input fake-quantized by the textbook uint8 formulas written out here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx.reference import ReferenceEvaluator

import quantscan
from quantscan.report.summary import summary_markdown

ENCODER = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 20, 16] mel) => (float[N, 8] emb) {
  h = MatMul (mel, w)
  t = Tanh (h)
  emb = ReduceMean <axes = [1], keepdims = 0> (t)
}
"""


def power_mel_encoder(tmp_path: Path) -> tuple[Path, Path, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    model = onnx.parser.parse_model(ENCODER)
    model.graph.initializer.append(onnx.numpy_helper.from_array(rng.normal(0, 2.0, (16, 8)).astype(np.float32), "w"))
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "enc.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib"
    calib.mkdir()
    data = [np.exp(rng.normal(-2.0, 1.5, (4, 20, 16))).astype(np.float32) ** 2 for _ in range(4)]
    for i, a in enumerate(data):
        np.savez(calib / f"{i}.npz", mel=a)
    return path, calib, data


def test_input_quantization_is_measured_and_leads_the_diagnosis(tmp_path: Path) -> None:
    path, calib, data = power_mel_encoder(tmp_path)
    result = quantscan.scan(path, calib)
    entry = next(i for i in result.run_info.inputs if i["name"] == "mel")["quantization"]
    lo, hi = min(0.0, min(float(a.min()) for a in data)), max(float(a.max()) for a in data)
    scale = np.float32((hi - lo) / 255.0)
    zp = int(np.round(-lo / scale))
    ref = ReferenceEvaluator(str(path))
    xs, ys, codes = [], [], []
    for a in data:
        q = np.clip(np.rint(a / scale) + zp, 0, 255)
        codes.append(q.ravel())
        xs.append(ref.run(None, {"mel": a})[0].astype(np.float64))
        ys.append(ref.run(None, {"mel": ((q - zp) * scale).astype(np.float32)})[0].astype(np.float64))
    x, y = np.concatenate(xs), np.concatenate(ys)
    share = float(np.mean(np.concatenate(codes) == 0))
    assert entry["top_code"] == 0 and entry["top_code_share"] == pytest.approx(share, abs=1e-6) and share > 0.5
    assert entry["output_cosine"] == pytest.approx(float((x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum())),
                                                   abs=1e-5)
    assert entry["output_cosine_16bit"] > entry["output_cosine"] and entry["cause"] == "crowded-codes"
    text = summary_markdown(result)
    assert "**Model input** `mel`: quantized alone (uint8" in text and "16 bits" in text and "**Fix**" in text
    assert text.index("**Model input**") < text.index("**Where**")
