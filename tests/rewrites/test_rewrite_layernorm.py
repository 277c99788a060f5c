"""decompose-layernorm / fuse-layernorm: both directions, both ReduceMean forms, refusals, ppocrv4_rec ×5."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import version_converter

from builders import assert_same_outputs, build, calib_images, op_types, rng_array
from conftest import asset_calib, asset_model
from quantscan.rewrites.decompose_layernorm import decompose_layernorm
from quantscan.rewrites.fuse_layernorm import fuse_layernorm

ARITH = ["ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"]
PARAMS = {"s": rng_array((8,), 1, 0.5, 1.5), "b": rng_array((8,), 2)}
X = {"x": rng_array((2, 5, 8), 3, -3, 3)}


@pytest.mark.parametrize("opset", [17, 18])  # ReduceMean axes attribute / input
def test_decompose(opset: int) -> None:
    m = build(
        f"""<ir_version: 9, opset_import: ["" : {opset}]>
        g (float[2,5,8] x) => (float[2,5,8] y) {{
            y = LayerNormalization <axis=-1, epsilon=0.001> (x, s, b)
        }}""",
        PARAMS,
    )
    res = decompose_layernorm(m)
    assert op_types(res.model) == ARITH and res.exact
    onnx.checker.check_model(res.model, full_check=True)
    assert_same_outputs(m, res.model, X)


def test_decompose_positive_axis_two_trailing_dims() -> None:
    m = build(
        """<ir_version: 9, opset_import: ["" : 17]>
        g (float[2,5,8] x) => (float[2,5,8] y) { y = LayerNormalization <axis=1> (x, s2) }""",
        {"s2": rng_array((5, 8), 4, 0.5, 1.5)},
    )
    res = decompose_layernorm(m)
    assert "axes [-2, -1]" in res.changes[0].detail
    assert_same_outputs(m, res.model, X)


def test_decompose_refuses_when_mean_output_is_read() -> None:
    m = build(
        """<ir_version: 9, opset_import: ["" : 17]>
        g (float[2,5,8] x) => (float[2,5,8] y, float[2,5,1] mu) { y, mu = LayerNormalization (x, s, b) }""",
        PARAMS,
    )
    res = decompose_layernorm(m)
    assert not res.changes and "Mean/InvStdDev" in res.refusals[0].reason


def arithmetic(
    opset: int, square: str = "p = Pow (d, two)", tail: str = "t = Mul (n, s)\n y = Add (t, b)"
) -> str:
    return f"""<ir_version: 9, opset_import: ["" : {opset}]>
    g (float[2,5,8] x) => (float[2,5,8] y) {{
        m = ReduceMean <axes=[-1]> (x)
        d = Sub (x, m)
        {square}
        v = ReduceMean <axes=[-1]> (p)
        ve = Add (v, eps)
        sd = Sqrt (ve)
        n = Div (d, sd)
        t = Mul (n, s)
        y = Add (t, b)
    }}"""


CONSTS = {**PARAMS, "two": np.array(2.0, np.float32), "eps": np.array(1e-5, np.float32)}


@pytest.mark.parametrize("square", ["p = Pow (d, two)", "p = Mul (d, d)"])
def test_fuse(square: str) -> None:
    m = build(arithmetic(17, square), CONSTS)
    res = fuse_layernorm(m)
    assert op_types(res.model) == ["LayerNormalization"] and not res.refusals
    read_before = {i for n in m.graph.node for i in n.input}
    left = {t.name for t in res.model.graph.initializer} - {"layernorm:y/scale", "layernorm:y/bias"}
    assert left == set(CONSTS) - read_before  # constants the pattern read are pruned
    onnx.checker.check_model(res.model, full_check=True)
    assert_same_outputs(m, res.model, X)


def test_fuse_refuses_below_opset_17() -> None:
    res = fuse_layernorm(build(arithmetic(13), CONSTS))
    assert not res.changes and "opset >= 17, the model imports 13" in res.refusals[0].reason


def test_fuse_refuses_shared_intermediate() -> None:
    text = arithmetic(17).replace("=> (float[2,5,8] y)", "=> (float[2,5,8] y, float[2,5,1] sd)")
    res = fuse_layernorm(build(text, CONSTS))
    assert not res.changes and "'sd' has another consumer" in res.refusals[0].reason


@pytest.mark.real
def test_ppocrv4_rec_round_trip(assets) -> None:  # type: ignore[no-untyped-def]
    model = onnx.load(asset_model(assets, "ppocrv4_rec"))
    refused = fuse_layernorm(model)
    assert not refused.changes and len(refused.refusals) == 5  # opset 12: says so, changes nothing
    m17 = version_converter.convert_version(model, 17)
    fused = fuse_layernorm(m17)
    assert len(fused.changes) == 5 and op_types(fused.model).count("LayerNormalization") == 5
    onnx.checker.check_model(fused.model, full_check=True)
    back = decompose_layernorm(fused.model)
    assert len(back.changes) == 5 and "LayerNormalization" not in op_types(back.model)
    onnx.checker.check_model(back.model, full_check=True)
    x = calib_images(asset_calib(assets, "ppocrv4_rec"), limit=1)[0]
    assert_same_outputs(model, fused.model, {"x": x})
    assert_same_outputs(model, back.model, {"x": x})
