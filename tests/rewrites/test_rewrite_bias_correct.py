"""bias-correct: the correction against a numpy formula, its promise (zero mean int8-weight shift on
the data the means came from), refusals, the runner's per-site figures and a real model.

Oracles: symmetric per-channel int8 rounding written out in numpy (scale = absmax / 127,
round half to even), ReferenceEvaluator runs of the corrected model with int8 weights vs the original.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from builders import build, rng_array, run
from conftest import asset_calib, asset_model
from quantscan.calib import load_calibration
from quantscan.model import load_model
from quantscan.rewrites.bias_correct import bias_correct, bias_sites, with_int8_weights
from quantscan.rewrites.calibstats import ChannelStats
from quantscan.rewrites.pipeline import rewrite

HEADER = '<ir_version: 8, opset_import: ["" : 15]>'


def stats_of(x: np.ndarray, axis: int = -1) -> ChannelStats:
    rows = np.moveaxis(x.astype(np.float64), axis, -1).reshape(-1, x.shape[axis])
    return ChannelStats(rows.min(0), rows.max(0), rows.mean(0), (rows**2).mean(0), rows.shape[0])


def int8_rounded(w: np.ndarray, axis: int) -> np.ndarray:
    others = tuple(i for i in range(w.ndim) if i != axis)
    scale = (np.abs(w).max(axis=others, keepdims=True) / 127).astype(np.float32)
    return (np.clip(np.rint(w / scale), -127, 127) * scale).astype(np.float32)


def inits(m: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}


def test_gemm_formula_and_zero_mean_shift() -> None:
    m = build(HEADER + """
        g (float[64,8] x) => (float[64,5] y) { y = Gemm <transB=1> (x, W, C) }""",
              {"W": rng_array((5, 8), 1), "C": rng_array((5,), 2)})
    x = rng_array((64, 8), 3, 0.0, 4.0)  # post-Relu-like: positive mean, so the shift is not zero
    res = bias_correct(m, {"x": stats_of(x)})
    assert len(res.changes) == 1 and not res.exact
    w, c = inits(m)["W"], inits(m)["C"]
    eps = int8_rounded(w, 0).astype(np.float64) - w
    np.testing.assert_allclose(inits(res.model)["C"], c - eps @ x.mean(0), rtol=1e-5, atol=1e-7)
    # the promise: with int8 weights, the corrected layer's mean output equals the FP32 one
    fp32 = run(m, {"x": x})[0]
    before = run(with_int8_weights(m), {"x": x})[0]
    after = run(with_int8_weights(res.model), {"x": x})[0]
    assert np.abs((after - fp32).mean(0)).max() < 1e-5 < np.abs((before - fp32).mean(0)).max()


@pytest.mark.parametrize("group", [1, 2])
def test_pointwise_conv_is_unbiased(group: int) -> None:
    m = build(HEADER + f"""
        g (float[2,4,6,6] x) => (float[2,8,6,6] y) {{ y = Conv <group={group}> (x, W, B) }}""",
              {"W": rng_array((8, 4 // group, 1, 1), 1), "B": rng_array((8,), 2)})
    x = rng_array((2, 4, 6, 6), 3, 0.0, 3.0)
    res = bias_correct(m, {"x": stats_of(x, 1)})
    fp32 = run(m, {"x": x})[0]
    after = run(with_int8_weights(res.model), {"x": x})[0]
    before = run(with_int8_weights(m), {"x": x})[0]
    per_channel = (0, 2, 3)
    assert np.abs((after - fp32).mean(per_channel)).max() < 1e-5 < np.abs((before - fp32).mean(per_channel)).max()


def test_kxk_conv_shift_reduced() -> None:
    """A 3x3 kernel's taps see shifted windows whose means differ from the channel mean: the shift
    shrinks, it does not vanish (the paper's approximation)."""
    m = build(HEADER + """
        g (float[2,4,12,12] x) => (float[2,8,12,12] y) { y = Conv <pads=[1,1,1,1]> (x, W, B) }""",
              {"W": rng_array((8, 4, 3, 3), 1), "B": rng_array((8,), 2)})
    x = rng_array((2, 4, 12, 12), 3, 0.0, 3.0)
    res = bias_correct(m, {"x": stats_of(x, 1)})
    fp32 = run(m, {"x": x})[0]
    before = np.abs((run(with_int8_weights(m), {"x": x})[0] - fp32).mean((0, 2, 3)))
    after = np.abs((run(with_int8_weights(res.model), {"x": x})[0] - fp32).mean((0, 2, 3)))
    assert np.sqrt(np.mean(after**2)) < 0.3 * np.sqrt(np.mean(before**2))


def test_matmul_add_bias_and_refusals() -> None:
    m = build(HEADER + """
        g (float[16,6] x) => (float[16,4] y, float[16,3] z) {
            h = MatMul (x, W1)
            y = Add (h, B1)
            z = MatMul (x, W2)
        }""", {"W1": rng_array((6, 4), 1), "B1": rng_array((4,), 2), "W2": rng_array((6, 3), 3)})
    assert bias_sites(m) == {"x": "last"}
    x = rng_array((16, 6), 4, 0.0, 2.0)
    res = bias_correct(m, {"x": stats_of(x)})
    assert [c.node for c in res.changes] == ["MatMul:h"]
    assert [r.reason for r in res.refusals] == ["no bias input to correct"]
    eps = int8_rounded(inits(m)["W1"], 1).astype(np.float64) - inits(m)["W1"]
    np.testing.assert_allclose(inits(res.model)["B1"], inits(m)["B1"] - x.mean(0) @ eps, rtol=1e-5, atol=1e-7)
    assert "no statistics" in bias_correct(m, {}).refusals[-1].reason


@pytest.mark.real
def test_mtcnn_pnet_per_site_figures(assets) -> None:  # type: ignore[no-untyped-def]
    loaded = load_model(asset_model(assets, "mtcnn_pnet"))
    calib = load_calibration(asset_calib(assets, "mtcnn_pnet"), loaded.inputs, limit=8)
    report = rewrite(asset_model(assets, "mtcnn_pnet"), ["bias-correct"], calib=calib, write=False)
    changes = [c for c in report.changes if c.rewrite == "bias-correct"]
    assert len(changes) == 5 and not report.proof.exact
    gains = []
    for c in changes:
        before, after = c.detail.split("int8-weight SQNR ")[1].rstrip(" dB").split(" -> ")
        gains.append(float(after) - float(before))
    assert np.mean(gains) > 0, [c.detail for c in changes]
    assert report.passed  # FP32 change within what int8 weights already cost
