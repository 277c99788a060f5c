"""A profile's `[consumer_range]`: the kernel feeding a MaxPool quantizes to the MaxPool's output range.

rknn-toolkit2 does this (recorded: tests/fixtures/vendor/rknn-toolkit2-2.5.0/quantization-cfg), so a
Conv+PRelu before a MaxPool clips its output where the pool's range ends. Checked on tiny graphs against
ranges written out with onnx's ReferenceEvaluator (an oracle independent of quantscan's calibration).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import build, tensor_range
from quantscan import quant
from quantscan.records import ActivationScheme
from quantscan.scanning.prepare import prepare_scan

CONV_PRELU_POOL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 2, 8, 8] x) => (float[N, 3, 3, 3] y) {
    c = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
    p = PRelu (c, slope)
    m = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (p)
    y = Conv (m, w2, b2)
}
"""

SHARED_READER = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 2, 8, 8] x) => (float[N, 3, 3, 3] y, float[N, 3, 8, 8] z) {
    c = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
    p = PRelu (c, slope)
    m = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (p)
    y = Conv (m, w2, b2)
    z = Add (p, p)
}
"""


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "w1": rng.normal(0, 0.5, (3, 2, 3, 3)).astype(np.float32),
        "b1": np.array([-1.0, 0.0, 0.5], np.float32),
        "slope": np.array([1.5, 0.25, 2.0], np.float32).reshape(3, 1, 1),  # slope > 1 widens the negative side
        "w2": rng.normal(0, 0.5, (3, 3, 2, 2)).astype(np.float32),
        "b2": np.zeros(3, np.float32),
    }


def _write(tmp_path: Path, text: str) -> tuple[Path, Path, np.ndarray]:
    model = build(text, _weights())
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    calib = tmp_path / "calib"
    calib.mkdir()
    x = np.random.default_rng(5).normal(0, 1, (12, 2, 8, 8)).astype(np.float32)
    np.save(calib / "x.npy", x)
    return path, calib, x


def test_kernel_before_maxpool_takes_the_pools_output_range(tmp_path: Path) -> None:
    path, calib, x = _write(tmp_path, CONV_PRELU_POOL)
    ctx = prepare_scan(path, calib, profile="rk3588", gain_candidates=0)
    pooled, own = tensor_range(path, x, "m"), tensor_range(path, x, "p")
    assert pooled[0] > own[0] + 0.1  # the pool drops the most negative PReLU outputs: a real clip
    want = quant.activation_qparams(*pooled, ActivationScheme.UINT8)
    for tensor in ("p", "m"):  # the kernel's output and the pool's share one grid, the pool's
        got = ctx.quant.plan.activations[tensor]
        assert float(got.scale) == pytest.approx(float(want.scale), rel=1e-5)
        assert int(got.zero_point) == int(want.zero_point)
    assert ctx.graph.origins["p"] == ctx.graph.origins["m"] == "m"


def test_without_the_profile_fact_the_kernel_keeps_its_own_range(tmp_path: Path) -> None:
    path, calib, x = _write(tmp_path, CONV_PRELU_POOL)
    ctx = prepare_scan(path, calib, activations="uint8", gain_candidates=0)
    want = quant.activation_qparams(*tensor_range(path, x, "p"), ActivationScheme.UINT8)
    assert float(ctx.quant.plan.activations["m"].scale) == pytest.approx(float(want.scale), rel=1e-5)
    assert ctx.graph.origins["m"] == "p"


def test_a_kernel_output_read_beside_the_maxpool_keeps_its_own_range(tmp_path: Path) -> None:
    """No recorded run says which reader's range would win, so none is guessed."""
    path, calib, x = _write(tmp_path, SHARED_READER)
    ctx = prepare_scan(path, calib, profile="rk3588", gain_candidates=0)
    want = quant.activation_qparams(*tensor_range(path, x, "p"), ActivationScheme.UINT8)
    assert float(ctx.quant.plan.activations["p"].scale) == pytest.approx(float(want.scale), rel=1e-5)
    assert ctx.graph.origins["p"] == "p"
