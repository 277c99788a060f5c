"""A float-min attention mask, end to end: the scan ranks the mask Add first with an absurd-scale
finding naming clamp-mask, never claims NaN/Inf for its finite tensor, and the rewrite (proven)
lifts the all-int8 output cosine. Cosines are measured here against the FP32 model by the scan."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import quantscan
from builders import attention_model
from quantscan.rewrites.pipeline import rewrite


@pytest.fixture(scope="module")
def calib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("calib")
    for i in range(8):
        np.savez(folder / f"{i}.npz", x=np.random.default_rng(i).normal(size=(1, 8, 16)).astype(np.float32))
    return folder


def test_mask_add_is_the_top_finding_and_clamp_mask_fixes_it(tmp_path: Path, calib: Path) -> None:
    model = attention_model()
    onnx.save(model, tmp_path / "att.onnx")
    before = quantscan.scan(tmp_path / "att.onnx", calib, out=tmp_path / "run", no_report=True)
    top = before.layers.iloc[0]
    assert top["node"] == "mask_add" and top["rank"] == 1
    assert top["diagnosis_cause"] == "absurd-scale" and top["diagnosis_fix"] == "rewrite clamp-mask"
    assert "3.4e38" in top["diagnosis"] and "nonfinite-figures" in top["diagnosis"]
    assert not any("NaN/Inf in activations" in w for w in before.warnings)  # the tensor is finite
    assert any("too large for float32 error sums" in w for w in before.warnings)
    summary = (tmp_path / "run" / "summary.md").read_text()
    assert "## Diagnosis" in summary and "`mask_add`" in summary and "clamp-mask" in summary
    assert "diagnosis" in (tmp_path / "run" / "layers.csv").read_text().splitlines()[0]

    report = rewrite(model, ["clamp-mask"], out=tmp_path / "clamped.onnx")
    assert report.passed and report.written
    after = quantscan.scan(tmp_path / "clamped.onnx", calib)
    cos_before, cos_after = before.headline.cosine, after.headline.cosine
    assert cos_after > cos_before + 0.2, (cos_before, cos_after)  # -100 where exact (was 0.46 -> 0.80 at -1e4)
    row = after.layers[after.layers["node"] == "mask_add"].iloc[0]
    assert np.isfinite(row["isolated_sqnr_db"]) and row["diagnosis_cause"] != "absurd-scale"
