"""`measure()` writes nothing; `api.save_scan(result, out)` writes exactly the run folder's files.

Also: the typed records of a scan survive their JSON form (run.json), and the package's public
`quantscan.scan` stays the function even after its submodules are imported.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

import quantscan
from quantscan.api import save_scan, scan
from quantscan.errors import UsageError
from quantscan.records import Headline, OutputMetrics, RunInfo
from quantscan.scanning import ScanResult

TINY = """
<ir_version: 8, opset_import: ["" : 13]>
g (float[N, 3, 4, 4] x) => (float[N, 2, 4, 4] y) {
  c = Conv (x, w)
  y = Relu (c)
}
"""

CONTRACT = {"layers.csv", "tensors.csv", "ops.csv", "channels.csv", "hist.npz", "summary.md", "run.json"}


@pytest.fixture()
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    model = onnx.parser.parse_model(TINY)
    w = np.random.default_rng(0).normal(size=(2, 3, 1, 1)).astype(np.float32)
    model.graph.initializer.append(onnx.numpy_helper.from_array(w, "w"))
    path = tmp_path / "tiny.onnx"
    onnx.save(model, path)
    calib = tmp_path / "calib"
    calib.mkdir()
    for i in range(3):
        np.savez(calib / f"{i}.npz", x=np.random.default_rng(i).normal(size=(1, 3, 4, 4)).astype(np.float32))
    return path, calib


@pytest.fixture()
def result(tiny: tuple[Path, Path], tmp_path: Path) -> ScanResult:
    model, calib = tiny
    before = sorted(p.name for p in tmp_path.iterdir())
    res = scan(model, calib)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # scan() alone writes nothing
    return res


def test_scan_without_out_writes_nothing(
    tiny: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, calib = tiny
    monkeypatch.chdir(tmp_path)  # no default folder either (`reports/` is the CLI's default only)
    before = sorted(tmp_path.rglob("*"))
    res = quantscan.scan(model, calib)
    assert sorted(tmp_path.rglob("*")) == before
    assert not (tmp_path / "reports").exists()
    assert res.files == []
    assert isinstance(res.headline, Headline)
    assert isinstance(res.output_metrics["y"], OutputMetrics)


def test_save_writes_exactly_the_contract_files(result: ScanResult, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result.no_report = True
    written = save_scan(result, out)
    assert {p.name for p in out.iterdir()} == CONTRACT
    assert {p.name for p in written} == CONTRACT
    result.no_report = False
    again = tmp_path / "run2"
    save_scan(result, again)
    assert {p.name for p in again.iterdir()} == CONTRACT | {"report.html"}


def test_save_refuses_a_file_as_folder(result: ScanResult, tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(UsageError):
        save_scan(result, target)


def test_scan_out_is_save(tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model, calib = tiny
    out = tmp_path / "run"
    res = quantscan.scan(model, calib, out=out, no_report=True)
    assert {p.name for p in out.iterdir()} == CONTRACT
    run = json.loads((out / "run.json").read_text())
    assert run["headline"]["output"] == res.headline.output == "y"
    assert run["warnings"] == res.warnings
    assert run["options"]["calib_method"] == "minmax"
    assert run["options"]["activations"] == "uint8"


def test_run_info_survives_its_json_form(result: ScanResult, tmp_path: Path) -> None:
    save_scan(result, tmp_path / "run")
    text = json.loads((tmp_path / "run" / "run.json").read_text())
    back = RunInfo.from_json(text)
    assert back.to_json() == text
    assert back.headline.output == result.headline.output
    assert back.output_metrics["y"].cosine == pytest.approx(result.output_metrics["y"].cosine)


def test_output_metrics_json_keeps_optional_figures_out() -> None:
    row = OutputMetrics(1.0, math.inf, 0.0, 0.0, 0.0, 1.0, 1.0).to_json()
    assert "top1_agreement" not in row and "accuracy" not in row
    full = OutputMetrics(0.9, 20.0, 0.1, 0.2, 0.3, 0.8, 0.85, top1_agreement=0.5, accuracy=0.7)
    assert OutputMetrics.from_json(full.to_json()) == full


def test_package_name_stays_the_function() -> None:
    import quantscan.bisect.driver  # noqa: F401  (imports the scanning package first)
    import quantscan.scanning.evaluate  # noqa: F401
    import quantscan.scanning.tables  # noqa: F401

    assert callable(quantscan.scan)
    assert quantscan.scan is scan
