"""`quantscan vendor tpu-mlir` end to end against stand-in tpu-mlir scripts (tests/toolchains/fake_tpu_mlir.py).

The driver runs in a subprocess exactly as with the real tpu_mlir venv; only the four console scripts are
fake. The fake's int8 model rounds every op's FP32 value to a 1/16 grid, so each figure quantscan reads
back is checked against numpy; the plan path is checked against what the fake deploy was given.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from onnx.reference import ReferenceEvaluator

from builders import write_chain
from fakes import fake_tpu_mlir_python
from quantscan.api import scan
from quantscan.cli import main
from quantscan.toolchains import align
from quantscan.toolchains.tpumlir.run import run_tpumlir

HERE = Path(__file__).parent




def _cosine(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    return float(x @ y / np.sqrt((x @ x) * (y @ y)))


def _values(model_path: Path, calib: Path, n: int) -> dict[str, np.ndarray]:
    """Every node output of the FP32 model over the first n samples, stacked (the numpy oracle's input)."""
    model = onnx.load(model_path)
    names = [o for node in model.graph.node for o in node.output]
    xs = np.load(calib / "x.npy")
    runs = [ReferenceEvaluator(model).run(names, {"x": xs[i:i + 1]}) for i in range(n)]
    return {name: np.stack([r[k] for r in runs]) for k, name in enumerate(names)}


@pytest.fixture(scope="module")
def vendor_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("tpumlir")
    model, calib = write_chain(tmp, samples=5, layers=2)
    proto = onnx.load(model)
    proto.ir_version = 10  # what current exporters write; tpu-mlir's onnx 1.14 reads <= 9
    onnx.save(proto, model)
    run_tpumlir(model, calib, target="bm1684x", out=tmp / "out", scan=scan, python=fake_tpu_mlir_python(tmp))
    return tmp / "out", model, calib


def test_stages_files_and_ir9_copy(vendor_run: tuple[Path, Path, Path]) -> None:
    out, _, _ = vendor_run
    meta = json.loads((out / "vendor.json").read_text())
    assert meta["tool"] == "tpu-mlir" and meta["target"] == "bm1684x" and meta["error"] is None
    assert meta["stages"] == ["model_transform", "run_calibration", "model_deploy", "model_runner"]
    assert meta["samples"] == 5 and Path(meta["log"]).exists()
    assert not (out / "tpumlir" / "data").exists() and not (out / "tpumlir" / "feeds").exists()
    assert json.loads((out / "tpumlir" / "model.mlir.fake.json").read_text())["ir_version"] <= 9  # what it read
    assert not (out / "tpumlir" / "model.onnx").exists()  # the copy is not kept
    assert list(pd.read_csv(out / "vendor.csv").columns) == align.VENDOR_COLUMNS


def test_output_and_layer_cosines_match_numpy(vendor_run: tuple[Path, Path, Path]) -> None:
    out, model, calib = vendor_run
    values = _values(model, calib, 5)
    meta = json.loads((out / "vendor.json").read_text())
    y = values["y"]
    assert meta["vendor_output_cosine"]["y"] == pytest.approx(_cosine(y, np.round(y * 16) / 16), abs=1e-9)
    table = pd.read_csv(out / "vendor.csv").set_index("layer")
    # one row per op the fake kept (no Add: folded into the MatMul), mapped back to its ONNX tensor
    assert sorted(table.index) == sorted(["mm0_MatMul", "h0_Relu", "mm1_MatMul", "h1_Relu", "y_MatMul"])
    assert table.loc["h1_Relu", "tensor"] == "h1" and table.loc["h1_Relu", "node"] == "relu1"
    for layer, row in table.iterrows():
        x = values[str(row["tensor"])]
        assert row["vendor_entire_cosine"] == pytest.approx(_cosine(x, np.round(x * 16) / 16), abs=1e-9), layer
    assert table["vendor_single_cosine"].isna().all()  # tpu-mlir has no isolated per-layer figure
    assert table.loc["h1_Relu", "qs_cumulative_cosine"] == pytest.approx(
        pd.read_csv(out / "quantscan" / "tensors.csv").set_index("tensor").loc["h1", "cumulative_cosine"])


def test_plan_is_mapped_to_tpu_mlir_names_and_honoured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, calib = write_chain(tmp_path, samples=3, layers=2)
    plan = {
        "format": 1, "model": str(model), "model_sha256": "0" * 64,
        "target": {"metric": "cosine", "value": 0.999, "output": "y"}, "fallback": "float", "mode": "bisect",
        "status": "reached", "reached": True, "all_int8": {"cosine": 0.99}, "all_float": {"cosine": 1.0},
        "achieved": {"cosine": 0.9991},
        "sites": [{"node": "head", "nodes": ["head"], "output": "y", "precision": "float"},
                  {"node": "mm0", "nodes": ["mm0", "add0", "relu0"], "output": "h0", "precision": "int16"},
                  {"node": "gone", "nodes": ["gone"], "output": "not_in_graph", "precision": "float"}],
        "pareto": [], "evaluations": 3,
    }
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    code = main(["vendor", "tpu-mlir", str(model), "--calib", str(calib), "--target", "bm1684x",
                 "--python", str(fake_tpu_mlir_python(tmp_path)), "--out", str(tmp_path / "out"),
                 "--plan", str(plan_path)])
    assert code == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "not_in_graph" in line]  # one line names the dropped site
    assert len(said) == 1 and "name no op tpu-mlir knows" in said[0] and "stayed int8" in said[0]
    got = json.loads((tmp_path / "out" / "vendor.json").read_text())["plan"]
    assert got["error"] is None and got["dropped"] == ["not_in_graph"]
    sites = {s["site"]: s for s in got["sites"]}
    assert sites["y"]["ops"] == ["y_MatMul"] and sites["y"]["honoured"] == {"y_MatMul": "float32"}
    # the whole kernel: MatMul and Relu known, the folded bias Add's tensor vanished
    assert sites["h0"]["ops"] == ["mm0_MatMul", "h0_Relu"] and sites["h0"]["vanished"] == ["add0"]
    assert set(sites["h0"]["honoured"].values()) == {"float16"}
    # the head float: tpu-mlir's output is the exact FP32 output
    assert got["vendor_output_cosine"]["y"] == pytest.approx(1.0, abs=1e-12)
    assert got["quantscan_claimed_cosine"] == 0.9991


