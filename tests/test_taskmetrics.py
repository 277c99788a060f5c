"""Task metrics against oracles written out here: argmax loops, hand-made CTC logits, hand-made masks.

Each oracle is computed a second way (plain Python loops or numbers worked by hand), never by calling
the module under test; merging two halves must give the same figures as one pass.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnx.version_converter
import pytest
from onnx.reference import ReferenceEvaluator

from quantscan import taskmetrics as tm
from quantscan.errors import UsageError


def _argmax_loop(row: np.ndarray) -> int:
    best = 0
    for i, v in enumerate(row):
        if v > row[best]:
            best = i
    return best


def test_top1_agreement_and_accuracy_match_a_written_out_argmax() -> None:
    rng = np.random.default_rng(3)
    ref = rng.normal(size=(20, 10)).astype(np.float32)
    test = ref + rng.normal(scale=0.6, size=ref.shape).astype(np.float32)
    labels: list[int | None] = [int(v) for v in rng.integers(0, 10, 20)]
    labels[3] = None
    acc = tm.ClassifyAccumulator()
    acc.update(ref, test, labels)
    r = [_argmax_loop(row) for row in ref]
    t = [_argmax_loop(row) for row in test]
    agree = sum(a == b for a, b in zip(r, t, strict=True)) / 20
    known = [(lab, a, b) for lab, a, b in zip(labels, r, t, strict=True) if lab is not None]
    got = acc.results()
    assert got["top1_agreement"] == pytest.approx(agree)
    assert got["top1_accuracy"] == pytest.approx(sum(lab == b for lab, _, b in known) / len(known))
    assert got["fp32_top1_accuracy"] == pytest.approx(sum(lab == a for lab, a, _ in known) / len(known))
    top5 = [sorted(range(10), key=lambda i, row=row: -row[i])[:5] for row in test]  # type: ignore[misc]
    assert got["top5_agreement"] == pytest.approx(sum(a in s for a, s in zip(r, top5, strict=True)) / 20)


def test_classify_merge_equals_one_pass() -> None:
    rng = np.random.default_rng(4)
    ref, test = rng.normal(size=(12, 7)), rng.normal(size=(12, 7))
    labels: list[int | None] = [i % 7 for i in range(12)]
    whole, a, b = tm.ClassifyAccumulator(), tm.ClassifyAccumulator(), tm.ClassifyAccumulator()
    whole.update(ref, test, labels)
    a.update(ref[:5], test[:5], labels[:5])
    b.update(ref[5:], test[5:], labels[5:])
    a.merge(b)
    assert a.sums() == whole.sums()
    assert a.results() == whole.results()


def _logits(steps: list[int], classes: int) -> np.ndarray:
    """A [T, C] one-hot-ish logit sequence: class steps[t] wins at step t."""
    out = np.full((len(steps), classes), -5.0, np.float32)
    out[np.arange(len(steps)), steps] = 5.0
    return out


def test_ctc_greedy_decode_and_agreement_on_hand_made_logits() -> None:
    charset = tm.Charset(("", "a", "b", "c"))
    # "a a _ a b b" decodes to "aab" (repeat collapsed, blank separates the second a)
    ref = np.stack([_logits([1, 1, 0, 1, 2, 2], 4), _logits([3, 0, 3, 3, 0, 0], 4)])
    test = np.stack([_logits([1, 1, 1, 1, 2, 2], 4), _logits([3, 0, 3, 3, 0, 0], 4)])
    assert tm.greedy_decode(ref, charset) == ["aab", "cc"]
    assert tm.greedy_decode(test, charset) == ["ab", "cc"]
    acc = tm.CtcAccumulator(charset)
    acc.update(ref, test, None)
    got = acc.results()
    assert got["string_agreement"] == 0.5
    assert got["cer"] == pytest.approx(1 / 5)  # one deletion over "aab"+"cc" = 5 reference characters


def test_ctc_blank_index_from_charset_json_and_ppocr_space(tmp_path: Path) -> None:
    (tmp_path / "charset.json").write_text('{"characters": ["x", "y"], "blank": 2}', encoding="utf-8")
    cs = tm.load_charset(tmp_path / "charset.json")
    assert cs.symbols == ("x", "y", "") and cs.blank == 2
    assert tm.greedy_decode(_logits([0, 2, 0, 1], 3), cs) == ["xxy"]
    (tmp_path / "keys.txt").write_text("x\ny\n", encoding="utf-8")
    keys = tm.load_charset(tmp_path / "keys.txt").fitted(4)  # PP-OCR: blank, keys, then a space class
    assert tm.greedy_decode(_logits([1, 3, 2], 4), keys) == ["x y"]


def test_edit_distance_worked_by_hand() -> None:
    assert tm.edit_distance("kitten", "sitting") == 3
    assert tm.edit_distance("", "abc") == 3
    assert tm.edit_distance("abc", "abc") == 0


def _levenshtein(a: str, b: str) -> int:
    """The textbook full-table recurrence, written out: the oracle for the vectorised rows."""
    d = [[i + j if i == 0 or j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return d[-1][-1]


def test_edit_distance_matches_the_full_table_on_random_and_unicode_strings() -> None:
    rng = np.random.default_rng(7)
    alphabet = list("ab<>/td") + ["é", "表", "\U0001F600"]
    for _ in range(200):
        a = "".join(rng.choice(alphabet, size=int(rng.integers(0, 14))))
        b = "".join(rng.choice(alphabet, size=int(rng.integers(0, 14))))
        assert tm.edit_distance(a, b) == _levenshtein(a, b), (a, b)
    long_a, long_b = ("".join(rng.choice(alphabet, size=n)) for n in (300, 250))
    assert tm.edit_distance(long_a, long_b) == _levenshtein(long_a, long_b)


def test_mask_iou_on_hand_made_masks() -> None:
    ref = np.zeros((2, 1, 4, 4), np.float32)
    test = np.zeros((2, 1, 4, 4), np.float32)
    ref[0, 0, :2, :2] = 0.9  # 4 pixels
    test[0, 0, :2, :3] = 0.8  # 6 pixels, 4 shared: IoU 4/6
    test[1, 0, 0, 0] = 0.4  # below the threshold: both empty, IoU 1
    acc = tm.MaskIouAccumulator(threshold=0.5)
    acc.update(ref, test, None)
    got = acc.results()
    assert got["mask_iou"] == pytest.approx((4 / 6 + 1.0) / 2)
    assert got["mask_iou_pooled"] == pytest.approx(4 / 6)


def test_detect_task_from_shapes_and_files() -> None:
    cs = tm.Charset(("", "a", "b"))
    assert tm.detect_task([1, 40, 3], cs, False) == "ctc"
    assert tm.detect_task([1, 40, 4], cs, False) == "ctc"  # PP-OCR's extra space class
    assert tm.detect_task([1, 4], None, True) == "classify"
    assert tm.detect_task([1, 1, 64, 64], None, False) == "mask"
    assert tm.detect_task([1, 40, 3], None, False) == "none"


def test_plugin_sums_merge_and_bad_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_metric.py").write_text(
        "import numpy as np\n"
        "def sign_flips(ref, test):\n"
        "    return {'flips': float(np.count_nonzero(np.sign(ref) != np.sign(test))), 'n': float(ref.size)}\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    acc = tm.load_plugin("my_metric:sign_flips")
    other = tm.load_plugin("my_metric:sign_flips")
    acc.update(np.array([1.0, -1.0, 2.0]), np.array([1.0, 1.0, -2.0]), None)
    other.update(np.array([-1.0]), np.array([-1.0]), None)
    acc.merge(other)
    assert acc.results() == {"flips": 2.0, "n": 4.0}
    sys.modules.pop("my_metric", None)
    for bad in ("nocolon", "no_such_module_qs:f", "my_metric:missing"):
        with pytest.raises(UsageError):
            tm.load_plugin(bad)


def test_scan_reports_task_metrics_and_plugin_on_a_tiny_classifier(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: a Gemm+Softmax classifier; top-1 agreement equals a written-out argmax over onnx's
    ReferenceEvaluator running the FP32 and the saved QDQ model; figures reach run.json, task.csv, summary.md."""
    from quantscan.api import scan

    model = onnx.parser.parse_model("""
    <ir_version: 8, opset_import: ["" : 13]>
    g (float[N, 6] x) => (float[N, 5] y) {
      h = Gemm <transB = 1> (x, w, b)
      y = Softmax <axis = 1> (h)
    }
    """)
    rng = np.random.default_rng(0)
    model.graph.initializer.extend([
        onnx.numpy_helper.from_array(rng.normal(size=(5, 6)).astype(np.float32), "w"),
        onnx.numpy_helper.from_array(rng.normal(size=5).astype(np.float32), "b"),
    ])
    path = tmp_path / "clf.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(6):
        np.savez(calib / f"{i:03d}.npz", x=rng.normal(size=(1, 6)).astype(np.float32))
    (tmp_path / "plug_metric.py").write_text(
        "def count(ref, test):\n    return {'samples_seen': float(ref.shape[0])}\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    result = scan(path, calib, out=tmp_path / "run", no_report=True, metric=["plug_metric:count"],
                  save_qdq=tmp_path / "q.onnx")
    figures = result.output_metrics["y"].task
    xs = np.concatenate([np.load(calib / f"{i:03d}.npz")["x"] for i in range(6)])
    fp32 = ReferenceEvaluator(onnx.version_converter.convert_version(onnx.load(path), 21)).run(None, {"x": xs})[0]
    int8 = ReferenceEvaluator(onnx.version_converter.convert_version(onnx.load(tmp_path / "q.onnx"), 21)).run(
        None, {"x": xs})[0]
    agree = sum(_argmax_loop(a) == _argmax_loop(b) for a, b in zip(fp32, int8, strict=True)) / 6
    assert figures["top1_agreement"] == pytest.approx(agree)
    assert figures["plug_metric:count:samples_seen"] == 6.0
    run = (tmp_path / "run" / "run.json").read_text(encoding="utf-8")
    assert '"top5_agreement"' in run
    table = (tmp_path / "run" / "task.csv").read_text(encoding="utf-8")
    assert "classify,top1_agreement" in table and "plugin,samples_seen,6.0" in table
    assert "## Task metrics" in (tmp_path / "run" / "summary.md").read_text(encoding="utf-8")
    sys.modules.pop("plug_metric", None)
    assert not math.isnan(figures["top5_agreement"])


