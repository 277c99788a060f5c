"""runfolder: the one writer and reader of a run folder."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from quantscan import runfolder
from quantscan.errors import UsageError


def test_atomic_write_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "a.txt"
    runfolder.atomic_write_text(target, "one")
    runfolder.atomic_write_text(target, "two")
    assert target.read_text() == "two"
    assert [p.name for p in target.parent.iterdir()] == ["a.txt"]


def test_failed_atomic_write_keeps_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "a.bin"
    runfolder.atomic_write_bytes(target, b"old")

    with pytest.raises(TypeError):
        runfolder.atomic_write_bytes(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]


def test_json_writes_non_finite_as_strings(tmp_path: Path) -> None:
    data: dict[str, Any] = {"a": math.inf, "b": [math.nan, np.float32(1.5)], "c": np.int64(3), "p": Path("x")}
    runfolder.write_json(tmp_path / "r.json", data)
    text = (tmp_path / "r.json").read_text()
    assert '"inf"' in text and '"nan"' in text and "Infinity" not in text and "NaN" not in text
    assert runfolder.jsonable(data) == {"a": "inf", "b": ["nan", 1.5], "c": 3, "p": "x"}


def test_reading_a_run_back_gives_the_same_tables(tmp_path: Path) -> None:
    layers = pd.DataFrame({
        "node": ["NA", "conv", "null"],
        "rank": [2, 1, 3],
        "isolated_sqnr_db": [12.5, math.nan, math.inf],
        "compat_rule": ["", "too-big", ""],
        "sensitive_op": [True, False, True],
    })
    tensors = pd.DataFrame({"tensor": ["y"], "cumulative_cosine": [0.99]})
    runfolder.write_csv(tmp_path / "layers.csv", layers)
    runfolder.write_csv(tmp_path / "tensors.csv", tensors)
    runfolder.write_json(tmp_path / "run.json", {"format": 1, "tool": "quantscan", "model": {"path": "m.onnx"}})
    runfolder.write_npz(tmp_path / "hist.npz", {"site_nodes": np.array(["conv"]), "0/fp32": np.arange(4)})
    files = runfolder.load_run(tmp_path)
    expected = layers.assign(compat_rule=[math.nan, "too-big", math.nan])  # empty cells are the missing ones
    pd.testing.assert_frame_equal(files.layers, expected)
    pd.testing.assert_frame_equal(files.tensors, tensors)
    assert files.run["model"] == {"path": "m.onnx"}
    assert files.hist is not None and list(files.hist["0/fp32"]) == [0, 1, 2, 3]
    assert files.ops is None and files.compat is None and files.plan is None
    assert runfolder.run_members(tmp_path) == sorted(tmp_path.iterdir())


def test_newer_or_foreign_run_json_is_refused(tmp_path: Path) -> None:
    runfolder.write_json(tmp_path / "run.json", {"format": runfolder.SUPPORTED_FORMAT + 1})
    with pytest.raises(runfolder.ReportError, match="newer quantscan"):
        runfolder.read_run_json(tmp_path / "run.json")
    runfolder.write_json(tmp_path / "run.json", {"tool": "other"})
    with pytest.raises(runfolder.ReportError, match="another kind"):
        runfolder.read_run_json(tmp_path / "run.json")


def test_save_model_refuses_the_input(tmp_path: Path) -> None:
    import onnx
    import onnx.parser

    model = onnx.parser.parse_model('<ir_version: 8, opset_import: ["" : 13]>\ng (float[1] x) => (float[1] y) {\n'
                                    "  y = Relu (x)\n}\n")
    path = tmp_path / "m.onnx"
    runfolder.save_model(model, path)
    with pytest.raises(UsageError, match="other than the input model"):
        runfolder.save_model(model, path, protect=[path])
    with pytest.raises(UsageError, match="folder"):
        runfolder.save_model(model, tmp_path)


def test_a_mistyped_run_json_key_is_one_line(tmp_path: Path) -> None:
    """A hand-edited run.json whose "headline" is not an object: one ReportError line, not a traceback later."""
    from quantscan.runfolder import ReportError, read_run_json

    path = tmp_path / "run.json"
    path.write_text(json.dumps({"format": 1, "headline": [1, 2], "sites": 3}))
    with pytest.raises(ReportError, match=r'expected run.json "headline" to be a JSON object, found list'):
        read_run_json(path)
    path.write_text(json.dumps({"format": 1, "sites": True}))
    with pytest.raises(ReportError, match=r'"sites" to be a JSON integer, found bool'):
        read_run_json(path)


def test_a_failed_command_leaves_no_folder_it_created_but_keeps_the_users(tmp_path: Path) -> None:
    """A bad-input refusal inside the claim removes the folder the claim made (nothing but the lock was
    in it); a folder that existed before, and what it holds, stay."""
    new = tmp_path / "new" / "run"
    with pytest.raises(UsageError), runfolder.claim_out_dir(new):
        raise UsageError("refused")
    assert not new.exists() and new.parent.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("mine")
    with pytest.raises(UsageError), runfolder.claim_out_dir(kept):
        raise UsageError("refused")
    assert (kept / "notes.txt").read_text() == "mine"
