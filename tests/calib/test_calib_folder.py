"""quantscan.calib.folder: missing, file-not-folder, empty and unmatched calibration folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from calib_helpers import BASE_PRE, IMG_SPEC, spec, write_json

from quantscan.calib import load_calibration
from quantscan.errors import CalibrationError

# --- folders -----------------------------------------------------------------------------------------


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match=r"found nothing at .*nowhere"):
        load_calibration(tmp_path / "nowhere", [IMG_SPEC])


def test_path_is_a_file(tmp_path: Path) -> None:
    f = tmp_path / "x.npy"
    np.save(f, np.zeros(2))
    with pytest.raises(CalibrationError, match=r"expected a calibration folder.*found the file .*x\.npy"):
        load_calibration(f, [IMG_SPEC])


@pytest.mark.parametrize("with_preprocess", [False, True])
def test_empty_folder(tmp_path: Path, with_preprocess: bool) -> None:
    if with_preprocess:
        write_json(tmp_path / "preprocess.json", BASE_PRE)
    with pytest.raises(CalibrationError, match="is empty: expected images"):
        load_calibration(tmp_path, [IMG_SPEC])


def test_nothing_matches_lists_inputs_and_files(tmp_path: Path) -> None:
    (tmp_path / "readme.txt").write_text("x")
    np.savez(tmp_path / "z.npz", other=np.zeros(1))
    with pytest.raises(
        CalibrationError, match=r"nothing in .* matches.*after a, b, found readme\.txt, z\.npz"
    ):
        load_calibration(tmp_path, [spec("a", ("n", 1)), spec("b", ("n", 1))])
