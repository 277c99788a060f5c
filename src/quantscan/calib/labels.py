"""Class labels from image file names (the contract's "Labels" rule).

Why its own module: labels are a naming convention on top of any image folder, tested on file names
alone, and they let compare and the scan report top-1 accuracy.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

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

