"""Minimal models that still mean something: cuts at kernel boundaries, several samples, and a sidecar
saying which kernel and which finding the model reproduces.

Oracles: the full model run by onnxruntime with the cut tensors exposed (the extracted model must give
the same values on the saved inputs), numpy stacking written out, and the scan's own run.json/layers.csv.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import build, rng_array
from conftest import asset_calib, asset_model
from quantscan.api import scan
from quantscan.extract import extract, save_samples, write_record
from quantscan.runner import Runner
from test_cli import run

CONV_PRELU = """<ir_version: 8, opset_import: ["" : 13]>
g (float[N,3,6,6] x) => (float[N,4,6,6] y) {
    c = Conv <pads = [1,1,1,1]> (x, w)
    p = PRelu (c, slope)
    y = Conv (p, w2)
}"""


@pytest.fixture()
def conv_prelu(tmp_path: Path) -> tuple[Path, Path]:
    model = build(CONV_PRELU, {"w": rng_array((4, 3, 3, 3), 1), "slope": rng_array((4, 1, 1), 2, 0.1, 0.3),
                               "w2": rng_array((4, 4, 1, 1), 3)})
    path = tmp_path / "cp.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(10):
        np.savez(calib / f"{i:03d}.npz", x=rng_array((1, 3, 6, 6), 10 + i))
    return path, calib


def test_the_cut_never_splits_conv_and_its_prelu(conv_prelu: tuple[Path, Path]) -> None:
    model, _ = conv_prelu
    r = extract(model, "Conv_0", context=0)
    assert r.kernel == ["Conv_0", "PRelu_1"] and r.kernel_name.startswith("Conv+PRelu")
    assert "c" not in r.outputs and "p" in r.outputs  # no output between Conv and PRelu: it still fuses
    assert [n.op_type for n in r.model.graph.node][:2] == ["Conv", "PRelu"]
    cut = extract(model, "Conv_0", context=0, kernels=False)
    assert "c" in cut.outputs  # the old cut: the Conv's output leaves the model, fusion impossible


def test_eight_samples_stacked_and_reproduced(conv_prelu: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = conv_prelu
    r = extract(model, "PRelu_1", context=1)
    saved = save_samples(r, calib, tmp_path / "min.onnx")
    assert saved.indices == tuple(range(8)) and saved.files == tuple(f"{i:03d}.npz" for i in range(8))
    inputs, expected = np.load(saved.inputs_path), np.load(saved.expected_path)
    xs = np.concatenate([np.load(calib / f"{i:03d}.npz")["x"] for i in range(8)])
    np.testing.assert_array_equal(inputs["x"], xs)
    got = Runner().session(r.model).run({"x": inputs["x"]})
    for name in r.outputs:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-6)
    picked = save_samples(r, calib, tmp_path / "pick.onnx", samples=[7, 2])
    assert picked.indices == (7, 2)
    np.testing.assert_array_equal(np.load(picked.inputs_path)["x"], xs[[7, 2]])


def test_record_names_kernel_samples_and_finding(conv_prelu: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = conv_prelu
    scan(model, calib, out=tmp_path / "run", no_report=True)
    r = extract(model, "Conv_0", context=0)
    saved = save_samples(r, calib, tmp_path / "min.onnx", count=3)
    record = json.loads(write_record(r, tmp_path / "min.onnx", saved, run_dir=tmp_path / "run").read_text())
    assert record["kernel"] == {"name": r.kernel_name, "nodes": ["Conv_0", "PRelu_1"]}
    assert record["samples"]["indices"] == [0, 1, 2] and record["samples"]["inputs"] == "min.inputs.npz"
    assert record["finding"]["node"] == "Conv_0" and isinstance(record["finding"]["rank"], int)
    assert "/" not in json.dumps({k: record[k] for k in ("model", "source", "samples")})  # names, not paths


def test_cli_extract_worst_samples_of_a_scan(conv_prelu: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = conv_prelu
    assert run(model, "--calib", calib, "--out", tmp_path / "run", "--quiet", "--no-report").returncode == 0
    worst = [w["index"] for w in json.loads((tmp_path / "run" / "run.json").read_text())["worst_samples"]]
    proc = run("extract", model, "--node", "Conv_0", "--context", "0", "--calib", calib, "--worst",
               tmp_path / "run", "--samples", "3", "-o", tmp_path / "min.onnx")
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "min.extract.json").read_text())
    assert record["samples"]["indices"] == worst[:3] and record["finding"]["node"] == "Conv_0"
    missing = run("extract", model, "--node", "Conv_0", "--calib", calib, "--worst", tmp_path / "nothing",
                  "-o", tmp_path / "m2.onnx")
    assert missing.returncode == 2 and "quantscan: error: --worst" in missing.stderr


@pytest.mark.real
def test_mtcnn_onet_conv_keeps_its_prelu_and_eight_faces(assets: Path, tmp_path: Path) -> None:
    model, calib = asset_model(assets, "mtcnn_onet"), asset_calib(assets, "mtcnn_onet")
    r = extract(model, "/conv2/Conv", context=1)
    assert r.kernel == ["/conv2/Conv", "/prelu2/PRelu"]
    assert "/conv2/Conv_output_0" not in r.outputs
    saved = save_samples(r, calib, tmp_path / "min.onnx")
    assert len(saved.indices) == 8 and saved.files[0] == "000_lfw00.png"
    inputs, expected = np.load(saved.inputs_path), np.load(saved.expected_path)
    got = Runner().session(r.model).run({k: inputs[k] for k in inputs.files})
    for name in r.outputs:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-4)
    record = json.loads(write_record(r, tmp_path / "min.onnx", saved).read_text())
    assert record["kernel"]["nodes"] == ["/conv2/Conv", "/prelu2/PRelu"] and record["source"] == "mtcnn_onet.onnx"
