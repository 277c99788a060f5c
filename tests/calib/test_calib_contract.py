"""The input contract in full: run.json records the preprocessing as applied, and a resize that changes
an image's aspect ratio by more than 10% is a warning naming the worst file.

Oracles: the sizes and ratios are worked by hand (1365x64 stretched to 256x64 keeps 0.19 of the ratio;
keep_ratio_pad keeps it); the record's mean/std/scale are checked against pixels computed with numpy.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from calib_helpers import BASE_PRE, rgb, write_json, write_png
from PIL import Image

from conftest import asset_calib, asset_model
from quantscan.calib import load_calibration
from quantscan.calib.preprocess import aspect_change, resized_size
from quantscan.model import load_model
from test_cli import run

LINE_MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 3, 64, 256] x) => (float[1, 2, 64, 256] y) {
  c = Conv (x, w)
  y = Relu (c)
}
"""


def _line_model(tmp_path: Path) -> Path:
    model = onnx.parser.parse_model(LINE_MODEL)
    w = np.random.default_rng(0).normal(size=(2, 3, 1, 1)).astype(np.float32)
    model.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    path = tmp_path / "line.onnx"
    onnx.save(model, path)
    return path


def _lines(tmp_path: Path, resize: str) -> Path:
    folder = tmp_path / f"lines_{resize}"
    folder.mkdir()
    write_png(folder / "000_fits.png", rgb(64, 256, seed=1))
    write_png(folder / "001_long.png", rgb(64, 1365, seed=2))
    write_json(folder / "preprocess.json", {**BASE_PRE, "shape": [1, 3, 64, 256], "resize": resize,
                                            "channel_order": "BGR", "scale": 1 / 255, "mean": [0.5] * 3,
                                            "std": [0.25] * 3})
    return folder


def test_aspect_change_worked_by_hand(tmp_path: Path) -> None:
    folder = _lines(tmp_path, "stretch")
    cset = load_calibration(folder, load_model(_line_model(tmp_path)).inputs)
    record = cset.preprocessing["x"]
    assert record["max_aspect_change"] == pytest.approx((1365 / 64) / (256 / 64), rel=1e-3)  # 5.33
    squashed = [w for w in cset.warnings if "aspect ratio" in w]
    assert len(squashed) == 1 and "001_long.png: 1365x64 -> 256x64" in squashed[0] and "1 of 2" in squashed[0]


def test_keep_ratio_pad_keeps_the_ratio_and_records_every_key(tmp_path: Path) -> None:
    folder = _lines(tmp_path, "keep_ratio_pad")
    cset = load_calibration(folder, load_model(_line_model(tmp_path)).inputs)
    assert not [w for w in cset.warnings if "aspect ratio" in w]
    record = cset.preprocessing["x"]
    assert record["resize"] == "keep_ratio_pad" and record["size"] == {"height": 64, "width": 256}
    assert record["channel_order"] == "BGR" and record["layout"] == "NCHW" and record["dtype"] == "float32"
    assert record["mean"] == [0.5] * 3 and record["std"] == [0.25] * 3 and record["scale"] == pytest.approx(1 / 255)
    assert {(s["width"], s["height"]) for s in record["source_sizes"]} == {(256, 64), (1365, 64)}
    # the record describes what was fed: redo the first image with numpy from the recorded keys
    first = next(cset.samples())["x"]
    pixels = np.asarray(Image.open(folder / "000_fits.png").convert("RGB"), np.float32)[:, :, ::-1]
    expected = ((pixels * record["scale"] - np.array(record["mean"])) / np.array(record["std"])).transpose(2, 0, 1)
    np.testing.assert_allclose(first[0], expected, rtol=1e-5, atol=1e-5)


def test_resized_size_for_both_modes() -> None:
    from quantscan.calib.preprocess import Preprocess

    pre = Preprocess("x", "NCHW", "RGB", 3, 48, 320, 1.0, (0.0,) * 3, (1.0,) * 3, "keep_ratio_pad", (0.0,) * 3,
                     None, None)
    assert resized_size(1365, 64, pre) == (320, 15)  # width binds: 320/1365 of 64 = 15.0
    assert resized_size(100, 48, pre) == (100, 48)
    assert aspect_change(1365, 64, pre) == pytest.approx(1.0, abs=0.02)


def test_cli_run_json_records_the_preprocessing_and_warns(tmp_path: Path) -> None:
    model, folder = _line_model(tmp_path), _lines(tmp_path, "stretch")
    proc = run(model, "--calib", folder, "--out", tmp_path / "run", "--quiet", "--no-report")
    assert proc.returncode == 0, proc.stderr
    assert "aspect ratio" in proc.stderr
    info = json.loads((tmp_path / "run" / "run.json").read_text(encoding="utf-8"))
    assert info["preprocessing"]["x"]["resize"] == "stretch"
    assert info["preprocessing"]["x"]["max_aspect_change"] > 5
    assert any("aspect ratio" in w for w in info["warnings"])
    assert info["input_contract"] == {"x": [1, 3, 64, 256]}  # the shapes stay where they were


@pytest.mark.real
def test_ocr_line_squashed_into_the_recogniser_is_warned(assets: Path, tmp_path: Path) -> None:
    """ppocrv4_rec takes 48x320 lines; a page line of 4 crops side by side (1280x48) stretched to it is
    squashed 4x: warned. The shipped crops themselves fit and are recorded as they are."""
    src = asset_calib(assets, "ppocrv4_rec")
    folder = tmp_path / "rec"
    folder.mkdir()
    names = sorted(p.name for p in src.glob("*.png"))[:4]
    crops = [np.asarray(Image.open(src / name).convert("RGB")) for name in names]
    write_png(folder / "000_crop.png", crops[0])
    write_png(folder / "001_line.png", np.concatenate(crops, axis=1))
    pre = json.loads((src / "preprocess.json").read_text(encoding="utf-8"))
    pre.pop("files", None)
    write_json(folder / "preprocess.json", pre)
    cset = load_calibration(folder, load_model(asset_model(assets, "ppocrv4_rec")).inputs)
    warned = [w for w in cset.warnings if "aspect ratio" in w]
    assert len(warned) == 1 and "001_line.png: 1280x48 -> 320x48" in warned[0]
    assert cset.preprocessing["x"]["channel_order"] == "BGR"
    assert cset.preprocessing["x"]["max_aspect_change"] == pytest.approx(4.0)
    shipped = load_calibration(src, load_model(asset_model(assets, "ppocrv4_rec")).inputs, limit=4)
    assert not [w for w in shipped.warnings if "aspect ratio" in w]
