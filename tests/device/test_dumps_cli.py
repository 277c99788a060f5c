"""`quantscan dumps` end to end on the tiny chain model: files written, and one-line exit-2 answers when
the dumps do not fit (a missing sample, an unknown layout, names that match nothing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from qdq_dumps import dump, saved_qdq, tensor_names

from builders import write_chain
from quantscan.cli import main
from quantscan.device import compare_dumps
from quantscan.device.table import DEVICE_COLUMNS


@pytest.fixture(scope="module")
def dumped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("cli")
    model, calib = write_chain(tmp, samples=16, layers=4)
    folder = dump(saved_qdq(tmp, model, calib), tensor_names(model), calib, tmp / "dumps")
    return model, calib, folder


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    got = capsys.readouterr()
    return code, got.out, got.err


def test_cli_writes_device_csv_and_its_summary_section(dumped, tmp_path: Path, capsys) -> None:
    model, calib, folder = dumped
    out = tmp_path / "run"
    for _ in range(2):  # a second run replaces its section, it does not add one
        code, text, _ = _run(capsys, "dumps", str(model), "--calib", str(calib), "--dumps", str(folder),
                             "--out", str(out), "--quiet")
        assert code == 0
    assert "5 of 5 sites aligned" in text and "follows the simulation" in text
    table = pd.read_csv(out / "device.csv")
    assert list(table.columns) == DEVICE_COLUMNS
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert summary.count("## Device dumps") == 1


def test_a_device_csv_quantscan_did_not_write_is_kept(dumped, tmp_path: Path, capsys) -> None:
    """Issue 31's rule holds for dumps too: a user's own device.csv in --out is not replaced (exit 2, the
    file unchanged) unless --force."""
    model, calib, folder = dumped
    out = tmp_path / "mine"
    out.mkdir()
    (out / "device.csv").write_text("my own table\n", encoding="utf-8")
    argv = ["dumps", str(model), "--calib", str(calib), "--dumps", str(folder), "--out", str(out), "--quiet"]
    code, _, err = _run(capsys, *argv)
    assert "not written by quantscan" in _one_line_error(code, err)
    assert (out / "device.csv").read_text(encoding="utf-8") == "my own table\n"
    assert _run(capsys, *argv, "--force")[0] == 0
    assert list(pd.read_csv(out / "device.csv").columns) == DEVICE_COLUMNS


def _write(folder: Path, arrays: dict[str, dict[str, np.ndarray]]) -> Path:
    folder.mkdir()
    for stem, values in arrays.items():
        np.savez(folder / f"{stem}.npz", **values)  # type: ignore[arg-type]
    return folder


def _one_line_error(code: int, err: str) -> str:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantscan: error: ")
    return lines[0]


def test_a_sample_the_calibration_does_not_have(dumped, tmp_path: Path, capsys) -> None:
    model, calib, folder = dumped
    good = dict(np.load(folder / "000.npz"))
    bad = _write(tmp_path / "d", {"000": good, "099": good})
    line = _one_line_error(*_run(capsys, "dumps", str(model), "--calib", str(calib), "--dumps", str(bad),
                                 "--out", str(tmp_path / "o"))[::2])
    assert "found '099'" in line


def test_names_that_match_nothing(dumped, tmp_path: Path, capsys) -> None:
    model, calib, _ = dumped
    rng = np.random.default_rng(0)
    bad = _write(tmp_path / "d", {"000": {"conv_17": rng.normal(size=(1, 7, 3)).astype(np.float32)}})
    line = _one_line_error(*_run(capsys, "dumps", str(model), "--calib", str(calib), "--dumps", str(bad),
                                 "--out", str(tmp_path / "o"))[::2])
    assert "found none of 1 (conv_17)" in line


def test_an_unknown_layout(dumped, tmp_path: Path, capsys) -> None:
    model, calib, folder = dumped
    values = dict(np.load(folder / "000.npz"))
    values["h1"] = values["h1"][:, :12]
    bad = _write(tmp_path / "d", {"000": values})
    line = _one_line_error(*_run(capsys, "dumps", str(model), "--calib", str(calib), "--dumps", str(bad),
                                 "--out", str(tmp_path / "o"))[::2])
    assert "'h1'" in line and "unknown layout" in line


def test_a_tensor_missing_from_a_later_sample(dumped, tmp_path: Path, capsys) -> None:
    model, calib, folder = dumped
    first, second = dict(np.load(folder / "000.npz")), dict(np.load(folder / "001.npz"))
    del second["h2"]
    bad = _write(tmp_path / "d", {"000": first, "001": second})
    line = _one_line_error(*_run(capsys, "dumps", str(model), "--calib", str(calib), "--dumps", str(bad),
                                 "--out", str(tmp_path / "o"))[::2])
    assert "'h2'" in line and "missing in 001" in line


def test_a_folder_without_dumps(dumped, tmp_path: Path, capsys) -> None:
    model, calib, _ = dumped
    (tmp_path / "empty").mkdir()
    line = _one_line_error(*_run(capsys, "dumps", str(model), "--calib", str(calib), "--dumps",
                                 str(tmp_path / "empty"), "--out", str(tmp_path / "o"))[::2])
    assert "--format" in line


def test_unknown_names_are_aligned_by_value(dumped, tmp_path: Path) -> None:
    """A runtime with its own names: every site still found, by its values, and the device still equal
    to the simulation there."""
    model, calib, folder = dumped
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    names: dict[str, str] = {}
    for path in sorted(folder.glob("*.npz")):
        values = dict(np.load(path))
        names = {k: f"t{i}" for i, k in enumerate(sorted(values))}
        np.savez(renamed / path.name, **{names[k]: v for k, v in values.items()})
    table = compare_dumps(model, calib, renamed).table
    assert (table["aligned_by"].str.startswith("value")).all()
    assert list(table["dump"]) == [names[t] for t in table["tensor"]]
    assert (table["sim_device_sqnr_db"] > 100).all()


def test_dumps_into_a_scan_folder_add_to_its_summary_and_report(dumped, tmp_path: Path, capsys) -> None:
    model, calib, folder = dumped
    out = tmp_path / "run"
    assert _run(capsys, str(model), "--calib", str(calib), "--out", str(out), "--quiet", "--no-gain")[0] == 0
    scan_summary = (out / "summary.md").read_text(encoding="utf-8")
    assert "Device dumps" not in (out / "report.html").read_text(encoding="utf-8")
    assert _run(capsys, "dumps", str(model), "--calib", str(calib), "--dumps", str(folder), "--out", str(out),
                "--quiet")[0] == 0
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert summary.startswith(scan_summary.rstrip()) and "## Device dumps" in summary
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "Device dumps" in page and "<svg" in page and "Layers, ranked" in page
    # `quantscan report` rebuilds the same page from the folder's files
    assert _run(capsys, "report", str(out))[0] == 0
    assert "Device dumps" in (out / "report.html").read_text(encoding="utf-8")
