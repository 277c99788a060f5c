"""The case library: a recipe saved from one model is suggested on the next model with the same
pattern and replayed there with a fresh, passing proof.

Oracles: patterns worked by hand on hand-made compat tables; on models, onnx's ReferenceEvaluator
checks the replayed rewrite (the MaxPool's ceil_mode is gone and the outputs are unchanged)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pandas as pd
import pytest
from onnx.reference import ReferenceEvaluator

from conftest import asset_calib, asset_model
from quantscan.cases import list_cases, load_case, match_cases, patterns, resolved_patterns
from quantscan.errors import UsageError
from test_cli import run

POOL = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[1, 3, 7, 7] x) => (float[1, 4, 4, 4] y) {
  c = Conv (x, w)
  r = Relu (c)
  y = MaxPool <kernel_shape = [2, 2], strides = [2, 2], ceil_mode = 1> (r)
}
"""


def _row(node: str, op: str, rule: str, attribute: str = "", severity: str = "error") -> dict[str, str]:
    return {"node": node, "op_type": op, "rule": rule, "attribute": attribute, "severity": severity,
            "profile": "rk3568"}


def test_patterns_and_what_a_rewrite_resolved() -> None:
    before = pd.DataFrame([_row("p1", "MaxPool", "param-limit", "ceil_mode"), _row("p2", "MaxPool", "param-limit",
                           "ceil_mode"), _row("in", "graph-input", "dynamic-input", "shape", "warn"),
                           _row("s", "Softmax", "precision", "", "info")])
    after = pd.DataFrame([_row("in", "graph-input", "dynamic-input", "shape", "warn")])
    assert patterns(before) == {("rk3568", "MaxPool", "param-limit", "ceil_mode"),
                                ("rk3568", "graph-input", "dynamic-input", "shape")}  # notes are not patterns
    assert resolved_patterns(before, after, {"p1"}) == [("rk3568", "MaxPool", "param-limit", "ceil_mode")]


def _pool_model(path: Path, seed: int) -> Path:
    model = onnx.parser.parse_model(POOL)
    w = np.random.default_rng(seed).normal(size=(4, 3, 1, 1)).astype(np.float32)
    model.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    onnx.save(model, path)
    return path


def test_case_saved_on_one_model_is_matched_and_replayed_on_another(tmp_path: Path) -> None:
    first, second = _pool_model(tmp_path / "a.onnx", 0), _pool_model(tmp_path / "b.onnx", 1)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(4):
        np.savez(calib / f"{i}.npz", x=np.random.default_rng(i).normal(size=(1, 3, 7, 7)).astype(np.float32))
    lib = tmp_path / "lib"
    assert run("rewrite", first, "--fix-ceil-mode", "--calib", calib, "-o", tmp_path / "a_fixed.onnx").returncode == 0
    assert run("scan", tmp_path / "a_fixed.onnx", "--calib", calib, "--profile", "rk3568", "--out", tmp_path / "run",
               "--quiet", "--no-report").returncode == 0
    saved = run("case", "save", tmp_path / "run", "--note", "RK refuses ceil_mode", "--cases", lib)
    assert saved.returncode == 0, saved.stderr
    (case,) = list_cases(lib)
    assert case["recipe"] == ["fix-ceil-mode"] and case["profile"] == "rk3568"
    assert case["pattern"] == [{"profile": "rk3568", "op_type": "MaxPool", "rule": "param-limit",
                                "attribute": "ceil_mode"}]
    assert "/" not in json.dumps(case["rewrites"]) .replace("proofs/", "")  # file names, no local paths
    listed = run("case", "list", "--cases", lib)
    assert listed.stdout.startswith(case["id"])
    shown = json.loads(run("case", "show", case["id"][:6], "--cases", lib).stdout)
    assert shown["id"] == case["id"]
    check = run("check", second, "--profile", "rk3568", "--cases", lib, "--out", tmp_path / "chk")
    assert f"seen in case {case['id']}" in check.stdout and "fix-ceil-mode" in check.stdout
    replay = run("rewrite", second, "--case", case["id"], "--cases", lib, "--calib", calib, "-o", tmp_path / "b2.onnx")
    assert replay.returncode == 0, replay.stderr
    proof = json.loads((tmp_path / "b2.onnx.rewrite.json").read_text())
    assert proof["passed"] and [s["rewrite"] for s in proof["steps"]] == ["fix-ceil-mode"]
    fixed = onnx.load(tmp_path / "b2.onnx")
    pool = next(n for n in fixed.graph.node if n.op_type == "MaxPool")
    assert all(a.i == 0 for a in pool.attribute if a.name == "ceil_mode")
    x = np.random.default_rng(9).normal(size=(1, 3, 7, 7)).astype(np.float32)
    np.testing.assert_allclose(ReferenceEvaluator(fixed).run(None, {"x": x})[0],
                               ReferenceEvaluator(onnx.load(second)).run(None, {"x": x})[0], rtol=0, atol=1e-6)
    assert match_cases(pd.DataFrame([_row("n", "Softmax", "unsupported-op")]), lib) == []
    with pytest.raises(UsageError, match="known"):
        load_case("nope", lib)
    unknown = run("rewrite", second, "--case", "nope", "--cases", lib, "-o", tmp_path / "b3.onnx")
    assert unknown.returncode == 2 and "quantscan: error: case" in unknown.stderr


@pytest.mark.real
def test_mtcnn_rnet_case_is_seen_on_onet_and_replayed_with_a_passing_proof(assets: Path, tmp_path: Path) -> None:
    lib = tmp_path / "lib"
    rnet, onet = asset_model(assets, "mtcnn_rnet"), asset_model(assets, "mtcnn_onet")
    fixed = tmp_path / "rnet_fixed.onnx"
    assert run("rewrite", rnet, "--fix-ceil-mode", "--calib", asset_calib(assets, "mtcnn_rnet"), "--limit", "4",
               "-o", fixed).returncode == 0
    assert run("scan", fixed, "--calib", asset_calib(assets, "mtcnn_rnet"), "--limit", "4", "--profile", "rk3568",
               "--out", tmp_path / "run", "--quiet", "--no-report", "--no-gain", "--tensors", "sites").returncode == 0
    assert run("case", "save", tmp_path / "run", "--note", "RK3568: MaxPool ceil_mode", "--cases", lib).returncode == 0
    (case,) = list_cases(lib)
    assert case["model"]["name"] == "mtcnn_rnet.onnx" and case["model"]["ops"]["PRelu"] == 4
    check = run("check", onet, "--profile", "rk3568", "--cases", lib, "--out", tmp_path / "chk")
    assert f"seen in case {case['id']}: MaxPool param-limit (ceil_mode) on rk3568 -> fix-ceil-mode" in check.stdout
    replay = run("rewrite", onet, "--case", case["id"], "--cases", lib, "--calib", asset_calib(assets, "mtcnn_onet"),
                 "--limit", "4", "-o", tmp_path / "onet_fixed.onnx")
    assert replay.returncode == 0, replay.stderr
    assert json.loads((tmp_path / "onet_fixed.onnx.rewrite.json").read_text())["passed"]
