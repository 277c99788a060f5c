"""ConvTranspose + BatchNormalization, rank 1-3, under profile onnxruntime (quantize_static's recipe):
quantize_static quantizes the BN's gamma and beta but not its output, and the BN site once got NaN
isolated figures (no output pair, so no isolated twin). Oracle: the BN written out in numpy on the
dequantized ConvTranspose output with the QDQ model's own scales.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import numpy_helper

import quantscan
from builders import evaluator


def _model(tmp_path: Path, rank: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(rank)
    spatial, kernel, out = ",".join(["4"] * rank), ",".join(["2"] * rank), ",".join(["8"] * rank)
    text = f"""
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 3, {spatial}] x) => (float[N, 5, {out}] y) {{
  c = ConvTranspose <strides = [{kernel}], kernel_shape = [{kernel}]> (x, w, b)
  n = BatchNormalization (c, gamma, beta, mean, var)
  y = Relu (n)
}}
"""
    model = onnx.parser.parse_model(text)
    inits = {"w": rng.normal(size=(3, 5) + (2,) * rank), "b": rng.normal(size=5),
             "gamma": rng.uniform(0.5, 2, 5), "beta": rng.normal(size=5), "mean": rng.normal(size=5),
             "var": rng.uniform(0.5, 2, 5)}
    model.graph.initializer.extend(numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items())
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / f"ct{rank}.onnx"
    onnx.save(model, path)
    calib = tmp_path / f"calib{rank}"
    calib.mkdir()
    for i in range(3):
        np.savez(calib / f"{i}.npz", x=rng.normal(size=(2, 3) + (4,) * rank).astype(np.float32))
    return path, calib


def _dq(inits: dict[str, np.ndarray], name: str, values: np.ndarray | None = None) -> np.ndarray:
    q = inits[f"{name}__quantized"] if values is None else values
    return (q.astype(np.float64) - inits[f"{name}__zp"].astype(np.float64)) * inits[f"{name}__scale"]


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_bn_after_convtranspose_has_its_isolated_figure(tmp_path: Path, rank: int) -> None:
    path, calib = _model(tmp_path, rank)
    result = quantscan.scan(path, calib, profile="onnxruntime")
    row = result.layers.set_index("op_type").loc["BatchNormalization"]
    inits = {t.name: numpy_helper.to_array(t) for t in result.qdq_model.graph.initializer}
    fp32 = onnx.load(path)
    fp32.graph.output.extend([onnx.ValueInfoProto(name="c"), onnx.ValueInfoProto(name="n")])
    ref = evaluator(fp32)  # onnx.reference's opset-9..14 BN kernel is not inference mode
    shape = (1, -1) + (1,) * rank
    gamma, beta = _dq(inits, "gamma").reshape(shape), _dq(inits, "beta").reshape(shape)
    mean, var = (inits[k].astype(np.float64).reshape(shape) for k in ("mean", "var"))
    sxx = sdd = 0.0
    for f in sorted(calib.glob("*.npz")):
        _, c, n = ref.run(None, dict(np.load(f)))
        scale, zp = float(inits["c__act__scale"]), int(inits["c__act__zp"])
        cq = (np.clip(np.rint(c / scale) + zp, 0, 255) - zp) * scale  # uint8, onnxruntime's default recipe
        iso = (cq - mean) / np.sqrt(var + 1e-5) * gamma + beta
        sxx += float((n.astype(np.float64) ** 2).sum())
        sdd += float(((n - iso) ** 2).sum())
    assert np.isfinite(row["isolated_sqnr_db"])
    assert row["isolated_sqnr_db"] == pytest.approx(10 * np.log10(sxx / sdd), abs=0.05)
    assert "float float" not in str(row.get("diagnosis", ""))