# --- detection boxes: oracles worked by hand ---------------------------------------------------------


def test_box_iou_worked_by_hand() -> None:
    a = np.array([[0, 0, 2, 2]], np.float64)  # area 4
    b = np.array([[1, 1, 3, 3], [0, 0, 2, 2], [5, 5, 6, 6]], np.float64)  # overlap 1, 4, 0
    assert tm.box_iou(a, b)[0].tolist() == pytest.approx([1 / 7, 1.0, 0.0])


def test_nms_keeps_the_best_of_overlapping_boxes_per_class() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 0, 11, 10], [0, 0, 10, 10], [50, 50, 60, 60]], np.float64)
    scores = np.array([0.9, 0.8, 0.7, 0.6])
    classes = np.array([0, 0, 1, 0])
    # box 1 overlaps box 0 by 90/110 > 0.45 (same class): gone; box 2 is another class: stays
    assert sorted(tm.nms(boxes, scores, classes, 0.45).tolist()) == [0, 2, 3]


def _yolox_head(boxes: list[tuple[float, float, float, float, float]], side: int = 64) -> np.ndarray:
    """A raw [A, 6] YOLOX head for a square input: each (cx, cy, w, h, score) encoded at stride 8
    (cell = centre // 8, offset = centre / 8 - cell, log size = ln(size / 8)); every other cell 0."""
    cells = [(side // s) ** 2 for s in (8, 16, 32)]
    head = np.zeros((sum(cells), 6), np.float32)
    head[:, 2:4] = np.log(1 / 8)
    g = side // 8
    for cx, cy, w, h, score in boxes:
        col, row = int(cx // 8), int(cy // 8)
        head[row * g + col] = [cx / 8 - col, cy / 8 - row, math.log(w / 8), math.log(h / 8), score, 1.0]
    return head


def test_yolox_decode_reads_back_hand_encoded_boxes() -> None:
    head = _yolox_head([(20.0, 36.0, 16.0, 8.0, 0.9)])
    grid = tm.yolox_grid(head.shape[0], None)
    assert grid is not None
    boxes, scores, _ = tm.decode_yolox(head, *grid)
    best = int(np.argmax(scores))
    assert boxes[best].tolist() == pytest.approx([12.0, 32.0, 28.0, 40.0], abs=1e-5)
    assert tm.yolox_grid(100, None) is None


def test_box_agreement_counts_matched_missing_and_extra_boxes() -> None:
    # FP32 sees two boxes; int8 moves one slightly (IoU > 0.5), loses the other, invents a third far away
    ref = _yolox_head([(20, 20, 16, 16, 0.9), (44, 44, 12, 12, 0.8)])
    test = _yolox_head([(21, 20, 16, 16, 0.85), (12, 52, 8, 8, 0.7)])
    acc = tm.BoxAccumulator(input_hw=(64, 64))
    acc.update(ref[None], test[None], None)
    got = acc.results()
    # matched 1 of 2 FP32 boxes, 1 of 2 int8 boxes: F1 = 2·1/(2+2)
    assert got["box_agreement"] == pytest.approx(0.5)
    assert got["box_recall"] == pytest.approx(0.5) and got["box_precision"] == pytest.approx(0.5)
    assert got["box_matched_iou"] == pytest.approx((15 * 16) / (17 * 16))  # shifted by 1 px of 16
    assert got["box_sample_agreement"] == 0.0
    empty = tm.BoxAccumulator(input_hw=(64, 64))
    empty.update(_yolox_head([])[None], _yolox_head([])[None], None)
    assert empty.results()["box_agreement"] == 1.0


def test_box_merge_equals_one_pass_and_detection_is_by_grid() -> None:
    heads = np.stack([_yolox_head([(20, 20, 16, 16, 0.9)]), _yolox_head([(44, 44, 12, 12, 0.8)])])
    moved = np.stack([_yolox_head([(30, 20, 16, 16, 0.9)]), _yolox_head([(44, 44, 12, 12, 0.8)])])
    whole, a, b = (tm.BoxAccumulator(input_hw=(64, 64)) for _ in range(3))
    whole.update(heads, moved, None)
    a.update(heads[:1], moved[:1], None)
    b.update(heads[1:], moved[1:], None)
    a.merge(b)
    assert a.sums() == whole.sums()
    assert tm.detect_task([1, 84, 6], None, False, (64, 64)) == "box"
    assert tm.detect_task([1, 84, 6], None, False, None) == "none"  # no input size: not sure enough
    assert tm.detect_task([1, 85, 6], None, False, (64, 64)) == "none"


def _yolov8_head(boxes: list[tuple[float, float, float, float, int, float]], classes: int = 3) -> np.ndarray:
    """A [4+C, 84] YOLOv8 head for a 64x64 input: decoded centre boxes (cx, cy, w, h) in pixels and class
    scores, channels first, no objectness; every other anchor scores 0.01."""
    head = np.zeros((4 + classes, 84), np.float32)
    head[4:] = 0.01
    head[:4] = np.array([[8.0], [8.0], [4.0], [4.0]])
    for k, (cx, cy, w, h, cls, score) in enumerate(boxes):
        head[:4, 10 * k] = (cx, cy, w, h)
        head[4 + cls, 10 * k] = score
    return head


def test_yolov8_and_yolov5_heads_are_box_heads() -> None:
    """[N, 4+C, A] (YOLOv8, no objectness) and [N, 3A, 5+C] (YOLOv5) with A the stride 8/16/32 cell count
    of a 64x64 input (84) are detection heads, decoded as such; a YOLOX head keeps its decode."""
    hw = (64, 64)
    assert tm.box_layout([1, 7, 84], hw) == "yolov8" and tm.detect_task([1, 7, 84], None, False, hw) == "box"
    assert tm.box_layout([1, 252, 8], hw) == "xywh" and tm.detect_task([1, 252, 8], None, False, hw) == "box"
    assert tm.box_layout([1, 84, 8], (64, 64)) == "yolox" and tm.box_layout([1, 7, 85], (64, 64)) is None
    acc = tm.make_accumulator("box", None, 0.5, (64, 64), [1, 7, 84])
    assert isinstance(acc, tm.BoxAccumulator) and acc.decode == "yolov8"
    # FP32: three boxes; int8: one class score sinks below the threshold, one box moves by 1 px of 16
    ref = _yolov8_head([(20, 20, 16, 16, 0, 0.9), (44, 44, 12, 12, 1, 0.8), (20, 48, 10, 10, 2, 0.7)])
    test = _yolov8_head([(21, 20, 16, 16, 0, 0.85), (44, 44, 12, 12, 1, 0.8), (20, 48, 10, 10, 2, 0.2)])
    acc.update(ref[None], test[None], None)
    got = acc.results()
    assert got["fp32_boxes"] == 3 and got["box_recall"] == pytest.approx(2 / 3)
    assert got["box_agreement"] == pytest.approx(2 * 2 / (3 + 2))  # F1 of 2 matches, 3 FP32 and 2 int8 boxes
    assert got["box_matched_iou"] == pytest.approx(((15 * 16) / (17 * 16) + 1.0) / 2)


def test_box_head_reports_coordinates_and_scores_apart() -> None:
    """A YOLOv8 head pools pixels with scores: its scores' own SQNR and cosine, written out in numpy."""
    rng = np.random.default_rng(0)
    ref = _yolov8_head([(20, 20, 16, 16, 0, 0.9), (44, 44, 12, 12, 1, 0.8)])
    test = ref + np.concatenate([np.zeros((4, 84)), rng.normal(0, 0.05, (3, 84))]).astype(np.float32)
    acc = tm.BoxAccumulator(decode="yolov8", input_hw=(64, 64))
    acc.update(ref[None], test[None], None)
    got = acc.results()
    x, y = ref[4:].astype(np.float64), test[4:].astype(np.float64)
    assert got["scores_sqnr_db"] == pytest.approx(10 * np.log10((x * x).sum() / ((x - y) ** 2).sum()))
    assert got["scores_cosine"] == pytest.approx((x * y).sum() / np.sqrt((x * x).sum() * (y * y).sum()))
    assert got["coords_sqnr_db"] == np.inf and got["coords_cosine"] == pytest.approx(1.0)


def test_nhwc_heatmap_is_a_mask() -> None:
    """[N, H, W, 1] (a TF/tf2onnx text-score map) is a mask like [N, 1, H, W]; [N, H, W, 3] is not."""
    assert tm.detect_task([1, 32, 48, 1], None, False) == "mask" == tm.detect_task([1, 1, 32, 48], None, False)
    assert tm.detect_task([1, 32, 48, 3], None, False) == "none"
