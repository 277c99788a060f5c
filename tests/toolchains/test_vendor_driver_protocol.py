"""`quantscan vendor rknn` end to end against a stand-in toolkit (tests/vendor/fake_rknn_api.py).

The driver runs in a subprocess exactly as with the real rknn-toolkit2; only `rknn.api` is fake. The
fake's simulator rounds to a 1/16 grid, so every figure quantscan reads back is checked against numpy.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from builders import run, write_chain
from quantscan.api import scan
from quantscan.cli import main
from quantscan.errors import UsageError
from quantscan.toolchains import align
from quantscan.toolchains.interpreter import find_python
from quantscan.toolchains.rknn.kit import PYTHON as RKNN
from quantscan.toolchains.rknn.run import run_rknn

HERE = Path(__file__).parent


def _fake_python(tmp: Path) -> Path:
    """A `python` that imports the stand-in rknn.api (our interpreter with the fake on its path)."""
    pkg = tmp / "fake_site" / "rknn"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    shutil.copy(HERE / "fake_rknn_api.py", pkg / "api.py")
    wrapper = tmp / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{tmp / "fake_site"}" exec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    return wrapper


def _pooled_cosine(refs: list[np.ndarray]) -> float:
    x = np.concatenate([r.ravel() for r in refs]).astype(np.float64)
    y = np.round(x * 16.0) / 16.0
    return float(x @ y / np.sqrt((x @ x) * (y @ y)))


@pytest.fixture(scope="module")
def vendor_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("vendor")
    model, calib = write_chain(tmp, samples=6, layers=3)
    python = _fake_python(tmp)
    run_rknn(model, calib, target="rk3588", out=tmp / "out", scan=scan, python=python, analysis_samples=4)
    return tmp / "out", model, calib


def test_files_and_stages(vendor_run: tuple[Path, Path, Path]) -> None:
    out, _, _ = vendor_run
    meta = json.loads((out / "vendor.json").read_text())
    assert meta["version"] == "0.0.0-fake" and meta["stage_reached"] == "accuracy_analysis"
    assert meta["samples"] == 6 and meta["analysis_samples"] == 4 and meta["error"] is None
    assert Path(meta["log"]).exists() and not (out / "rknn" / "data").exists()
    table = pd.read_csv(out / "vendor.csv")
    assert list(table.columns) == align.VENDOR_COLUMNS
    assert len(table) == 10  # one row per layer the fake analysed: 3 x (MatMul, Add, Relu) + head


def test_output_and_layer_cosines_match_numpy(vendor_run: tuple[Path, Path, Path]) -> None:
    out, model_path, calib = vendor_run
    import onnx

    model = onnx.load(model_path)
    xs = np.load(calib / "x.npy")
    ys = [run(model, {"x": xs[i:i + 1]})[0] for i in range(6)]
    meta = json.loads((out / "vendor.json").read_text())
    assert meta["vendor_output_cosine"]["y"] == pytest.approx(_pooled_cosine(ys), abs=1e-9)
    # entire: pooled over the 4 analysed samples from the dumps, not the mean of printed figures
    from onnx.reference import ReferenceEvaluator

    ref = ReferenceEvaluator(model)
    h1 = [ref.run(["h1"], {"x": xs[i:i + 1]})[0] for i in range(4)]
    row = pd.read_csv(out / "vendor.csv").set_index("layer").loc["h1"]
    assert row["vendor_entire_cosine"] == pytest.approx(_pooled_cosine(h1), abs=1e-9)
    assert row["node"] == "relu1" and row["loss"] in ("none", "quantization", "lowering")


def test_planted_cpu_placement_is_a_finding(vendor_run: tuple[Path, Path, Path]) -> None:
    out, _, _ = vendor_run
    findings = pd.read_csv(out / "vendor_findings.csv")
    assert findings[["node", "value", "limit"]].values.tolist() == [["relu0", "cpu", "npu"]]
    assert json.loads((out / "vendor.json").read_text())["placement_mismatches"] == {"unexplained": 1,
                                                                                      "explained": 0}


def test_plan_goes_through_hybrid_quantization(tmp_path: Path) -> None:
    model, calib = write_chain(tmp_path, samples=3, layers=2)
    plan = {
        "format": 1, "model": str(model), "model_sha256": "0" * 64,
        "target": {"metric": "cosine", "value": 0.999, "output": "y"}, "fallback": "float", "mode": "bisect",
        "status": "reached", "reached": True, "all_int8": {"cosine": 0.99}, "all_float": {"cosine": 1.0},
        "achieved": {"cosine": 0.9991},
        "sites": [{"node": "mm1", "nodes": ["mm1", "add1", "relu1"], "output": "h1", "precision": "float"}],
        "pareto": [], "evaluations": 3,
    }
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    got = run_rknn(model, calib, target="rk3588", out=tmp_path / "out", scan=scan, python=_fake_python(tmp_path),
                   analysis_samples=0, plan=plan_path)
    assert got.plan is not None and got.plan["error"] is None and got.plan["warning"] is None
    assert got.plan["quantscan_claimed_cosine"] == 0.9991 and "y" in got.plan["vendor_output_cosine"]
    applied = (tmp_path / "out" / "rknn" / "hybrid" / "plan" / "chain.quantization.cfg").read_text()
    # every tensor of the float kernel step 1 knows (not only its output); the folded Add's is not named
    # (the fake, like rknn-toolkit2 2.5.0, refuses step 2 on a name its step 1 did not list)
    assert '"mm1": float16' in applied and '"h1": float16' in applied and '"add1"' not in applied
    assert got.plan["names"] == {"mm1": ["mm1", "h1"]} and got.plan["vanished"] == []
    assert got.plan["dropped"] == {"mm1": ["add1"]}  # the Add's output, folded by step 1
    # honoured: read back from the step-2 build's layer table, node by node
    assert got.plan["honoured"] == [{"node": "mm1", "requested": "float16", "ran": "float16",
                                     "dtypes": ["float16"], "honoured": True, "names": ["mm1", "h1"]}]
    # the simulator's grid is 2**2 finer with two tensors float16: the cosine numpy computes for it
    import onnx

    xs = np.load(calib / "x.npy")
    ys = np.concatenate([run(onnx.load(model), {"x": xs[i:i + 1]})[0].ravel() for i in range(3)]).astype(np.float64)
    sim = np.round(ys * 64.0) / 64.0
    assert got.plan["vendor_output_cosine"]["y"] == pytest.approx(sim @ ys / np.sqrt((sim @ sim) * (ys @ ys)), abs=1e-9)


def test_plan_is_scored_on_its_own_held_out_samples(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 38 part 3: vendor.json `plan.held_out` is RKNN on the samples the plan's claim was measured
    on (odd ones: the interleaved split), for the plan and for the plain all-int8 build."""
    import onnx

    model, calib = write_chain(tmp_path, samples=4, layers=2)
    plan = {
        "format": 1, "model": str(model), "model_sha256": "0" * 64,
        "target": {"metric": "cosine", "value": 0.999, "output": "y"}, "fallback": "float", "mode": "bisect",
        "status": "reached", "reached": True, "all_int8": {"cosine": 0.99}, "all_float": {"cosine": 1.0},
        "achieved": {"cosine": 0.9991}, "interval": {"low": 0.998, "high": 0.9995},
        "held_out": {"search_samples": 2, "held_out_samples": 2,
                     "split": "interleave: even samples searched, odd samples held out"},
        "sites": [{"node": "mm1", "nodes": ["mm1", "add1", "relu1"], "output": "h1", "precision": "float"}],
        "pareto": [], "evaluations": 3,
    }
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan))
    code = main(["vendor", "rknn", str(model), "--calib", str(calib), "--target", "rk3588", "--python",
                 str(_fake_python(tmp_path)), "--out", str(tmp_path / "out"), "--plan", str(plan_path)])
    assert code == 0, capsys.readouterr().err
    held = json.loads((tmp_path / "out" / "vendor.json").read_text())["plan"]["held_out"]
    xs = np.load(calib / "x.npy")
    ys = np.concatenate([run(onnx.load(model), {"x": xs[i:i + 1]})[0].ravel() for i in (1, 3)]).astype(np.float64)

    def cos(grid: float) -> float:  # the fake simulator: outputs rounded to 1/grid (1/16 int8, 1/64 two float16)
        sim = np.round(ys * grid) / grid
        return float(sim @ ys / np.sqrt((sim @ sim) * (ys @ ys)))

    assert held["samples"] == [1, 3]
    assert held["vendor"] == pytest.approx(cos(64.0), abs=1e-9)
    assert held["vendor_all_int8"] == pytest.approx(cos(16.0), abs=1e-9)
    assert (held["claimed"], held["claimed_all_int8"], held["interval"]) == (0.9991, 0.99, plan["interval"])
    assert f"rknn-toolkit2 {held['vendor']:.5f}" in capsys.readouterr().out


