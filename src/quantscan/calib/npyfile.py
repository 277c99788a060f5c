"""The .npy/.npz file format: headers read without loading data, arrays loaded, .npz written.

Why its own module: planning which array feeds which input needs every shape and dtype before any
data is read (headers only, even inside a compressed .npz), and reading errors must all name the file
the same way.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import numpy as np

from quantscan.calib.checks import short
from quantscan.errors import CalibrationError


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a .npy file, read from its header only."""
    try:
        with path.open("rb") as f:
            return _read_header(f)
    except (OSError, ValueError, EOFError) as exc:
        raise CalibrationError(f"{path}: expected a readable .npy array, found {short(exc)}") from None


def npz_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of every array in an .npz, without decompressing the data."""
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if info.filename.endswith(".npy"):
                    with zf.open(info) as f:
                        out[info.filename[:-4]] = _read_header(f)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise CalibrationError(f"{path}: expected a readable .npz archive, found {short(exc)}") from None
    return out


def _read_header(f: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"unsupported .npy format version {version}")
    return tuple(int(d) for d in shape), np.dtype(dtype)



def load_array(path: Path, key: str | None, where: str) -> np.ndarray:
    """The array of a .npy (memory-mapped) or one key of an .npz; `where` names it in errors."""
    try:
        if key is None:
            return np.asarray(np.load(path, mmap_mode="r", allow_pickle=False))
        with np.load(path, allow_pickle=False) as npz:
            return np.asarray(npz[key])
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise CalibrationError(f"{where}: expected a readable array, found {short(exc)}") from None


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """An .npz archive in memory, so it can be written atomically like every other file."""
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})  # type: ignore[arg-type]
    return buf.getvalue()
