"""LayerNorm as jax2tf writes flax's `nn.LayerNorm` and tf2onnx exports it: one site, none of its insides.

The spelling is copied node for node from magika's byte classifier (zoo entry magika_v3_3, magika==1.0.3):
sums with keepdims=0 over an axes input, each times the constant 1/C (`truediv_recip`), the variance as
E[x²] − E[x]² clamped by Max(0, ·), both statistics put back by Reshape then Expand to a shape built at
run time from Shape/Slice/Concat/Cast, 1/√ as Sqrt then Reciprocal, the scale folded into 1/√ before the
multiplication (flax: `mul = rsqrt(var + eps) * scale; y = (x - mean) * mul + bias`). magika normalises
axis 1 of an [N, 512, 256] tensor (LayerNorm_0) and the last axis of an [N, 512] one (LayerNorm_1); the
graphs here do the same at smaller sizes. The oracle for the arithmetic is the LayerNorm formula in
numpy against onnx's ReferenceEvaluator; near misses (a sum scaled by anything but 1/C, a second moment
over other axes, a clamp at a nonzero floor) must not match.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import quantscan
from quantscan.graph.index import GraphIndex
from quantscan.patterns import layernorm_moments
from quantscan.patterns.layernorm import LayerNormMatch
from quantscan.rewrites.fuse_layernorm import fuse_layernorm

EPS = 1e-6


def _layernorm_nodes(x: str, p: str, shape_of_stats: str, recip: str, floor: str, sum2_axes: str
                     ) -> list[onnx.NodeProto]:
    """magika's LayerNorm nodes over `x` (names prefixed `p`), in its graph order."""
    n = helper.make_node
    return [
        n("ReduceSum", [x, "axes"], [f"{p}sum"], keepdims=0, noop_with_empty_axes=1),
        n("Mul", [x, x], [f"{p}square"]),
        n("ReduceSum", [f"{p}square", sum2_axes], [f"{p}sum1"], keepdims=0, noop_with_empty_axes=1),
        n("Mul", [f"{p}sum1", recip], [f"{p}truediv_1"]),
        n("Mul", [f"{p}sum", recip], [f"{p}truediv"]),
        n("Mul", [f"{p}truediv", f"{p}truediv"], [f"{p}square_1"]),
        n("Sub", [f"{p}truediv_1", f"{p}square_1"], [f"{p}sub"]),
        n("Max", [floor, f"{p}sub"], [f"{p}maximum"]),
        n("Reshape", [f"{p}maximum", shape_of_stats], [f"{p}reshape_1"]),
        n("Expand", [f"{p}reshape_1", shape_of_stats], [f"{p}broadcast_1"]),
        n("Add", [f"{p}broadcast_1", "eps"], [f"{p}addv2"]),
        n("Sqrt", [f"{p}addv2"], [f"{p}rsqrt"]),
        n("Reciprocal", [f"{p}rsqrt"], [f"{p}rsqrt_r"]),
        n("Mul", [f"{p}rsqrt_r", f"{p}scale"], [f"{p}mul"]),
        n("Reshape", [f"{p}truediv", shape_of_stats], [f"{p}reshape"]),
        n("Expand", [f"{p}reshape", shape_of_stats], [f"{p}broadcast"]),
        n("Sub", [x, f"{p}broadcast"], [f"{p}sub_1"]),
        n("Mul", [f"{p}sub_1", f"{p}mul"], [f"{p}mul_1"]),
        n("Add", [f"{p}mul_1", f"{p}bias"], [f"{p}y"]),
    ]


INSIDE = ("sum", "square", "sum1", "truediv_1", "truediv", "square_1", "sub", "maximum", "reshape_1",
          "broadcast_1", "addv2", "rsqrt", "rsqrt_r", "mul", "reshape", "broadcast", "sub_1", "mul_1")


