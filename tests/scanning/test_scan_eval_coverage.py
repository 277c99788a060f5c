"""Calibration vs evaluation: the fraction of evaluation values a site clips, the flag in summary.md,
and the worst evaluation samples by output error (run.json `worst_samples`).

Oracle: onnx's ReferenceEvaluator runs the FP32 model and the saved QDQ model; the clip range is read
from the QDQ model's own QuantizeLinear (scale, zero point) and the counts are numpy written out.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnx.version_converter
import pytest
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from quantscan.api import scan
from quantscan.report.summary import CLIP_FLAG
from test_cli import run

MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 3, 4, 4] x) => (float[N, 2, 4, 4] y) {
  c = Conv (x, w)
  y = Relu (c)
}
"""


def _folder(path: Path, scale: float, seed: int, n: int = 6) -> Path:
    path.mkdir()
    rng = np.random.default_rng(seed)
    for i in range(n):
        np.savez(path / f"{i:03d}.npz", x=(rng.normal(size=(1, 3, 4, 4)) * scale).astype(np.float32))
    return path


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    model = onnx.parser.parse_model(MODEL)
    w = np.random.default_rng(0).normal(size=(2, 3, 1, 1)).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(w, "w"))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    return path, _folder(tmp_path / "calib", 1.0, 1), _folder(tmp_path / "eval", 3.0, 2)


def _ref(model: onnx.ModelProto) -> ReferenceEvaluator:
    return ReferenceEvaluator(onnx.version_converter.convert_version(model, 21))


def test_clip_fraction_and_worst_samples_match_the_reference_evaluator(setup: tuple[Path, Path, Path],
                                                                       tmp_path: Path) -> None:
    model, calib, evalset = setup
    result = scan(model, calib, eval=evalset, out=tmp_path / "run", no_report=True, save_qdq=tmp_path / "q.onnx")
    xs = np.concatenate([np.load(evalset / f"{i:03d}.npz")["x"] for i in range(6)])
    fp32 = _ref(onnx.load(model)).run(None, {"x": xs})[0].astype(np.float64)
    qdq = onnx.load(tmp_path / "q.onnx")
    q = next(n for n in qdq.graph.node if n.op_type == "QuantizeLinear" and n.input[0].startswith("y"))
    inits = {t.name: numpy_helper.to_array(t) for t in qdq.graph.initializer}
    scale, zp = float(inits[q.input[1]]), inits[q.input[2]]
    info = np.iinfo(zp.dtype)
    lo, hi = (info.min - float(zp) - 0.5) * scale, (info.max - float(zp) + 0.5) * scale
    expected = np.count_nonzero((fp32 < lo) | (fp32 > hi)) / fp32.size
    row = result.layers.set_index("output").loc["y"]
    assert expected > 0.01  # the evaluation set is 3x wider than the calibration set: it clips
    assert row["eval_clip_fraction"] == pytest.approx(expected, abs=1e-6)
    int8 = _ref(qdq).run(None, {"x": xs})[0].astype(np.float64)
    cos = [float(a.ravel() @ b.ravel() / np.sqrt((a.ravel() @ a.ravel()) * (b.ravel() @ b.ravel())))
           for a, b in zip(fp32, int8, strict=True)]
    info_json = json.loads((tmp_path / "run" / "run.json").read_text(encoding="utf-8"))
    worst = info_json["worst_samples"]
    energy = ((fp32 - int8) ** 2).reshape(len(fp32), -1).sum(axis=1)  # each sample's share of the error
    order = [int(i) for i in np.argsort(-energy, kind="stable")[:5]]
    assert worst[0]["index"] == order[0] and worst[0]["file"] == f"{order[0]:03d}.npz"
    assert [w["index"] for w in worst] == order
    assert [w["cosine"] for w in worst] == pytest.approx([cos[i] for i in order], abs=1e-3)
    summary = (tmp_path / "run" / "summary.md").read_text(encoding="utf-8")
    assert "**flag**" in summary and "does not cover the evaluation data" in summary
    tensors = (tmp_path / "run" / "tensors.csv").read_text(encoding="utf-8")
    assert "eval_clip_fraction" in tensors.splitlines()[0]


def test_cli_same_data_has_no_flag(setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    model, calib, _ = setup
    proc = run(model, "--calib", calib, "--out", tmp_path / "run", "--quiet", "--no-report")
    assert proc.returncode == 0, proc.stderr
    summary = (tmp_path / "run" / "summary.md").read_text(encoding="utf-8")
    assert "## Calibration vs evaluation" in summary and "**flag**" not in summary  # minmax covers its own data
    layers = (tmp_path / "run" / "layers.csv").read_text(encoding="utf-8")
    assert "eval_clip_fraction" in layers.splitlines()[0]


@pytest.mark.real
def test_detector_calibrated_on_pages_clips_on_photos(assets: Path, tmp_path: Path) -> None:
    """ddddocr_common_det calibrated on two document scans, evaluated on four photographs: the photos'
    activations leave the calibrated ranges, and the worst samples name photo files."""
    import shutil

    src = assets / "calib/ddddocr_common_det"
    pre = json.loads((src / "preprocess.json").read_text(encoding="utf-8"))
    sets = {"calib": ["000_page.png", "001_text.png"],
            "eval": ["002_astronaut.png", "003_chelsea.png", "004_coffee.png", "005_rocket.png"]}
    for name, files in sets.items():
        (tmp_path / name).mkdir()
        for f in files:
            shutil.copy(src / f, tmp_path / name / f)
        (tmp_path / name / "preprocess.json").write_text(json.dumps({**pre, "files": files}), encoding="utf-8")
    result = scan(assets / "models/ddddocr_common_det.onnx", tmp_path / "calib", eval=tmp_path / "eval",
                  out=tmp_path / "run", no_report=True, tensors="sites", gain_candidates=0, recover_check=False)
    clip = result.layers["eval_clip_fraction"].dropna()
    assert len(clip) > 50 and clip.between(0, 1).all() and clip.max() > CLIP_FLAG
    info = json.loads((tmp_path / "run" / "run.json").read_text(encoding="utf-8"))
    assert {w["file"] for w in info["worst_samples"]} <= set(sets["eval"]) and len(info["worst_samples"]) == 4
    assert "does not cover the evaluation data" in (tmp_path / "run" / "summary.md").read_text(encoding="utf-8")


def test_an_eval_set_of_other_sizes_is_bad_input(tmp_path: Path) -> None:
    """An --eval folder whose samples are not the sizes the calibration set fixes (another model's
    preprocess.json, say) is one exit-2 line naming the input, the sizes expected and found; it used to
    reach onnxruntime as a graph quantscan built (exit 3)."""
    text = MODEL.replace("[N, 3, 4, 4] x", "[N, 3, H, W] x").replace("[N, 2, 4, 4] y", "[N, 2, H, W] y")
    model = onnx.parser.parse_model(text)
    model.graph.initializer.append(numpy_helper.from_array(np.ones((2, 3, 1, 1), np.float32), "w"))
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    calib = _folder(tmp_path / "calib", 1.0, 0)
    other = tmp_path / "other"
    other.mkdir()
    np.savez(other / "000.npz", x=np.ones((1, 3, 6, 6), np.float32))
    proc = run(str(path), "--calib", str(calib), "--eval", str(other), "--out", str(tmp_path / "out"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "--eval" in lines[0] and "'x'" in lines[0] and "[1, 3, 6, 6]" in lines[0] and "4, 4]" in lines[0]
