"""Finding and checking a calibration folder: its files, what kind of folder it is, what is ignored.

Why first and on its own: a wrong path or an empty folder must fail before any model work starts,
and both readers (images, tensors) start from the same sorted, non-recursive file list.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from quantscan.errors import CalibrationError
from quantscan.specs import Warnings

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp"})
TENSOR_SUFFIXES = frozenset({".npy", ".npz"})
PREPROCESS_NAME = "preprocess.json"


def folder_files(path: Path) -> tuple[Path, list[Path], Warnings]:
    """(folder, its files sorted by name, warnings about sub-folders); missing or empty is an error."""
    folder = _check_folder(path)
    entries = sorted((p for p in folder.iterdir()), key=lambda p: p.name)
    warnings = Warnings()
    for p in entries:
        if p.is_dir():
            warnings.add(f"ignored folder {p} (calibration folders are not searched recursively)")
    files = [p for p in entries if p.is_file()]
    if not any(p.name != PREPROCESS_NAME for p in files):
        raise CalibrationError(
            f"calibration folder {folder} is empty: expected images (png, jpg, bmp) with {PREPROCESS_NAME}, "
            "or .npy/.npz files"
        )
    return folder, files, warnings


def is_image_folder(files: list[Path]) -> bool:
    """A folder holding any image (any case of the suffix) is an image folder, else a tensor folder."""
    return any(p.suffix.lower() in IMAGE_SUFFIXES for p in files)


SIDE_FILES = frozenset({PREPROCESS_NAME, "labels.json", "charset.json", "charset.txt"})
"""Files beside the data that describe it (preprocessing, class labels, a CTC charset): read, not warned."""


def other_files(files: list[Path], suffixes: Collection[str]) -> list[Path]:
    """Files a reader ignores: not of its kind, and not the preprocessing file; in folder order."""
    return [p for p in files if p.suffix.lower() not in suffixes and p.name not in SIDE_FILES]


def _check_folder(folder: Path) -> Path:
    """The path itself, when it is a folder; nothing there, or a file, is named in the error."""
    if not folder.exists():
        raise CalibrationError(f"expected a calibration folder, found nothing at {folder}")
    if not folder.is_dir():
        raise CalibrationError(
            f"expected a calibration folder (images or .npy/.npz files), found the file {folder}"
        )
    return folder
