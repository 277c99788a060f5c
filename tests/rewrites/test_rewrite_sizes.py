"""`rewrite --all-for-profile` sizes a model's free H/W from the data or its own metadata (issue 26 item 7).

The model is a YOLOv8 export with `dynamic=True` in small: images [batch, 3, height, width], a strided
Conv, and an anchor row grid built from the feature map's Shape (Range over its height). With only
`fix-dim batch=1` that shape chain stays dynamic and horizon-x3's errors stay; with H/W fixed it folds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from builders import build, vad_like
from quantscan.compat.check import check
from quantscan.compat.rewrite_plan import plan_for_profile
from quantscan.rewrites.fix_dim import fix_dim
from quantscan.rewrites.sizes import plan_sizes

YOLO = """<ir_version: 8, opset_import: ["" : 13]>
g (float[batch, 3, height, width] images) => (float[batch, 4, h2, w2] output0) {
  c = Conv <strides = [2, 2], pads = [1, 1, 1, 1], kernel_shape = [3, 3]> (images, w)
  a = Sigmoid (c)
  s = Shape (c)
  i2 = Constant <value = int64 {2}> ()
  hh = Gather <axis = 0> (s, i2)
  hf = Cast <to = 1> (hh)
  z = Constant <value = float {0}> ()
  o = Constant <value = float {1}> ()
  rows = Range (z, hf, o)
  shp = Constant <value = int64[4] {1, 1, -1, 1}> ()
  grid = Reshape (rows, shp)
  output0 = Add (a, grid)
}"""


def yolo(imgsz: str | None = None) -> onnx.ModelProto:
    model = build(YOLO, {"w": np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype(np.float32)})
    if imgsz is not None:
        model.metadata_props.append(onnx.StringStringEntryProto(key="imgsz", value=imgsz))
    return model


def samples(*sizes: tuple[int, int]) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [{"images": rng.uniform(0, 1, (1, 3, h, w)).astype(np.float32)} for h, w in sizes]


def test_sizes_from_the_data_when_every_sample_agrees() -> None:
    plan = plan_sizes(yolo(), samples((320, 320), (320, 320)))
    assert plan.settings == ["images:2=320", "images:3=320"] and not plan.missing
    mixed = plan_sizes(yolo(), samples((320, 320), (480, 640)))
    assert not mixed.settings and mixed.missing == ["images:2=V (height)", "images:3=V (width)"]
    assert "2 sizes (320, 480)" in mixed.notes[0]


def test_sizes_from_ultralytics_imgsz_metadata_and_the_users_own_settings_win() -> None:
    assert plan_sizes(yolo("[256, 320]"), None).settings == ["images:2=256", "images:3=320"]
    assert plan_sizes(yolo("640"), None).settings == ["images:2=640", "images:3=640"]
    assert plan_sizes(yolo(), None).missing == ["images:2=V (height)", "images:3=V (width)"]
    assert plan_sizes(yolo("[256, 320]"), samples((320, 320))).settings == ["images:2=320", "images:3=320"]
    assert not plan_sizes(yolo("640"), None, given=["height=320", "images:3=320"]).settings


def test_fixed_sizes_fold_the_anchor_grid_and_clear_the_errors() -> None:
    """The plan with the data's sizes leaves no dynamic-input error and no shape chain; batch alone left both."""
    model = yolo()

    def left(dims: list[str]) -> set[str]:
        f = check(fix_dim(model, dims).model, ["horizon-x3"]).findings
        return set(f[f["rule"].isin(["dynamic-input", "shape-chain"]) & (f["severity"] != "info")]["rule"])

    batch_only = plan_for_profile(model, "horizon-x3")
    assert batch_only.fix_dims == ["batch=1"] and "dynamic-input" in left(batch_only.fix_dims)
    plan = plan_for_profile(model, "horizon-x3", plan_sizes(model, samples((320, 320))).settings)
    assert plan.fix_dims == ["images:2=320", "images:3=320", "batch=1"]
    assert left(plan.fix_dims) == set()


@pytest.mark.parametrize("source", ["calib", "metadata"])
def test_cli_all_for_profile_closes_the_loop(tmp_path: Path, source: str) -> None:
    model = yolo("[320, 320]" if source == "metadata" else None)
    path = tmp_path / "yolo.onnx"
    onnx.save(model, path)
    args = ["rewrite", str(path), "--all-for-profile", "horizon-x3", "-o", str(tmp_path / "out.onnx")]
    data = samples((320, 320), (320, 320), (320, 320))
    if source == "calib":
        (tmp_path / "calib").mkdir()
        for k, sample in enumerate(data):
            np.save(tmp_path / "calib" / f"{k}.npy", sample["images"])
        args += ["--calib", str(tmp_path / "calib")]
    proc = subprocess.run([sys.executable, "-m", "quantscan", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "images:2 (height)=320, images:3 (width)=320" in proc.stdout
    out = onnx.load(tmp_path / "out.onnx")
    assert [d.dim_value for d in out.graph.input[0].type.tensor_type.shape.dim] == [1, 3, 320, 320]
    assert not {"Shape", "Range"} & {n.op_type for n in out.graph.node}  # the anchor grid is a constant now
    assert check(out, ["horizon-x3"]).summary_rows()[0]["errors"] == 0
    feed = {"images": data[0]["images"]}  # onnx's reference evaluator: same numbers as the original
    np.testing.assert_allclose(ReferenceEvaluator(out).run(None, feed)[0],
                               ReferenceEvaluator(model).run(None, feed)[0], rtol=1e-5, atol=1e-5)


def test_cli_names_the_exact_fix_dims_when_nothing_sizes_them(tmp_path: Path) -> None:
    path = tmp_path / "yolo.onnx"
    onnx.save(yolo(), path)
    proc = subprocess.run([sys.executable, "-m", "quantscan", "rewrite", str(path), "--all-for-profile", "horizon-x3",
                           "-o", str(tmp_path / "out.onnx")], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert "add --fix-dim images:2=V (height) --fix-dim images:3=V (width)" in proc.stdout


def test_cli_closes_the_loop_on_the_vad_pattern(tmp_path: Path) -> None:
    """silero-vad's wheel pattern (`builders.vad_like`): `--freeze-input sr=16000`, the state's batch given
    (its data is a --const), the length from the data: every If folds and rk3588's errors go to 0."""
    path = tmp_path / "vad.onnx"
    onnx.save(vad_like(), path)
    (tmp_path / "calib").mkdir()
    np.save(tmp_path / "calib" / "x.npy", np.random.default_rng(0).normal(size=(4, 12)).astype(np.float32))
    proc = subprocess.run([sys.executable, "-m", "quantscan", "rewrite", str(path), "--all-for-profile", "rk3588",
                           "--freeze-input", "sr=16000", "--const", "state=0", "--fix-dim", "state:1=1",
                           "--calib", str(tmp_path / "calib"), "-o", str(tmp_path / "out.onnx")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "sizes from the calibration data (one size on every sample): x:1 (T)=12" in proc.stdout
    out = onnx.load(tmp_path / "out.onnx")
    assert "If" not in {n.op_type for n in out.graph.node}
    assert check(out, ["rk3588"]).summary_rows()[0]["errors"] == 0
