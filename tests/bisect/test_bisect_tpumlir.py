"""`bisect --evaluator tpu-mlir` / `--verify tpu-mlir` through the real driver protocol, with stand-in scripts.

The driver runs in a subprocess exactly as with the tpu_mlir venv; only the four console scripts are fake
(tests/toolchains/fake_tpu_mlir.py): its int8 model rounds every op's FP32 value to a 1/16 grid unless the
quantize table sets the op to F32/F16, so the output cosine of any set of float sites has a numpy oracle:
exact (1.0) when the head MatMul `y_MatMul` is in the table, else the rounded output's cosine.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from builders import run, write_chain
from fakes import fake_tpu_mlir_python
from quantscan.cli import main

FAKE = Path(__file__).parents[1] / "toolchains" / "fake_tpu_mlir.py"




def _int8_cosine(model: Path, calib: Path, samples: int) -> float:
    """The fake's all-int8 output cosine, pooled over the samples: y against y rounded to 1/16 (numpy)."""
    xs = np.load(calib / "x.npy")
    y = np.concatenate([run(onnx.load(model), {"x": xs[i:i + 1]})[0].ravel() for i in range(samples)])
    y = y.astype(np.float64)
    q = np.round(y * 16.0) / 16.0
    return float(y @ q / np.sqrt((y @ y) * (q @ q)))


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, float, int]:
    tmp = tmp_path_factory.mktemp("tpujudge")
    model, calib = write_chain(tmp, samples=3, layers=2)
    int8 = _int8_cosine(model, calib, 3)
    target = (int8 + 1.0) / 2  # all-int8 misses; the head alone float meets it
    code = main(["bisect", str(model), "--calib", str(calib), "--profile", "bm1684x", "--target-cosine",
                 f"{target:.9f}", "--quiet", "--out", str(tmp / "ev"), "--evaluator", "tpu-mlir", "--verify",
                 "tpu-mlir", "--vendor-python", str(fake_tpu_mlir_python(tmp)), "--export", "tpu-mlir", "rknn"])
    assert code == 0
    return tmp, model, calib, int8, 3


def test_evaluator_searches_on_tpu_mlirs_own_output(searched: tuple[Path, Path, Path, float, int]) -> None:
    tmp, _, _, int8, _ = searched
    plan = json.loads((tmp / "ev" / "plan.json").read_text())
    assert [s["node"] for s in plan["sites"]] == ["head"] and plan["achieved"]["cosine"] == pytest.approx(1.0)
    for step in plan["steps"]:  # every figure the search saw is the fake tpu-mlir's output, scored against FP32
        expected = 1.0 if "head" in step["sites"] else int8
        assert step["value"] == pytest.approx(expected, abs=1e-9), step
    toolchain = tmp / "ev" / "toolchain"
    assert len(list(toolchain.glob("eval-*"))) == plan["evaluations"]  # one model_deploy per evaluation
    assert len(list(toolchain.glob("prepared/model.mlir"))) == 1  # transform + calibrate once
    assert "model_transform" not in (next(toolchain.glob("eval-*")) / "tpu-mlir.log").read_text()
    session = json.loads((tmp / "ev" / "session.json").read_text())
    assert session["options"]["evaluator"] == "tpu-mlir"


def test_verify_reapplies_the_plan_and_exports_tpu_mlirs_names(searched: tuple[Path, Path, Path, float, int]) -> None:
    tmp, _, _, _, _ = searched
    plan = json.loads((tmp / "ev" / "plan.json").read_text())
    verified = plan["verified"]
    assert verified["tool"] == "tpu-mlir" and verified["version"] == "0.0.0-fake"
    assert verified["value"] == pytest.approx(plan["achieved"]["cosine"], abs=1e-12) and verified["vanished"] == []
    assert verified["honoured"] == [{"node": "head", "requested": "float32", "ran": "float32", "dtypes": ["float32"],
                                     "honoured": True, "names": ["y_MatMul"]}]
    # the export names what the build's qtable held: the op model_transform named for the head
    applied = next((tmp / "ev" / "toolchain").glob("verify-001-*")) / "applied.qtable"
    lines = [ln for ln in applied.read_text().splitlines() if not ln.startswith("#")]
    exported = [ln for ln in (tmp / "ev" / "tpu_mlir.qtable").read_text().splitlines() if not ln.startswith("#")]
    assert lines == exported == ["y_MatMul F32"]
    # RKNN's cfg does not get tpu-mlir's op names (they are the qtable's): it keeps its ONNX-predicted ones
    assert "y_MatMul" not in (tmp / "ev" / "rknn_hybrid_quant.cfg").read_text()


def test_plan_reapplied_by_vendor_tpu_mlir_lands_on_the_search_figure(
        searched: tuple[Path, Path, Path, float, int]) -> None:
    tmp, model, calib, _, _ = searched
    code = main(["vendor", "tpu-mlir", str(model), "--calib", str(calib), "--target", "bm1684x", "--quiet",
                 "--python", str(tmp / "python"), "--out", str(tmp / "again"), "--plan", str(tmp / "ev" / "plan.json")])
    assert code == 0
    got = json.loads((tmp / "again" / "vendor.json").read_text())["plan"]
    plan = json.loads((tmp / "ev" / "plan.json").read_text())
    assert got["vendor_output_cosine"]["y"] == pytest.approx(plan["achieved"]["cosine"], abs=1e-12)


def test_a_failed_transform_is_one_line_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    model, calib = write_chain(tmp_path, samples=2, layers=1)
    monkeypatch.setenv("FAKE_TPU_FAIL", "model_transform")
    code = main(["bisect", str(model), "--calib", str(calib), "--profile", "bm1684x", "--target-cosine", "0.9999",
                 "--quiet", "--out", str(tmp_path / "o"), "--evaluator", "tpu-mlir",
                 "--vendor-python", str(fake_tpu_mlir_python(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "model_transform exited 1" in err


def test_evaluator_tpu_mlir_needs_a_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, calib = write_chain(tmp_path, samples=2, layers=1)
    code = main(["bisect", str(model), "--calib", str(calib), "--target-cosine", "0.99", "--quiet",
                 "--evaluator", "tpu-mlir", "--vendor-python", str(fake_tpu_mlir_python(tmp_path))])
    err = capsys.readouterr().err
    assert code == 2 and "expected --profile CHIP (e.g. bm1684x), found none" in err
