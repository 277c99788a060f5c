"""quantscan.calib.consts: --const values shaped and cast for their input, bad ones refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from calib_helpers import I64, spec

from quantscan.calib import load_calibration
from quantscan.errors import CalibrationError, UsageError

# --- consts ------------------------------------------------------------------------------------------


def test_const_for_unknown_input(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 2), np.float32))
    with pytest.raises(UsageError, match=r"--const nope=1: expected one of the model inputs \(x\)"):
        load_calibration(tmp_path, [spec("x", ("n", 2))], consts={"nope": 1})


def test_const_shapes_and_dtypes(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((3, 2), np.float32))
    specs = [spec("x", ("n", 2)), spec("k", ("batch", "len", 4), I64)]
    cs = load_calibration(tmp_path, specs, consts={"k": 7})
    assert cs.sample_shapes()["k"] == (1, 1, 4)
    (batch,) = list(cs.batches(3))
    assert batch["k"].shape == (3, 1, 4) and batch["k"].dtype == np.int64 and np.all(batch["k"] == 7)


def test_const_with_unknown_inner_dim(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 2), np.float32))
    with pytest.raises(UsageError, match=r"axis 1 of input 'k' unknown.*--input-shape k:1=N"):
        load_calibration(tmp_path, [spec("x", ("n", 2)), spec("k", (1, None))], consts={"k": 0})


def test_const_non_integral_into_int_input(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((1, 2), np.float32))
    with pytest.raises(UsageError, match="non-integral"):
        load_calibration(tmp_path, [spec("x", ("n", 2)), spec("k", (1,), I64)], consts={"k": 0.5})


def test_uncovered_input_suggests_const(tmp_path: Path) -> None:
    np.save(tmp_path / "input.npy", np.zeros((2, 4), np.float32))
    with pytest.raises(CalibrationError, match=r"input 'state' has no data.*--const state=VALUE"):
        load_calibration(tmp_path, [spec("input", (1, 4)), spec("state", (2, 1, 4))])


def test_every_uncovered_input_is_named_in_one_line(tmp_path: Path) -> None:
    """silero-vad as shipped has two inputs besides the audio: both are named at once, with both --const
    flags, rather than one per run."""
    np.save(tmp_path / "input.npy", np.zeros((2, 4), np.float32))
    with pytest.raises(CalibrationError) as err:
        load_calibration(tmp_path, [spec("input", (1, 4)), spec("state", (2, 1, 4)), spec("sr", (), I64)])
    text = str(err.value)
    assert "\n" not in text and text.startswith("inputs 'state', 'sr' have no data")
    assert "--const state=VALUE --const sr=VALUE" in text
