"""Class labels from image file names (the contract's "Labels" rule).

Why its own module: labels are a naming convention on top of any image folder, tested on file names
alone, and they let compare and the scan report top-1 accuracy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from quantscan.errors import CalibrationError, FileError
from quantscan.readers.jsonfile import read_json

LABELS_NAME = "labels.json"
"""Beside the data: a list of class names (matched in file names as above), or
`{"classes": [...], "files": {FILE_NAME: CLASS_NAME_OR_INDEX}}` for labels that are not in the names."""

_TOKEN_SPLIT = re.compile(r"[_\-\s]+")


def derive_labels(names: Sequence[str], label_names: Sequence[str]) -> list[int | None] | None:
    """Class index per file name (rule in the module docstring); None when no file has one."""
    lookup = {n.lower(): i for i, n in enumerate(label_names)}
    named = [_named_classes(n, lookup) for n in names]
    rot_tokens = [_rot_tokens(n) for n in names]
    uses_rot = any(rot_tokens)
    spells_rot0 = any("0" in r for r in rot_tokens)
    implicit = lookup.get("0") if uses_rot and not spells_rot0 else None
    labels: list[int | None] = []
    for classes in named:
        if len(classes) == 1:
            labels.append(next(iter(classes)))
        else:
            labels.append(implicit if not classes else None)
    return labels if any(label is not None for label in labels) else None


def _tokens(file_name: str) -> list[str]:
    tokens = [t for t in _TOKEN_SPLIT.split(Path(file_name).stem.lower()) if t]
    return tokens[1:] if len(tokens) > 1 and tokens[0].isdigit() else tokens


def _named_classes(file_name: str, lookup: Mapping[str, int]) -> set[int]:
    found: set[int] = set()
    for token in _tokens(file_name):
        for candidate in (token, token[3:] if token.startswith("rot") else None):
            if candidate is not None and candidate in lookup:
                found.add(lookup[candidate])
    return found


def _rot_tokens(file_name: str) -> set[str]:
    return {t[3:] for t in _tokens(file_name) if t.startswith("rot") and len(t) > 3}



def labels_from_json(folder: Path, names: Sequence[str]) -> tuple[list[str], list[int | None] | None] | None:
    """labels.json beside the data: (class names, per-file labels); None when the folder has none."""
    path = folder / LABELS_NAME
    if not path.is_file():
        return None
    try:
        data = read_json(path, LABELS_NAME)
    except FileError as exc:
        raise CalibrationError(str(exc)) from None
    classes = data.get("classes") if isinstance(data, dict) else data
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise CalibrationError(f'expected {path} to hold a list of class names or {{"classes": [...]}}')
    by_file = data.get("files") if isinstance(data, dict) else None
    if not isinstance(by_file, dict):
        return classes, derive_labels(names, classes)
    lookup = {c: i for i, c in enumerate(classes)}
    labels = [_file_label(by_file.get(n), lookup, len(classes)) for n in names]
    return classes, labels if any(lab is not None for lab in labels) else None


def _file_label(value: object, lookup: Mapping[str, int], n: int) -> int | None:
    if isinstance(value, str):
        return lookup.get(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < n:
        return value
    return None
