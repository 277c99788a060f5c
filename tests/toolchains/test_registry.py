"""`toolchains.TOOLCHAINS`: each toolchain is one folder, and the commands reach it only through its line.

Two halves. The registry against the tree: every folder under toolchains/ is listed once, and each
offers what the commands it is listed for need (recorded logs of the real tools are the oracle for the
log readers). Then a toolchain planted as one registry entry (a folder's worth of callables, no other
module changed) is reached by `log`, `dumps` and `vendor` exactly as the real ones are.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import numpy as np
import onnx
import pandas as pd
import pytest
from onnx import helper

from quantscan.cli import main
from quantscan.device.dumps import open_dumps
from quantscan.errors import UsageError
from quantscan.toolchains import TOOLCHAINS
from quantscan.toolchains.dumpset import DumpSet
from quantscan.toolchains.folder import DumpReader, LogReader, ToolchainFolder, VendorRequest
from quantscan.toolchains.parsed import LayerSimilarity, ParsedLog
from quantscan.toolchains.result import VendorRun

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "quantscan" / "toolchains"
LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "vendorlog"
RECORDED_BY = {"rknn-2.5.0": "rknn", "tpu-mlir": "tpu-mlir", "hb_mapper-bayes-e": "horizon",
               "hb_mapper-bernoulli2": "horizon"}
"""Fixture folder of real conversion logs -> the toolchain that wrote them (each folder's README says so)."""


def _folders() -> dict[str, ToolchainFolder]:
    """Every folder under toolchains/ -> the entry its `__init__` states."""
    return {p.parent.name: importlib.import_module(f"quantscan.toolchains.{p.parent.name}").TOOLCHAIN
            for p in PACKAGE.glob("*/__init__.py")}


def test_every_toolchain_folder_is_listed_once() -> None:
    folders = _folders()
    assert sorted(folders) == ["horizon", "rknn", "tpumlir"]
    assert list(TOOLCHAINS.values()) == [folders["rknn"], folders["horizon"], folders["tpumlir"]]
    assert all(name == tool.name for name, tool in TOOLCHAINS.items())


@pytest.mark.parametrize("folder", ["horizon", "rknn", "tpumlir"])
def test_each_folder_has_what_its_commands_need(folder: str) -> None:
    tool = _folders()[folder]
    name = tool.name
    folder_path = PACKAGE / folder
    assert tool.log is not None and (folder_path / "log.py").is_file()  # every toolchain's log is read by `log`
    if tool.vendor is not None:  # `vendor TOOL`: a driver in the vendor's Python, found by its module
        assert (folder_path / "driver.py").is_file() and (folder_path / "run.py").is_file()
        assert tool.python is not None and tool.python.tool == name
        assert list(inspect.signature(tool.vendor).parameters) == ["model", "calib", "request"]
    if tool.dumps is not None:  # `dumps --format TOOL`: its reader, in its folder
        assert (folder_path / "dumps.py").is_file()


@pytest.mark.parametrize("name", sorted(n for n, t in TOOLCHAINS.items() if t.dumps is not None))
def test_each_dumps_reader_refuses_an_empty_folder_in_one_line(name: str, tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=f"^--dumps \\({name}\\): expected .* found none$"):
        open_dumps(tmp_path, name)


@pytest.mark.parametrize("log", sorted(p for p in LOGS.glob("*/*.log")), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_each_recorded_log_is_recognised_by_its_own_toolchain_only(log: Path) -> None:
    text = log.read_text(encoding="utf-8", errors="replace")
    recognised = [name for name, tool in TOOLCHAINS.items() if tool.log is not None and tool.log.looks_like(text)]
    assert recognised == [RECORDED_BY[log.parent.name]]


# --- a toolchain planted as one registry line ----------------------------------------------------------------


def _toy_parse(text: str) -> ParsedLog:
    """The toy tool prints `cosine LAYER VALUE` lines."""
    rows = [line.split() for line in text.splitlines() if line.startswith("cosine ")]
    return ParsedLog(tool="toykit", version="0.1", similarity=[
        LayerSimilarity(layer=r[1], vendor_op="Relu", entire_cosine=float(r[2])) for r in rows])


def _toy_dumps(folder: Path) -> DumpSet:
    files = sorted(folder.glob("*.toy.npy"))
    return DumpSet("toy", folder, [f.name.split(".")[0] for f in files],
                   lambda i: {"y": np.load(files[i]).astype(np.float32)})


def _toy_vendor(model: str | Path, calib: str | Path, request: VendorRequest) -> VendorRun:
    return VendorRun(tool="toykit", version="0.1", target=request.target, model=str(model), python="toy",
                     stages=["build"], error=None, log=str(request.out / "toy.log"), times={}, samples=0,
                     analysis_samples=0, qs_output_cosine={}, vendor_output_cosine={}, table=pd.DataFrame(
                         columns=["loss"]), findings=pd.DataFrame(), unexplained_placements=0,
                     explained_placements=0)


TOY = ToolchainFolder(
    name="toy", label="ToyKit",
    log=LogReader(lambda text: text.startswith("ToyKit "), _toy_parse),
    dumps=DumpReader(_toy_dumps, lambda folder: any(folder.glob("*.toy.npy")), "toy dumps (*.toy.npy)"),
    vendor=_toy_vendor,
)


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> ToolchainFolder:
    monkeypatch.setitem(TOOLCHAINS, TOY.name, TOY)
    return TOY


def _relu_model(path: Path) -> Path:
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_planted_toolchain_reads_its_log(planted: ToolchainFolder, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "toy.log"
    log.write_text("ToyKit 0.1\ncosine relu 0.25\ncosine y 0.5\n")
    assert main(["log", str(log), "--model", str(_relu_model(tmp_path / "m.onnx")), "--out",
                 str(tmp_path / "o")]) == 0
    layers = pd.read_csv(tmp_path / "o" / "log_layers.csv")
    assert layers["layer"].tolist() == ["relu", "y"] and layers["entire_cosine"].tolist() == [0.25, 0.5]
    assert layers["node"].tolist() == ["relu", "relu"]  # by node name, then by the output tensor it writes
    assert "lowest cosine 0.25000 at relu" in capsys.readouterr().out


def test_a_planted_toolchain_opens_its_dumps(planted: ToolchainFolder, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "000.toy.npy", np.arange(4.0))
    dumps = open_dumps(tmp_path)  # detected by its own reader
    assert dumps.format == "toy" and dumps.keys == ["000"]
    np.testing.assert_array_equal(dumps.load(0)["y"], np.arange(4.0, dtype=np.float32))
    assert main(["dumps", "m.onnx", "--calib", "c", "--dumps", "d", "--format", "nope"]) == 2
    assert "'toy'" in capsys.readouterr().err  # offered by `dumps --format` beside the real ones


def test_a_planted_toolchain_runs_as_vendor(planted: ToolchainFolder, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    calib = tmp_path / "calib"
    calib.mkdir()
    np.save(calib / "0.npy", np.ones((1, 4), dtype=np.float32))
    code = main(["vendor", "toy", str(_relu_model(tmp_path / "m.onnx")), "--calib", str(calib), "--target", "toychip",
                 "--out", str(tmp_path / "o")])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("toykit 0.1 (toychip): stage reached build")
    assert "0 vendor layers (no per-layer figures)" in out