def classifier(c: int = 16, t: int = 8, recip: float | None = None, floor: float = 0.0,
               sum2_axis: int = 1) -> onnx.ModelProto:
    """x [N, 4] -> Dense to [N, C·T] -> reshape [N, C, T] -> LayerNorm over axis 1 (LayerNorm_0) ->
    max over T -> [N, C] -> LayerNorm over the last axis (LayerNorm_1) -> Dense head [N, 3]."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    k = 1.0 / c if recip is None else recip
    inits = [
        numpy_helper.from_array(rng.normal(0, 1, (4, c * t)).astype(np.float32), "w0"),
        numpy_helper.from_array(rng.normal(2, 1, c * t).astype(np.float32), "b0"),  # an offset: mean ≠ 0
        numpy_helper.from_array(rng.normal(0, 0.5, (c, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(np.array([1], np.int64), "axes"),
        numpy_helper.from_array(np.array([2], np.int64), "axes2"),
        numpy_helper.from_array(np.array(k, np.float32), "recip"),
        numpy_helper.from_array(np.array(floor, np.float32), "floor"),
        numpy_helper.from_array(np.array(EPS, np.float32), "eps"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([c], np.int64), "c"), numpy_helper.from_array(np.array([t], np.int64), "t"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, (1, c, 1)).astype(np.float32), "ln0/scale"),
        numpy_helper.from_array(rng.normal(0, 0.2, (1, c, 1)).astype(np.float32), "ln0/bias"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, (1, c)).astype(np.float32), "ln1/scale"),
        numpy_helper.from_array(rng.normal(0, 0.2, (1, c)).astype(np.float32), "ln1/bias"),
    ]
    axes2 = "axes" if sum2_axis == 1 else "axes2"
    nodes = [
        n("Shape", ["x"], ["shape"]), n("Slice", ["shape", "zero", "one", "zero"], ["batch"]),
        n("Concat", ["batch", "c", "t"], ["shape3"], axis=0),
        n("Concat", ["batch", "one", "t"], ["stats0"], axis=0),  # [N, 1, T]: axis 1 put back
        n("Concat", ["batch", "one"], ["stats1"], axis=0),  # [N, 1]
        n("MatMul", ["x", "w0"], ["d0"]), n("Add", ["d0", "b0"], ["h0"]), n("Reshape", ["h0", "shape3"], ["h"]),
        *_layernorm_nodes("h", "ln0/", "stats0", "recip", "floor", axes2),
        n("ReduceMax", ["ln0/y"], ["pooled"], axes=[2], keepdims=0),
        *_layernorm_nodes("pooled", "ln1/", "stats1", "recip", "floor", "axes"),
        n("MatMul", ["ln1/y", "w1"], ["logits"]),
    ]
    graph = helper.make_graph(nodes, "jax2tf_layernorm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 3])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    onnx.checker.check_model(model, full_check=True)
    return model


def layernorm(x: np.ndarray, axis: int, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The textbook LayerNorm over one axis, in float64 (the oracle)."""
    x = x.astype(np.float64)
    mean = x.mean(axis=axis, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axis, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * scale + bias


def test_the_graph_computes_layernorm() -> None:
    """The copied spelling is a LayerNorm (so the tests below are about the real thing)."""
    model = classifier()
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    h, y0, pooled, y1 = ReferenceEvaluator(model).run(["h", "ln0/y", "pooled", "ln1/y"], {"x": x})
    np.testing.assert_allclose(y0, layernorm(h, 1, inits["ln0/scale"], inits["ln0/bias"]), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y1, layernorm(pooled, 1, inits["ln1/scale"], inits["ln1/bias"]), rtol=1e-4, atol=1e-4)


def _matches(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]] | None = None) -> list[LayerNormMatch]:
    return _matches_in(_index(model, shapes))


def _index(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]] | None = None) -> GraphIndex:
    index = GraphIndex.of(model)
    index.observe_shapes(shapes or {})
    return index


def _matches_in(index: GraphIndex) -> list[LayerNormMatch]:
    return [m for node in index.nodes if isinstance(m := layernorm_moments.match_at(index, node), LayerNormMatch)]


def test_the_pattern_reads_axes_eps_scale_and_bias() -> None:
    """Without shapes the extent C comes from the scale's size (flax's scale has the normalised shape)."""
    index = _index(classifier())
    found = _matches_in(index)
    assert [(m.x, m.axes, m.scale, m.bias, m.output) for m in found] == [
        ("h", (1,), "ln0/scale", "ln0/bias", "ln0/y"), ("pooled", (1,), "ln1/scale", "ln1/bias", "ln1/y")]
    assert all(np.isclose(m.eps, EPS) for m in found)
    assert {n.output[0] for n in found[0].nodes} == {f"ln0/{t}" for t in INSIDE} | {"ln0/y"}
    assert not any(m.shared(index) for m in found)


