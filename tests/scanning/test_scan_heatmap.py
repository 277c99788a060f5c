"""`--task heatmap`: peak-location agreement and per-channel figures of multi-channel score maps, NCHW or
NHWC, and `--output NAME` as the documented choice of the headline (a U-Net's 32-channel `feature` map
beside its `score` map: the headline should be the score).

Oracles written out here: per sample and channel, the argmax pixel by explicit loops; cosine and SQNR by
their formulas; the FP32 and saved QDQ models run by onnx's ReferenceEvaluator.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnx.version_converter
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import quantscan
from quantscan.errors import UsageError
from quantscan.taskmetrics import HeatmapAccumulator, heatmap_layout


def _peaks_by_loops(ref: np.ndarray, test: np.ndarray) -> tuple[float, float]:
    """(same pixel, within 1 pixel) shares of (sample, channel) peaks, NCHW maps, by explicit loops."""
    same = near = total = 0
    for i in range(ref.shape[0]):
        for c in range(ref.shape[1]):
            ry, rx = np.unravel_index(int(np.argmax(ref[i, c])), ref.shape[2:])
            ty, tx = np.unravel_index(int(np.argmax(test[i, c])), test.shape[2:])
            total += 1
            same += int((ry, rx) == (ty, tx))
            near += int(max(abs(int(ry) - int(ty)), abs(int(rx) - int(tx))) <= 1)
    return same / total, near / total


def _cosine(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    return float((x * y).sum() / math.sqrt((x * x).sum() * (y * y).sum()))


def _maps(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """FP32-like maps with one blob per channel, and a noisy copy whose channel 2 is starved and shifted."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:12, 0:10]
    ref = np.zeros((6, 3, 12, 10))
    for i in range(6):
        for c in range(3):
            cy, cx = rng.integers(1, 11), rng.integers(1, 9)
            ref[i, c] = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / 4.0)
    test = ref + rng.normal(0, 0.05, ref.shape)
    test[:, 2] = np.roll(ref[:, 2], 1, axis=2) * 0.3 + rng.normal(0, 0.05, ref[:, 2].shape)
    return ref.astype(np.float32), test.astype(np.float32)


def test_figures_match_the_written_out_oracle_in_both_layouts() -> None:
    ref, test = _maps()
    same, near = _peaks_by_loops(ref, test)
    for layout, r, t in (("NCHW", ref, test), ("NHWC", ref.transpose(0, 2, 3, 1), test.transpose(0, 2, 3, 1))):
        assert heatmap_layout(r.shape) == layout
        acc = HeatmapAccumulator()
        acc.update(r, t, None)
        got = acc.results()
        assert got["peak_agreement"] == pytest.approx(same) and got["peak_within_1px"] == pytest.approx(near)
        assert got["score_cosine"] == pytest.approx(_cosine(ref, test), abs=1e-9)
        d = (ref.astype(np.float64) - test) ** 2
        assert got["score_sqnr_db"] == pytest.approx(10 * math.log10((ref.astype(np.float64) ** 2).sum() / d.sum()))
        per_channel = [_cosine(ref[:, c], test[:, c]) for c in range(3)]
        assert got["worst_channel"] == 2 and got["worst_channel_cosine"] == pytest.approx(min(per_channel))
        assert got["channels"] == 3
    assert 0 < same < near <= 1  # the shifted channel's peaks moved by one pixel: near, not same


def test_merge_of_two_halves_equals_one_pass() -> None:
    ref, test = _maps(1)
    whole, first, second = HeatmapAccumulator(), HeatmapAccumulator(), HeatmapAccumulator()
    whole.update(ref, test, None)
    first.update(ref[:2], test[:2], None)
    second.update(ref[2:], test[2:], None)
    first.merge(second)
    assert first.results() == pytest.approx(whole.results())


def test_a_map_of_another_rank_is_refused() -> None:
    with pytest.raises(UsageError, match="--task heatmap: expected"):
        heatmap_layout((4, 16))


