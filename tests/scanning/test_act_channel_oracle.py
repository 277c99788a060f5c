"""Per-channel activation figures (`act_worst_channel_sqnr_db`) against numpy written out.

What a user relies on: the worst channel's SQNR of a site's output under its own int8 quantizer, over
every sample, on the contract's channel axis (1 for a Conv's NCHW output, the last axis for a [B,T,C]
MatMul output). The oracle: onnx's ReferenceEvaluator runs the FP32 model, the site's activation
qparams come from the scan's plan, and quantize/dequantize, the per-channel sums and the SQNR are
numpy (round half to even, saturate at the code range).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import quantscan
from builders import build, run
from quantscan.scanning.prepare import prepare_scan

MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N,3,6,6] x) => (float[N,4,6,6] y, float[N,36,5] z) {
    c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
    y = Relu (c)
    r = Reshape (y, shape)
    t = Transpose <perm = [0, 2, 1]> (r)
    z = MatMul (t, m)
}
"""


def _sqnr_per_channel(x: np.ndarray, scale: float, zp: int, qmin: int, qmax: int, axis: int) -> np.ndarray:
    q = np.clip(np.round(x / scale) + zp, qmin, qmax)
    dq = (q - zp) * scale
    others = tuple(a for a in range(x.ndim) if a != axis)
    sxx = np.sum(x.astype(np.float64) ** 2, axis=others)
    sdd = np.sum((x.astype(np.float64) - dq) ** 2, axis=others)
    keep = sxx > 0
    return 10 * np.log10(sxx[keep] / np.maximum(sdd[keep], 1e-30))


def test_worst_channel_sqnr_is_numpys(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    w = rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32)
    w[2] *= 0.05  # one quiet channel: the worst under a shared per-tensor scale
    model = build(MODEL, {"w": w, "b": np.zeros(4, np.float32), "shape": np.array([0, 4, 36], np.int64),
                          "m": rng.normal(0, 1, (4, 5)).astype(np.float32)})
    for node in model.graph.node:
        node.name = node.output[0]
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib"
    calib.mkdir()
    x = rng.normal(0, 1, (6, 3, 6, 6)).astype(np.float32)
    np.save(calib / "x.npy", x)
    result = quantscan.scan(path, calib, threads=1, batch_size=4, gain_candidates=0)
    plan = prepare_scan(path, calib, threads=1).quant.plan
    y, z = run(model, {"x": x})
    for tensor, value, axis in (("y", y, 1), ("z", z, 2)):
        qp = plan.activations[tensor]
        expected = _sqnr_per_channel(value, float(np.ravel(qp.scale)[0]), int(np.ravel(qp.zero_point)[0]),
                                     qp.qmin, qp.qmax, axis)
        row = result.layers[result.layers["output"] == tensor].iloc[0]
        assert row["act_worst_channel_sqnr_db"] == pytest.approx(expected.min(), abs=1e-3), tensor
    assert result.layers.set_index("output").loc["y", "act_worst_channel_sqnr_db"] < 25  # the quiet channel
