"""`bisect --target METRIC=VALUE`: a task metric (boxes, top-1) as the bisection target.

The tiny detector is a [1, 84, 6] YOLOX head (64×64 input, strides 8/16/32) passed through two
MatMuls; its calibration heads are hand-encoded boxes, so FP32 detections are known by construction.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

from quantscan.api import run_bisect
from quantscan.bisect.targets import gain_key, parse_target
from quantscan.errors import UsageError
from test_cli import run

HEAD = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 84, 6] x) => (float[1, 84, 6] y) {
  h = MatMul (x, w1)
  y = MatMul (h, w2)
}
"""


def _head(rng: np.random.Generator) -> np.ndarray:
    """A raw YOLOX head with two or three confident stride-8 boxes and faint noise elsewhere."""
    head = np.zeros((84, 6), np.float32)
    head[:, 2:4] = math.log(1 / 8)
    head[:, 4] = rng.uniform(0.0, 0.05, 84)
    head[:, 5] = 1.0
    for cell in rng.choice(64, size=int(rng.integers(2, 4)), replace=False):
        head[cell, :2] = rng.uniform(0.2, 0.8, 2)
        head[cell, 2:4] = np.log(rng.uniform(6, 14, 2) / 8)
        head[cell, 4] = rng.uniform(0.6, 0.95)
    return head[None]


@pytest.fixture
def detector(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(5)
    model = onnx.parser.parse_model(HEAD)
    w1 = (np.eye(6) + rng.normal(scale=0.3, size=(6, 6))).astype(np.float32)
    w2 = np.linalg.inv(w1).astype(np.float32)  # y = x in FP32: the head survives exactly
    model.graph.initializer.extend([onnx.numpy_helper.from_array(w1, "w1"), onnx.numpy_helper.from_array(w2, "w2")])
    path = tmp_path / "det.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(6):
        np.savez(calib / f"{i:03d}.npz", x=_head(rng))
    return path, calib


def test_parse_target_spellings_and_errors() -> None:
    assert parse_target("top1=0.99").key == "top1_agreement"
    assert parse_target("box_agreement=0.9").metric == "box"
    assert parse_target("sqnr=30").value == 30.0
    assert gain_key(parse_target("box=0.9")) == "cosine" and gain_key(parse_target("top1=0.9")) == "top1_agreement"
    for bad in ("top1", "f1=0.9", "box=x", "box=1.5", "cosine=nan"):
        with pytest.raises(UsageError):
            parse_target(bad)


def test_bisect_api_targets_box_agreement(detector: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = detector
    result = run_bisect(model, calib, target="box=0.99", task="box", out=tmp_path / "run", threads=1)
    plan = result.plan
    assert plan.target.metric == "box"
    assert plan.all_float is not None and plan.all_float["box_agreement"] == 1.0  # y = x: same detections
    assert plan.achieved is not None and plan.achieved["box_agreement"] >= 0.99
    stored = json.loads((tmp_path / "run" / "plan.json").read_text(encoding="utf-8"))
    assert stored["target"]["metric"] == "box" and stored["target"]["value"] == 0.99
    assert all("box_agreement" in step["metrics"] for step in stored["steps"])


def test_bisect_target_needs_an_output_that_has_the_metric(detector: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = detector
    with pytest.raises(UsageError, match="string_agreement"):
        run_bisect(model, calib, target="string=0.9", task="mask", out=tmp_path / "run", threads=1)


def test_bisect_cli_target_flag(detector: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = detector
    proc = run("bisect", model, "--calib", calib, "--target", "box=0.99", "--out", tmp_path / "run", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert "box 1.00000" in proc.stdout or "box 0.99" in proc.stdout
    assert json.loads((tmp_path / "run" / "plan.json").read_text(encoding="utf-8"))["target"]["metric"] == "box"
    both = run("bisect", model, "--calib", calib, "--target", "box=0.99", "--target-cosine", "0.9",
               "--out", tmp_path / "run2")
    assert both.returncode == 2 and "exactly one of --target" in both.stderr
    bad = run("bisect", model, "--calib", calib, "--target", "f1=0.9", "--out", tmp_path / "run3")
    assert bad.returncode == 2 and "quantscan: error: --target" in bad.stderr


@pytest.mark.real
def test_detector_first_bad_site_for_box_agreement(assets: Path, tmp_path: Path) -> None:
    """ddddocr_common_det (YOLOX) on three images: every step measures box agreement on the decoded,
    NMS-filtered detections; all-float agrees exactly, all-int8 loses boxes, and the search names a
    measured boundary (first_bad mode: no gain pass, ~8 evaluations). One sample set for search and claims
    and one rounding (`holdout="none"`, `realisations=1`: the step value is then the box agreement itself):
    split three ways, the one held-out image keeps every box."""
    result = run_bisect(assets / "models/ddddocr_common_det.onnx", assets / "calib/ddddocr_common_det",
                        target="box=0.99", mode="first_bad", limit=3, threads=2, out=tmp_path / "run",
                        holdout="none", realisations=1)
    plan = result.plan
    assert plan.target.metric == "box" and plan.status == "found" and plan.first_bad
    assert plan.all_float is not None and plan.all_float["box_agreement"] == 1.0
    assert plan.all_int8 is not None and plan.all_int8["box_agreement"] < 0.99
    assert all("box_agreement" in s.metrics and s.value == s.metrics["box_agreement"] for s in result.steps)
    stored = json.loads((tmp_path / "run" / "plan.json").read_text(encoding="utf-8"))
    assert stored["target"] == {"metric": "box", "value": 0.99, "output": "output"}