def test_find_python_refuses_one_without_the_toolkit(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="imports rknn.api"):
        find_python(RKNN, sys.executable if "rknn" not in sys.modules else "/nonexistent")
    with pytest.raises(UsageError, match="found none"):
        find_python(RKNN, places=[Path(sys.executable)])
    fake = _fake_python(tmp_path)
    assert find_python(RKNN, fake).name == "python"
    assert find_python("rknn", fake) == find_python(RKNN, fake)  # the tool's name, as callers before kit.py said


def test_cli_bad_python_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, calib = write_chain(tmp_path, samples=2, layers=1)
    code = main(["vendor", "rknn", str(model), "--calib", str(calib), "--target", "rk3588",
                 "--python", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("quantscan: error: --python: expected")
    assert main(["vendor", "tpu-mlir", str(model), "--calib", str(calib), "--target", "bm1684x"]) == 2


def test_cli_prints_both_cosines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model, calib = write_chain(tmp_path, samples=2, layers=1)
    env_before = dict(os.environ)
    code = main(["vendor", "rknn", str(model), "--calib", str(calib), "--target", "rk3588", "--quiet",
                 "--python", str(_fake_python(tmp_path)), "--analysis-samples", "1", "--out", str(tmp_path / "o")])
    assert code == 0 and dict(os.environ) == env_before
    printed = capsys.readouterr().out
    assert "stage reached accuracy_analysis" in printed and "rknn-toolkit2 simulator" in printed


def test_a_python_that_exits_0_without_importing_the_toolkit_fails_the_check(tmp_path: Path) -> None:
    """A wrapper that exits 0 whatever it is asked (issue 31) is not a Python that imports rknn.api."""
    liar = tmp_path / "python"
    liar.write_text("#!/bin/sh\nexit 0\n")
    liar.chmod(liar.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(UsageError, match="imports rknn.api"):
        find_python(RKNN, liar)


def test_a_relative_python_is_run_from_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver runs with its work folder as cwd: a relative --python must not be looked up there."""
    _fake_python(tmp_path)
    monkeypatch.chdir(tmp_path)
    found = find_python(RKNN, "python")
    assert found.is_absolute() and found == tmp_path / "python"


def test_vendor_that_never_reaches_the_toolkit_is_not_exit_0(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """rknn.api imports, but the driver dies before any stage: an empty vendor.csv is no comparison."""
    python = _fake_python(tmp_path)
    (tmp_path / "fake_site" / "rknn" / "api.py").write_text("raise_later = True\n")  # no RKNN class
    model, calib = write_chain(tmp_path, samples=2, layers=1)
    code = main(["vendor", "rknn", str(model), "--calib", str(calib), "--target", "rk3588", "--python", str(python),
                 "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "never reached a stage" in err, err


def test_relative_out_and_python_reach_the_toolkit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32: the driver starts in out/rknn, so a relative job path or interpreter named the wrong
    file and the run stopped before the toolkit ('stage reached none')."""
    model, calib = write_chain(tmp_path, samples=2, layers=1)
    _fake_python(tmp_path)
    monkeypatch.chdir(tmp_path)
    code = main(["vendor", "rknn", "chain.onnx", "--calib", "calib", "--target", "rk3588", "--quiet",
                 "--python", "python", "--analysis-samples", "1", "--out", "rel"])
    assert code == 0 and "stage reached accuracy_analysis" in capsys.readouterr().out
    assert json.loads((tmp_path / "rel" / "vendor.json").read_text())["stages"][-1] == "accuracy_analysis"


def test_a_run_that_never_reached_the_toolkit_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A toolkit whose every call fails before a stage completes: vendor.csv compares nothing, not exit 0."""
    model, calib = write_chain(tmp_path, samples=2, layers=1)
    python = _fake_python(tmp_path)
    api = tmp_path / "fake_site" / "rknn" / "api.py"
    api.write_text(api.read_text().replace("    def load_onnx(self, model: str, inputs: Any = None, "
                                           "input_size_list: Any = None) -> int:\n",
                                           "    def load_onnx(self, model: str, inputs: Any = None, "
                                           "input_size_list: Any = None) -> int:\n        return -1\n"))
    code = main(["vendor", "rknn", str(model), "--calib", str(calib), "--target", "rk3588", "--quiet",
                 "--python", str(python), "--out", str(tmp_path / "o")])
    captured = capsys.readouterr()
    assert code == 2 and "stage reached none" in captured.out and "never reached a stage" in captured.err


def test_a_failed_hybrid_step1_is_recorded_not_fatal(tmp_path: Path) -> None:
    """The plain build compared fine; a plan whose step 1 fails is an error in vendor.json's plan."""
    model, calib = write_chain(tmp_path, samples=2, layers=1)
    python = _fake_python(tmp_path)
    api = tmp_path / "fake_site" / "rknn" / "api.py"
    api.write_text(api.read_text().replace("    def hybrid_quantization_step1(self, dataset: str = \"\", "
                                           "**kwargs: Any) -> int:\n",
                                           "    def hybrid_quantization_step1(self, dataset: str = \"\", "
                                           "**kwargs: Any) -> int:\n        return -1\n"))
    plan = {"format": 1, "model": str(model), "model_sha256": "0" * 64,
            "target": {"metric": "cosine", "value": 0.999, "output": "y"}, "fallback": "float", "mode": "bisect",
            "status": "reached", "reached": True, "achieved": {"cosine": 0.9991},
            "sites": [{"node": "mm0", "nodes": ["mm0", "add0", "relu0"], "output": "h0", "precision": "float"}],
            "pareto": [], "evaluations": 3}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    got = run_rknn(model, calib, target="rk3588", out=tmp_path / "out", scan=scan, python=python, analysis_samples=0,
                   plan=tmp_path / "plan.json")
    assert got.stages[-1] == "simulator" and got.plan is not None
    assert got.plan["error"]["stage"] == "hybrid_step1" and "rknn hybrid step 1" in got.plan["error"]["message"]
    assert json.loads((tmp_path / "out" / "vendor.json").read_text())["plan"]["error"]["stage"] == "hybrid_step1"