def unet_like(nhwc: bool) -> onnx.ModelProto:
    """image -> Conv 3->8 (`feature`, a graph output) -> Conv 8->2 -> Sigmoid (`score`, NCHW or NHWC)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.4, (2, 8, 3, 3)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array([-1.0, -2.0], np.float32), "b2")]
    nodes = [helper.make_node("Conv", ["image", "w1"], ["f0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["f0"], ["feature"]),
             helper.make_node("Conv", ["feature", "w2", "b2"], ["s0"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["s0"], ["s1" if nhwc else "score"])]
    score_shape = ["N", 16, 16, 2] if nhwc else ["N", 2, 16, 16]
    if nhwc:
        nodes.append(helper.make_node("Transpose", ["s1"], ["score"], perm=[0, 2, 3, 1]))
    graph = helper.make_graph(nodes, "unet_like", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                              ["N", 3, 16, 16])], [helper.make_tensor_value_info("feature", TensorProto.FLOAT,
                              ["N", 8, 16, 16]), helper.make_tensor_value_info("score", TensorProto.FLOAT,
                              score_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("nhwc", [False, True])
def test_scan_headline_is_the_chosen_output_and_its_peaks_match_the_reference(tmp_path: Path, nhwc: bool) -> None:
    path = tmp_path / "unet.onnx"
    onnx.save(unet_like(nhwc), path)
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(1)
    images = [rng.uniform(0, 1, (2, 3, 16, 16)).astype(np.float32) for _ in range(4)]
    for i, a in enumerate(images):
        np.savez(calib / f"{i}.npz", image=a)
    qdq = tmp_path / "q.onnx"
    result = quantscan.scan(path, calib, task="heatmap", output=["score"], save_qdq=qdq, gain_candidates=0,
                            quiet=True)
    assert result.headline.output == "score" and list(result.output_metrics) == ["score"]
    fp32 = ReferenceEvaluator(str(path))
    # raised to opset 21: onnx.reference has DequantizeLinear from 19 on
    fq = ReferenceEvaluator(onnx.version_converter.convert_version(onnx.load(qdq), 21))
    ref = np.concatenate([fp32.run(["score"], {"image": a})[0] for a in images])
    test = np.concatenate([fq.run(["score"], {"image": a})[0] for a in images])
    if nhwc:
        ref, test = ref.transpose(0, 3, 1, 2), test.transpose(0, 3, 1, 2)
    same, near = _peaks_by_loops(ref, test)
    task = result.output_metrics["score"].task
    assert task["peak_agreement"] == pytest.approx(same) and task["peak_within_1px"] == pytest.approx(near)
    assert task["score_cosine"] == pytest.approx(_cosine(ref, test), abs=1e-5)
    assert task["channels"] == 2


def split_head() -> onnx.ModelProto:
    """A YOLOv8-like split head [N, 4+2, A]: 4 box coordinates in pixels (x100) beside 2 sigmoid scores."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.3, (4, 8, 1, 1)).astype(np.float32), "wb"),
             numpy_helper.from_array(rng.normal(0, 0.3, (2, 8, 1, 1)).astype(np.float32), "ws"),
             numpy_helper.from_array(np.array(100.0, np.float32), "pixels"),
             numpy_helper.from_array(np.array([0, 0, -1], np.int64), "flat")]
    nodes = [helper.make_node("Conv", ["image", "w1"], ["f0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["f0"], ["f"]),
             helper.make_node("Conv", ["f", "wb"], ["b0"]), helper.make_node("Mul", ["b0", "pixels"], ["b1"]),
             helper.make_node("Conv", ["f", "ws"], ["s0"]), helper.make_node("Sigmoid", ["s0"], ["s1"]),
             helper.make_node("Concat", ["b1", "s1"], ["c"], axis=1),
             helper.make_node("Reshape", ["c", "flat"], ["output0"])]
    graph = helper.make_graph(nodes, "split_head", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                              ["N", 3, 16, 16])], [helper.make_tensor_value_info("output0", TensorProto.FLOAT,
                              ["N", 6, 256])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model, full_check=True)
    return model


def _sqnr(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x.astype(np.float64), y.astype(np.float64)
    return float(10 * np.log10((x * x).sum() / ((x - y) ** 2).sum()))


def test_channel_groups_measure_a_split_head_per_group(tmp_path: Path) -> None:
    path = tmp_path / "head.onnx"
    onnx.save(split_head(), path)
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(4)
    images = [rng.uniform(0, 1, (2, 3, 16, 16)).astype(np.float32) for _ in range(4)]
    for i, a in enumerate(images):
        np.savez(calib / f"{i}.npz", image=a)
    qdq = tmp_path / "q.onnx"
    result = quantscan.scan(path, calib, task="none", channel_groups=["output0=box:0-3,scores:4-5"], save_qdq=qdq,
                            gain_candidates=0, quiet=True)
    fp32 = ReferenceEvaluator(str(path))
    fq = ReferenceEvaluator(onnx.version_converter.convert_version(onnx.load(qdq), 21))
    ref = np.concatenate([fp32.run(None, {"image": a})[0] for a in images])
    test = np.concatenate([fq.run(None, {"image": a})[0] for a in images])
    task = result.output_metrics["output0"].task
    for label, rows in (("box", slice(0, 4)), ("scores", slice(4, 6))):
        assert task[f"{label}_cosine"] == pytest.approx(_cosine(ref[:, rows], test[:, rows]), abs=1e-5)
        assert task[f"{label}_sqnr_db"] == pytest.approx(_sqnr(ref[:, rows], test[:, rows]), abs=0.05)
    # the pooled figure is the pixels' alone: the scores' own figure differs from it by dB
    pooled = result.output_metrics["output0"].sqnr_db
    assert pooled == pytest.approx(_sqnr(ref, test), abs=0.05) and pooled == pytest.approx(task["box_sqnr_db"], abs=0.1)
    assert abs(task["scores_sqnr_db"] - pooled) > 3


def test_channel_groups_spec_is_checked_before_any_pass(tmp_path: Path) -> None:
    path = tmp_path / "head.onnx"
    onnx.save(split_head(), path)
    with pytest.raises(UsageError, match="--channel-groups: expected OUTPUT"):
        quantscan.scan(path, tmp_path, channel_groups=["output0=box:3-1"])
