"""A jax2tf-style classifier: a −inf constant (the identity of a max-reduction feeding Max), GELU in
jax's tanh spelling (x³ as x·(x·x), constants first), Softmax written out as Exp/ReduceSum/Div, with
keepdims=1 or (magika, through tf2onnx) keepdims=0 and the axis put back by Reshape/Expand.

Oracle: onnx's ReferenceEvaluator running the FP32 model and the saved QDQ model, top-1 agreement and
cosine written out in numpy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

import quantscan
from builders import reference_outputs
from quantscan.errors import ModelError
from quantscan.validate import check_finite_weights

JAX2TF_CLASSIFIER = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 16] x) => (float[N, 10] probs) {
  h0 = MatMul (x, w1)
  h = Add (h0, b1)
  sq = Mul (h, h)
  cube = Mul (h, sq)
  k = Mul (c0447, cube)
  u = Add (h, k)
  s = Mul (csqrt, u)
  t = Tanh (s)
  a = Add (one, t)
  cdf = Mul (half, a)
  g1 = Mul (h, cdf)
  l0 = MatMul (g1, w2)
  logits = Add (l0, b2)
  rm = ReduceMax <axes = [1], keepdims = 1> (logits)
  m = Max (rm, neginf)
  d = Sub (logits, m)
  e = Exp (d)
  z = ReduceSum <keepdims = 1> (e, ax)
  probs = Div (e, z)
}
"""


TF2ONNX_SOFTMAX = """
  rm = ReduceMax <axes = [1], keepdims = 0> (logits)
  m0 = Max (neginf, rm)
  shp = Shape (logits)
  n = Slice (shp, z0, o0)
  col = Concat <axis = 0> (n, o0)
  m1 = Reshape (m0, col)
  m = Expand (m1, shp)
  d = Sub (logits, m)
  e = Exp (d)
  z0s = ReduceSum <keepdims = 0, noop_with_empty_axes = 1> (e, ax)
  z1 = Reshape (z0s, col)
  z = Expand (z1, shp)
  probs = Div (e, z)
}
"""
"""magika's head (jax2tf through tf2onnx): keepdims=0 reductions whose axis is put back by a Reshape to
[N, 1] (the batch read with Shape/Slice) and an Expand to the logits' shape, before the Sub and the Div."""
MAGIKA_CLASSIFIER = JAX2TF_CLASSIFIER[:JAX2TF_CLASSIFIER.index("  rm = ReduceMax")] + TF2ONNX_SOFTMAX


def jax2tf_classifier(tmp_path: Path, text: str = JAX2TF_CLASSIFIER) -> tuple[Path, Path]:
    rng = np.random.default_rng(3)
    inits = {
        "w1": rng.normal(0, 0.4, (16, 32)).astype(np.float32),
        "b1": rng.normal(0, 0.1, 32).astype(np.float32),
        "w2": rng.normal(0, 0.1, (32, 10)).astype(np.float32),
        "b2": rng.normal(0, 0.05, 10).astype(np.float32),
        "c0447": np.array(0.044715, np.float32),
        "csqrt": np.array([[np.sqrt(2 / np.pi)]], np.float32),  # rank-promoted scalars occur too
        "one": np.array(1.0, np.float32),
        "half": np.array(0.5, np.float32),
        "neginf": np.array(-np.inf, np.float32),
        "ax": np.array([1], np.int64),
        "z0": np.array([0], np.int64),
        "o0": np.array([1], np.int64),
    }
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(onnx.numpy_helper.from_array(v, k) for k, v in inits.items())
    onnx.checker.check_model(model, full_check=True)
    path = tmp_path / "jax2tf.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(8):
        np.savez(calib / f"{i:03d}.npz", x=rng.normal(size=(8, 16)).astype(np.float32))
    return path, calib


def test_minus_inf_constant_is_valid_and_nan_is_not() -> None:
    model = onnx.parser.parse_model(JAX2TF_CLASSIFIER)
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([-np.inf, np.inf], np.float32), "mask"))
    check_finite_weights(model, "m.onnx")  # ±inf: identities and masks, no refusal
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([np.nan], np.float32), "bad"))
    with pytest.raises(ModelError, match="1 NaN values in initializer 'bad'"):
        check_finite_weights(model, "m.onnx")


@pytest.mark.parametrize("text", [JAX2TF_CLASSIFIER, MAGIKA_CLASSIFIER], ids=["keepdims", "restored"])
def test_jax2tf_classifier_scans_as_a_classifier(tmp_path: Path, text: str) -> None:
    model, calib = jax2tf_classifier(tmp_path, text)
    qdq = tmp_path / "qdq.onnx"
    result = quantscan.scan(model, calib, save_qdq=qdq)
    kernels = [s.kernel for s in result.sites]
    assert sum(k.startswith("GELU[") for k in kernels) == 1
    assert not any(k in ("Tanh", "Max") for k in kernels)
    softmax = next(s for s in result.sites if s.kernel.startswith("Softmax["))
    assert "Max" in softmax.kernel  # the −inf identity is part of the kernel, not a site of its own
    x, y = reference_outputs(model, qdq, calib)
    metrics = result.output_metrics["probs"]
    assert metrics.top1_agreement == pytest.approx(float(np.mean(x.argmax(1) == y.argmax(1))))
    cosine = float((x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum()))
    assert metrics.cosine == pytest.approx(cosine, abs=1e-5)
