""".npy and .npz files: shapes read from their headers, checked, and only then the data.

Why headers first: a 600-byte .npz can claim 10^10 floats, a 40 MB one 9 GB of deflated zeros; numpy
allocates what the header says before it notices the data is not there. Every array quantscan reads
from a user's file (calibration data, device dumps, a run's hist.npz, a toolkit's simulator output) is
sized from its header, against the bytes the file holds and a memory budget, before one byte of data is
read; pickled and object arrays are refused, since loading them runs code from the file.
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path
from typing import IO

import numpy as np

from quantscan.errors import FileError
from quantscan.readers.text import regular_file

MAX_ARRAY_FILE_BYTES = 1 << 40
"""No file size cap of its own: the memory budget caps what is loaded."""

ARCHIVE_ERRORS = (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error,
                  NotImplementedError, RuntimeError)
"""What zipfile and numpy raise on a damaged archive: bad or truncated zip, unsupported compression
(NotImplementedError), an encrypted member (RuntimeError), corrupt deflate data (zlib.error)."""


class ClaimTooLarge(ValueError):
    """An array whose header claims more data than the file (or archive member) holds."""


def read_array_header(f: IO[bytes]) -> tuple[tuple[int, ...], np.dtype, bool]:
    """(shape, dtype, fortran_order) from a .npy stream positioned at its magic string; a format version
    numpy cannot read, an object dtype or a negative dimension is a ValueError."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise ValueError("an object array (pickled Python objects, not data)")
    shape = tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"a negative dimension in shape {list(shape)}")
    return shape, dtype, bool(fortran)


def array_bytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Bytes of an array of `shape` and `dtype`, in Python integers (no overflow on absurd headers)."""
    n = 1
    for d in shape:
        n *= int(d)
    return n * int(dtype.itemsize)


def npz_member_headers(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Shape and dtype of every array in an .npz, without decompressing the data. A header that claims
    more bytes than its archive member holds raises ClaimTooLarge; the member's stated size is checked
    again by zipfile as the data is read (a lying directory entry fails its length/CRC check). Unreadable
    archives raise one of ARCHIVE_ERRORS."""
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if info.filename.endswith(".npy"):
                with zf.open(info) as f:
                    shape, dtype, _ = read_array_header(f)
                    claimed = array_bytes(shape, dtype)
                    if claimed > info.file_size - f.tell():
                        raise ClaimTooLarge(
                            f"{path} (key '{info.filename[:-4]}'): expected {claimed} bytes of data for shape "
                            f"{list(shape)} {dtype}, found an archive member of {info.file_size} bytes")
                out[info.filename[:-4]] = (shape, dtype)
    return out


def read_npy_stream(f: IO[bytes], budget: int, rows: int | None = None, room: int | None = None) -> np.ndarray:
    """The array of an .npy stream, or its first `rows` entries along axis 0 when it is in C order.

    `room`: the bytes the stream holds after its header, when known: a header claiming more is refused
    before the read (and before the budget, so the message says the file is short, not memory)."""
    shape, dtype, fortran = read_array_header(f)
    if room is not None and array_bytes(shape, dtype) > room - f.tell():
        raise ClaimTooLarge(f"truncated or lying header: expected {array_bytes(shape, dtype)} bytes of data for "
                            f"shape {list(shape)} {dtype}, found {max(room - f.tell(), 0)}")
    if rows is not None and shape and not fortran and rows < shape[0]:
        shape = (rows, *shape[1:])
    nbytes = array_bytes(shape, dtype)
    if nbytes > budget:
        raise ValueError(f"{nbytes} bytes to load, more than the memory budget of {budget} bytes")
    data = f.read(nbytes)
    if len(data) != nbytes:
        raise ValueError(f"truncated: expected {nbytes} bytes of data, found {len(data)}")
    arr = np.frombuffer(data, dtype=dtype)
    return arr.reshape(shape[::-1]).transpose() if fortran else arr.reshape(shape)


def default_budget() -> int:
    """The default memory budget (half the available RAM): what one file's arrays may take together."""
    from quantscan.machine import default_budget as budget_of
    from quantscan.machine import machine_memory

    return budget_of(*machine_memory())


def _refusal(what: str, path: Path, exc: BaseException) -> FileError:
    text = " ".join(str(exc).split())[:200] or type(exc).__name__
    if isinstance(exc, zipfile.BadZipFile):
        text = f"not a zip archive ({text})"
    return FileError(f"{what}: expected a readable {path.suffix or 'array'} file, found {text} in {path}")


def read_npy(path: Path, what: str, budget: int | None = None) -> np.ndarray:
    """A .npy file's array, its header checked against the file size and the budget before any read."""
    path = Path(path)
    size = regular_file(path, what, MAX_ARRAY_FILE_BYTES)
    try:
        with open(path, "rb") as f:
            return read_npy_stream(f, default_budget() if budget is None else budget, room=size)
    except ARCHIVE_ERRORS as exc:
        raise _refusal(what, path, exc) from None


def npy_file_header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of a .npy file from its header alone; errors raised as ARCHIVE_ERRORS."""
    with open(path, "rb") as f:
        shape, dtype, _ = read_array_header(f)
    return shape, dtype


def read_npz_member(path: Path, key: str, budget: int, rows: int | None = None) -> np.ndarray:
    """One key of an .npz (or its first `rows` entries along axis 0), held to `budget`; errors raised as
    ARCHIVE_ERRORS (a missing key is a KeyError)."""
    with zipfile.ZipFile(path) as zf, zf.open(f"{key}.npy") as f:
        return read_npy_stream(f, budget, rows)


def map_npy(path: Path) -> np.ndarray:
    """A .npy file memory-mapped read-only (nothing allocated; pages are read as they are used), after its
    header is checked (version, no objects, data present in full). Errors are raised as ARCHIVE_ERRORS."""
    with open(path, "rb") as f:
        shape, dtype, _ = read_array_header(f)
        room = Path(path).stat().st_size - f.tell()
    if array_bytes(shape, dtype) > room:
        raise ClaimTooLarge(f"truncated: expected {array_bytes(shape, dtype)} bytes of data for shape {list(shape)} "
                            f"{dtype}, found {max(room, 0)}")
    return np.asarray(np.load(path, mmap_mode="r", allow_pickle=False))


def read_npz(path: Path, what: str, budget: int | None = None) -> dict[str, np.ndarray]:
    """Every array of an .npz (key -> array), all headers checked and their total held to the budget before
    any member's data is read. Members that are not `.npy` are ignored, as np.load does."""
    path = Path(path)
    regular_file(path, what, MAX_ARRAY_FILE_BYTES)
    budget = default_budget() if budget is None else budget
    try:
        headers = npz_member_headers(path)
        total = sum(array_bytes(shape, dtype) for shape, dtype in headers.values())
        if total > budget:
            raise ValueError(f"{total} bytes to load, more than the memory budget of {budget} bytes")
        with zipfile.ZipFile(path) as zf:
            out = {}
            for key in headers:
                with zf.open(f"{key}.npy") as f:
                    out[key] = read_npy_stream(f, budget)
            return out
    except ARCHIVE_ERRORS as exc:
        raise _refusal(what, path, exc) from None


def numeric(array: np.ndarray, key: str, what: str, where: Path) -> np.ndarray:
    """`array` as float32 when it holds numbers (float, int, bool); strings, dates, records are refused."""
    if array.dtype.kind not in "fiub" or array.dtype.fields is not None:
        raise FileError(f"{what}: expected numeric arrays, found {array.dtype} for '{key}' in {where}")
    return array.astype(np.float32, copy=False)
