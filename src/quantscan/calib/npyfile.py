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
from quantscan.npyheaders import ClaimTooLarge, array_bytes, npz_member_headers, read_array_header


def npy_header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of a .npy file, read from its header only."""
    try:
        with path.open("rb") as f:
            return read_array_header(f)
    except (OSError, ValueError, EOFError) as exc:
        raise CalibrationError(f"{path}: expected a readable .npy array, found {short(exc)}") from None


def npz_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of every array in an .npz, without decompressing the data (npyheaders); a header
    that claims more bytes than its member holds, or an unreadable archive, is bad calibration data."""
    try:
        return npz_member_headers(path)
    except ClaimTooLarge as exc:
        raise CalibrationError(str(exc)) from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise CalibrationError(f"{path}: expected a readable .npz archive, found {short(exc)}") from None


def memory_budget() -> int:
    """The default memory budget (half the available RAM): what one array may take when loaded."""
    from quantscan.machine import default_budget, machine_memory

    return default_budget(*machine_memory())


def load_array(path: Path, key: str | None, where: str, rows: int | None = None) -> np.ndarray:
    """The array of a .npy (memory-mapped) or one key of an .npz; `where` names it in errors.

    `rows`: only the first `rows` entries of axis 0 are needed; an .npz member in C order is then read
    only that far (`--limit 1` on a zip bomb decompresses one sample, not 9 GB)."""
    try:
        if key is None:
            return np.asarray(np.load(path, mmap_mode="r", allow_pickle=False))
        with zipfile.ZipFile(path) as zf, zf.open(f"{key}.npy") as f:
            return _read_rows(f, rows, memory_budget())
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        raise CalibrationError(f"{where}: expected a readable array, found {short(exc)}") from None


def _read_rows(f: IO[bytes], rows: int | None, budget: int) -> np.ndarray:
    """An .npy stream's array, or its first `rows` entries along axis 0 when it is in C order."""
    version = np.lib.format.read_magic(f)
    if version not in ((1, 0), (2, 0)):
        raise ValueError(f"unsupported .npy format version {version}")
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, fortran, dtype = read_header(f)
    shape = tuple(int(d) for d in shape)
    if rows is not None and shape and not fortran and rows < shape[0]:
        shape = (rows, *shape[1:])
    if dtype.hasobject:
        raise ValueError("object arrays are not data")
    nbytes = array_bytes(shape, dtype)
    if nbytes > budget:
        raise ValueError(f"{nbytes} bytes to load, more than the memory budget of {budget} bytes")
    data = f.read(nbytes)
    if len(data) != nbytes:
        raise ValueError(f"truncated: expected {nbytes} bytes of data, found {len(data)}")
    arr = np.frombuffer(data, dtype=dtype)
    return arr.reshape(shape[::-1]).transpose() if fortran else arr.reshape(shape)


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """An .npz archive in memory, so it can be written atomically like every other file."""
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})  # type: ignore[arg-type]
    return buf.getvalue()
