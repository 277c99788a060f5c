"""Shapes and dtypes of .npy/.npz arrays read from their headers alone: nothing trusts a size it has not
checked (a 9 KB .npz can claim 10^6 samples, a 40 MB one 9 GB of zeros).

Why a module of its own, below calib/ and runfolder: calibration folders and run folders (hist.npz)
both size an archive before reading it, and neither should import the other for it.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import IO

import numpy as np


class ClaimTooLarge(ValueError):
    """An archive member whose header claims more data than the member holds."""


def read_array_header(f: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) from a .npy stream positioned at its magic string."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(f)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    else:
        raise ValueError(f"unsupported .npy format version {version}")
    return tuple(int(d) for d in shape), np.dtype(dtype)


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
    archives raise what zipfile and numpy raise (OSError, ValueError, EOFError, BadZipFile)."""
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if info.filename.endswith(".npy"):
                with zf.open(info) as f:
                    shape, dtype = read_array_header(f)
                claimed = array_bytes(shape, dtype)
                if claimed > info.file_size:
                    raise ClaimTooLarge(
                        f"{path} (key '{info.filename[:-4]}'): expected {claimed} bytes of data for shape "
                        f"{list(shape)} {dtype}, found an archive member of {info.file_size} bytes")
                out[info.filename[:-4]] = (shape, dtype)
    return out
