"""Format readers on hand-written files: dequantization (a numpy formula written out) and refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from quantscan.device.dumps import open_dumps, sample_indices
from quantscan.errors import UsageError


def test_tpu_mlir_integer_codes_are_dequantized_with_their_scale(tmp_path: Path) -> None:
    codes = np.array([[-128, -1, 0, 5, 127]], np.int8)
    np.savez(tmp_path / "000.npz", t_Conv=codes, t_Conv_scale=np.float32(0.5), t_Conv_zero_point=np.int32(3),
             f_Relu=np.ones((1, 2), np.float32))
    got = open_dumps(tmp_path, "tpu-mlir").load(0)
    np.testing.assert_array_equal(got["t_Conv"], (codes.astype(np.float32) - 3) * 0.5)
    assert set(got) == {"t_Conv", "f_Relu"}


def test_tpu_mlir_codes_without_a_scale_are_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "000.npz", t_Conv=np.zeros((1, 4), np.int8))
    with pytest.raises(UsageError, match="t_Conv_scale"):
        open_dumps(tmp_path, "tpu-mlir").load(0)


def test_samples_by_stem_or_index() -> None:
    stems = ["000_page", "001_text", "002_cat"]
    assert sample_indices(["001_text", "000", "2"], stems, 3) == [1, 0, 2]
    with pytest.raises(UsageError, match="found '003'"):
        sample_indices(["003"], stems, 3)
