"""div-to-mul: fires on a constant float divisor (bit-exact for powers of two), refuses with the reason,
numerics vs onnx.reference on the original, the proof through the runner, and Paddle's HardSwish on a
real model; the compat finding for Div on horizon-x3 names the rewrite."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import assert_same_outputs, build, op_types, run
from conftest import asset_calib, asset_model
from quantscan.calib import load_calibration
from quantscan.compat.check import check
from quantscan.model import graph_inputs
from quantscan.records import RewriteId
from quantscan.rewrites.div_to_mul import div_to_mul, reciprocal
from quantscan.rewrites.pipeline import rewrite

X = np.linspace(-50, 50, 64, dtype=np.float32).reshape(4, 16)

PADDLE_HARDSWISH = """<ir_version: 8, opset_import: ["" : 11]>
g (float[4,16] x) => (float[4,16] y) {
    three = Constant <value = float {3.0}> ()
    lo = Constant <value = float {0.0}> ()
    hi = Constant <value = float {6.0}> ()
    six = Constant <value = float {6.0}> ()
    a = Add (x, three)
    c = Clip (a, lo, hi)
    m = Mul (x, c)
    y = Div (m, six)
}"""


def test_paddle_hardswish_div_becomes_mul() -> None:
    m = build(PADDLE_HARDSWISH)
    res = div_to_mul(m)
    assert "Div" not in op_types(res.model) and op_types(res.model).count("Mul") == 2
    (change,) = res.changes
    assert change.rewrite == "div-to-mul" and "within float rounding" in change.detail
    onnx.checker.check_model(res.model, full_check=True)
    assert_same_outputs(m, res.model, {"x": X})
    # oracle written out: HardSwish = x * clip(x + 3, 0, 6) / 6
    expected = X * np.clip(X + 3, 0, 6) / np.float32(6)
    np.testing.assert_allclose(run(res.model, {"x": X})[0], expected, rtol=2e-7, atol=1e-6)
    assert op_types(m)[-1] == "Div"  # input untouched


def test_power_of_two_divisor_is_bit_exact() -> None:
    m = build(
        """<ir_version: 8, opset_import: ["" : 13]>
        g (float[4,16] x) => (float[4,16] y) { y = Div (x, d) }""",
        {"d": np.array([0.25, 2.0, 8.0, -0.5] * 4, dtype=np.float32)},
    )
    res = div_to_mul(m)
    assert "exact (power-of-two divisor)" in res.changes[0].detail
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32) * 1e3
    assert np.array_equal(run(m, {"x": x})[0], run(res.model, {"x": x})[0])


@pytest.mark.parametrize(
    "value, exact",
    [(np.float32(4.0), True), (np.float32(6.0), False), (np.float32(-0.125), True), (np.float32(3.0), False)],
)
def test_reciprocal_exactness(value: np.float32, exact: bool) -> None:
    recip, is_exact = reciprocal(np.asarray(value))
    assert is_exact is exact and recip.dtype == np.float32
    assert recip == np.float32(1.0 / float(value))


@pytest.mark.parametrize(
    "body, inits, reason",
    [
        ("y = Div (x, z)", {}, "is computed (or a graph input)"),
        ("y = Div (x, d)", {"d": np.array(0.0, np.float32)}, "contains 0"),
        ("y = Div (x, d)", {"d": np.array(1e-45, np.float32)}, "not a finite float"),
    ],
)
def test_refusals_name_the_reason(body: str, inits: dict[str, np.ndarray], reason: str) -> None:
    m = build(
        f"""<ir_version: 8, opset_import: ["" : 13]>
        g (float[4] x, float[4] z) => (float[4] y) {{ {body} }}""",
        inits,
    )
    res = div_to_mul(m)
    assert not res.changes and reason in res.refusals[0].reason


def test_integer_div_is_refused() -> None:
    m = build(
        """<ir_version: 8, opset_import: ["" : 13]>
        g (int64[4] x) => (int64[4] y) { y = Div (x, d) }""",
        {"d": np.array(3, np.int64)},
    )
    res = div_to_mul(m)
    assert not res.changes and "integer Div truncates" in res.refusals[0].reason


def test_proof_through_the_runner_and_compat_names_the_rewrite() -> None:
    m = build(PADDLE_HARDSWISH)
    divs = [f for f in check(m, ["horizon-x3"]).records if f.op_type == "Div"]
    assert divs and all(f.rewrite is RewriteId.DIV_TO_MUL for f in divs)
    rep = rewrite(m, ["div-to-mul"], write=False)
    assert rep.passed and rep.steps[0].rewrite == "div-to-mul"
    assert "Div" not in rep.op_counts_after
    after = check(rep.model, ["horizon-x3"]).records
    assert not [f for f in after if f.op_type == "Div"]


def test_computed_divisor_gets_no_rewrite_in_compat() -> None:
    m = build(
        """<ir_version: 8, opset_import: ["" : 11]>
        g (float[4] x, float[4] z) => (float[4] y) { y = Div (x, z) }"""
    )
    divs = [f for f in check(m, ["horizon-x3"]).records if f.op_type == "Div"]
    assert divs and all(f.rewrite is None for f in divs)


@pytest.mark.real
def test_ppocr_cls_paddle_hardswish(assets, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Paddle's HardSwish Divs in a real classifier go, proven on its calibration images."""
    path = asset_model(assets, "ppocr_mobile_v2_cls")
    model = onnx.load(path)
    res = div_to_mul(model)
    assert len(res.changes) == 18 and "Div" not in op_types(res.model)
    calib = load_calibration(asset_calib(assets, "ppocr_mobile_v2_cls"), graph_inputs(model), limit=4)
    rep = rewrite(path, ["div-to-mul"], calib=calib, out=tmp_path / "cls.onnx")
    assert rep.passed and rep.written
    assert rep.opset_after == rep.opset_before == 11
