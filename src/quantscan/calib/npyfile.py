"""The .npy/.npz file format: headers read without loading data, arrays loaded, .npz written.

Why its own module: planning which array feeds which input needs every shape and dtype before any
data is read (headers only, even inside a compressed .npz), and reading errors must all name the file
the same way.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from quantscan.calib.checks import short
from quantscan.errors import CalibrationError
from quantscan.readers.arrays import (
    ARCHIVE_ERRORS,
    ClaimTooLarge,
    default_budget,
    map_npy,
    npy_file_header,
    npz_member_headers,
    read_npz_member,
)


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a .npy file, read from its header only."""
    try:
        return npy_file_header(path)
    except (OSError, ValueError, EOFError) as exc:
        raise CalibrationError(f"{path}: expected a readable .npy array, found {short(exc)}") from None


def npz_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of every array in an .npz, without decompressing the data (readers.arrays); a header
    that claims more bytes than its member holds, or an unreadable archive, is bad calibration data."""
    try:
        return npz_member_headers(path)
    except ClaimTooLarge as exc:
        raise CalibrationError(str(exc)) from None
    except ARCHIVE_ERRORS as exc:
        raise CalibrationError(f"{path}: expected a readable .npz archive, found {short(exc)}") from None


def memory_budget() -> int:
    """The default memory budget (half the available RAM): what one array may take when loaded."""
    return default_budget()


def load_array(path: Path, key: str | None, where: str, rows: int | None = None) -> np.ndarray:
    """The array of a .npy (memory-mapped) or one key of an .npz; `where` names it in errors.

    `rows`: only the first `rows` entries of axis 0 are needed; an .npz member in C order is then read
    only that far (`--limit 1` on a zip bomb decompresses one sample, not 9 GB)."""
    try:
        if key is None:
            return map_npy(path)
        return read_npz_member(path, key, memory_budget(), rows)
    except ARCHIVE_ERRORS as exc:
        raise CalibrationError(f"{where}: expected a readable array, found {short(exc)}") from None


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """An .npz archive in memory, so it can be written atomically like every other file."""
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})  # type: ignore[arg-type]
    return buf.getvalue()