@pytest.mark.parametrize(("recip", "why"), [(1 / 17, "not 1/16"), (1.0, "not 1/16")])
def test_a_sum_not_scaled_by_one_over_c_is_no_layernorm(recip: float, why: str) -> None:
    """Σx·k with k ≠ 1/C is not a mean: the same nodes compute no LayerNorm, and none is matched."""
    index = GraphIndex.of(classifier(recip=recip))
    result = layernorm_moments.match_at(index, index.nodes[[n.output[0] for n in index.nodes].index("ln0/sum")])
    assert not isinstance(result, LayerNormMatch) and why in result.reason


def test_the_extent_is_read_from_observed_shapes_before_the_scale() -> None:
    """With the probe's shapes the 1/C check uses x's extent over the axes: a model whose scale has
    another size still matches when 1/C is right, and a wrong C is caught even if the scale agreed."""
    shapes = {"h": (5, 16, 8), "pooled": (5, 16), "ln0/reshape": (5, 1, 8), "ln0/broadcast": (5, 1, 8),
              "ln0/reshape_1": (5, 1, 8), "ln0/broadcast_1": (5, 1, 8), "ln1/reshape": (5, 1),
              "ln1/broadcast": (5, 1), "ln1/reshape_1": (5, 1), "ln1/broadcast_1": (5, 1)}
    assert len(_matches(classifier(), shapes)) == 2
    wrong = {**shapes, "h": (5, 17, 8)}
    assert [m.x for m in _matches(classifier(), wrong)] == ["pooled"]
    misplaced = {**shapes, "ln0/broadcast": (5, 16, 1)}  # the mean put back along the wrong axis
    assert [m.x for m in _matches(classifier(), misplaced)] == ["pooled"]


def test_near_misses_are_not_layernorms() -> None:
    """A second moment over another axis, or a clamp at 0.01, is other arithmetic: LayerNorm_0 not matched."""
    assert [m.x for m in _matches(classifier(sum2_axis=2))] == ["pooled"]
    assert _matches(classifier(floor=0.01)) == []


def _scan(tmp_path: Path, model: onnx.ModelProto) -> quantscan.ScanResult:
    path = tmp_path / "ln.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", np.random.default_rng(2).normal(size=(8, 4)).astype(np.float32))
    return quantscan.scan(path, calib, gain_candidates=0, no_report=True, quiet=True)


def test_each_jax2tf_layernorm_is_one_site_without_qdq_inside(tmp_path: Path) -> None:
    result = _scan(tmp_path, classifier())
    kernels = [s.kernel for s in result.sites]
    assert sum(k.startswith("LayerNorm[") for k in kernels) == 2, kernels
    # the input, Dense+bias, LayerNorm_0, the max over T, LayerNorm_1, the head
    assert [k.split("[")[0] for k in kernels] == ["input", "MatMul+Add", "LayerNorm", "ReduceMax", "LayerNorm",
                                                  "MatMul"], kernels
    inside = {f"{p}{t}" for p in ("ln0/", "ln1/") for t in INSIDE}
    quantized = {n.input[0].removesuffix("__f32") for n in result.qdq_model.graph.node if n.op_type == "QuantizeLinear"}
    assert not quantized & inside


def test_a_wrong_mean_stays_separate_sites(tmp_path: Path) -> None:
    """The grouping can fail: with the sums scaled by 1/17 the insides are sites of their own."""
    kernels = [s.kernel for s in _scan(tmp_path, classifier(recip=1 / 17)).sites]
    assert not any(k.startswith("LayerNorm[") for k in kernels) and "Sqrt" in kernels


def test_fuse_layernorm_fuses_the_trailing_one_and_refuses_the_other() -> None:
    """`fuse-layernorm` reads the same match: LayerNorm_1 (last axis) becomes one LayerNormalization with
    flax's scale and bias, LayerNorm_0 (axis 1 of 3) is refused as a non-trailing range; the fused model
    computes what the spelled-out one does (onnx's ReferenceEvaluator on both)."""
    model = classifier()
    model.opset_import[0].version = 17  # LayerNormalization's opset
    result = fuse_layernorm(model)
    fused = [n for n in result.model.graph.node if n.op_type == "LayerNormalization"]
    assert [n.input[0] for n in fused] == ["pooled"] and [c.node for c in result.changes] == ["ReduceSum:ln1/sum"]
    assert [r.node for r in result.refusals] == ["ReduceSum:ln0/sum"] and "trailing" in result.refusals[0].reason
    assert not {n.output[0] for n in result.model.graph.node} & {f"ln1/{t}" for t in INSIDE}
    x = np.random.default_rng(3).normal(size=(5, 4)).astype(np.float32)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    (got,) = ReferenceEvaluator(result.model).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