def test_relative_out_and_python_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, calib = write_chain(tmp_path, samples=2, layers=1)
    fake_tpu_mlir_python(tmp_path)
    monkeypatch.chdir(tmp_path)
    code = main(["vendor", "tpu-mlir", "chain.onnx", "--calib", "calib", "--target", "bm1684x",
                 "--python", "python", "--out", "rel", "--quiet"])
    assert code == 0
    meta = json.loads((tmp_path / "rel" / "vendor.json").read_text())
    assert meta["stage_reached"] == "model_runner" and meta["vendor_output_cosine"]


def test_toolkit_that_never_ran_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    model, calib = write_chain(tmp_path, samples=2, layers=1)
    monkeypatch.setenv("FAKE_TPU_FAIL", "model_transform")
    code = main(["vendor", "tpu-mlir", str(model), "--calib", str(calib), "--target", "bm1684x",
                 "--python", str(fake_tpu_mlir_python(tmp_path)), "--out", str(tmp_path / "o"), "--quiet"])
    assert code == 2
    assert "model_transform exited 1" in capsys.readouterr().err
    meta = json.loads((tmp_path / "o" / "vendor.json").read_text())
    assert meta["stage_reached"] == "none" and meta["error"]["stage"] == "model_transform"


def test_calib_method_minmax_is_max_on_both_sides(tmp_path: Path) -> None:
    model, calib = write_chain(tmp_path, samples=2, layers=1)
    python = str(fake_tpu_mlir_python(tmp_path))
    code = main(["vendor", "tpu-mlir", str(model), "--calib", str(calib), "--target", "bm1684x", "--python", python,
                 "--out", str(tmp_path / "mm"), "--calib-method", "minmax", "--quiet"])
    assert code == 0
    assert "method: use_max" in (tmp_path / "mm" / "tpumlir" / "model_cali_table").read_text()
    assert json.loads((tmp_path / "mm" / "quantscan" / "run.json").read_text())["options"]["calib_method"] == "minmax"
    code = main(["vendor", "tpu-mlir", str(model), "--calib", str(calib), "--target", "bm1684x", "--python", python,
                 "--out", str(tmp_path / "kl"), "--quiet"])
    assert code == 0
    assert "method: kl (default)" in (tmp_path / "kl" / "tpumlir" / "model_cali_table").read_text()
    assert json.loads((tmp_path / "kl" / "quantscan" / "run.json").read_text())["options"]["calib_method"] == "entropy"


def test_calib_method_is_refused_for_rknn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, calib = write_chain(tmp_path, samples=2, layers=1)
    code = main(["vendor", "rknn", str(model), "--calib", str(calib), "--target", "rk3588", "--python", sys.executable,
                 "--out", str(tmp_path / "r"), "--calib-method", "minmax"])
    assert code == 2 and "tpu-mlir only" in capsys.readouterr().err
