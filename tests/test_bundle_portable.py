"""Complete, portable bundles: a full run (check + rewrite + scan + bisect + extract) in one zip with
every piece, no absolute path in any member (the test greps the zip), a sha256 manifest that matches,
and members readable by the team whatever the umask."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

from conftest import asset_calib, asset_model
from quantscan.bundle import local_roots, make_bundle, relative_text
from test_cli import run

MODEL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 3, 4, 4] x) => (float[N, 2, 4, 4] y) {
  c = Conv (x, w)
  d = Div (c, k)
  y = Relu (d)
}
"""


def _assert_portable(zip_path: Path, *local: Path) -> dict[str, bytes]:
    """Every member: no local folder named (the tmp folder, cwd, home), sha256 as the manifest says, 0644."""
    needles = [str(p) for p in local] + [str(Path.cwd()), str(Path.home()), "/tmp/"]
    with zipfile.ZipFile(zip_path) as zf:
        data = {i.filename: zf.read(i) for i in zf.infolist()}
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}
    manifest = json.loads(data["MANIFEST.json"])
    for name, blob in data.items():
        for needle in needles:
            assert needle.encode() not in blob, (name, needle)
        assert modes[name] == 0o644, name
        if name != "MANIFEST.json":
            assert manifest["members"][name]["sha256"] == hashlib.sha256(blob).hexdigest()
    assert stat.S_IMODE(os.stat(zip_path).st_mode) == 0o644
    return data


def test_relative_text_cuts_local_folders_and_keeps_node_names() -> None:
    roots = local_roots(["/home/me/proj/calib/set1", "/home/me/proj/model.onnx"])
    text = '{"calib": "/home/me/proj/calib/set1", "model": "/home/me/proj/model.onnx", "node": "/conv1/Conv"}'
    assert relative_text(text, roots) == '{"calib": "set1", "model": "model.onnx", "node": "/conv1/Conv"}'
    assert relative_text("in /home/me/projects", roots) == "in /home/me/projects".replace("/home/me/", "")


def test_full_run_bundle_has_every_piece_and_no_absolute_path(tmp_path: Path) -> None:
    model = onnx.parser.parse_model(MODEL)
    rng = np.random.default_rng(0)
    model.graph.initializer.extend([onnx.numpy_helper.from_array(rng.normal(size=(2, 3, 1, 1)).astype(np.float32), "w"),
                                    onnx.numpy_helper.from_array(np.array(4.0, np.float32), "k")])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(6):
        np.savez(calib / f"{i}.npz", x=rng.normal(size=(1, 3, 4, 4)).astype(np.float32))
    fixed = tmp_path / "fixed.onnx"
    steps = [
        ("check", path, "--profile", "horizon-x3", "--out", tmp_path / "check"),
        ("rewrite", path, "--div-to-mul", "--calib", calib, "-o", fixed),
        ("scan", fixed, "--calib", calib, "--out", tmp_path / "run", "--no-report"),
        ("bisect", fixed, "--calib", calib, "--target", "cosine=0.99999", "--out", tmp_path / "bisect"),
        ("extract", fixed, "--node", "Conv_0", "--calib", calib, "--worst", tmp_path / "run",
         "-o", tmp_path / "min.onnx"),
    ]
    for step in steps:
        proc = run(*step, "--quiet") if step[0] in ("check", "scan", "bisect") else run(*step)
        assert proc.returncode in (0, 1), (step[0], proc.stderr)
    old = os.umask(0o077)  # a private umask: the bundle is still readable by the team
    try:
        proc = run("bundle", tmp_path / "run", "--include", tmp_path / "check", tmp_path / "bisect", fixed,
                   tmp_path / "min.onnx", "-o", tmp_path / "hand-over.zip")
    finally:
        os.umask(old)
    assert proc.returncode == 0, proc.stderr
    data = _assert_portable(tmp_path / "hand-over.zip", tmp_path)
    names = set(data)
    assert {"run/run.json", "run/layers.csv", "run/summary.md", "check/compat.csv", "bisect/plan.json",
            "bisect/session.json", "models/fixed.onnx", "models/fixed.onnx.rewrite.json", "models/min.onnx",
            "models/min.inputs.npz", "models/min.expected.npz", "models/min.extract.json"} <= names
    manifest = json.loads(data["MANIFEST.json"])
    assert manifest["versions"]["onnxruntime"] and manifest["versions"]["quantscan"]
    assert manifest["preprocessing"]["x"]["kind"] == "tensors" and list(manifest["input_contract"]) == ["x"]
    run_json = json.loads(data["run/run.json"])
    assert run_json["calibration"]["path"] == "calib" and run_json["model"]["path"] == "fixed.onnx"
    assert "run/run.json" in manifest["paths_rewritten"]


@pytest.mark.real
def test_real_scan_and_extract_bundle_is_portable(assets: Path, tmp_path: Path) -> None:
    model, calib = asset_model(assets, "mtcnn_onet"), asset_calib(assets, "mtcnn_onet")
    assert run(model, "--calib", calib, "--limit", "8", "--out", tmp_path / "run", "--quiet",
               "--tensors", "sites").returncode == 0
    proc = run("extract", model, "--node", "/conv2/Conv", "--calib", calib, "--worst", tmp_path / "run",
               "-o", tmp_path / "min.onnx")
    assert proc.returncode == 0, proc.stderr
    bundle = make_bundle(tmp_path / "run", tmp_path / "b.zip", include=[tmp_path / "min.onnx"])
    data = _assert_portable(bundle.path, tmp_path, assets)
    assert "run/report.html" in data and "models/min.extract.json" in data
    record = json.loads(data["models/min.extract.json"])
    assert record["kernel"]["nodes"] == ["/conv2/Conv", "/prelu2/PRelu"] and record["finding"]["node"] == "/conv2/Conv"
