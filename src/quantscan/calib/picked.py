"""`--pick N`: the chosen calibration samples copied to a folder of their own, usable as `--calib`.

Why copies with the folder's metadata: a vendor toolchain slow on many images wants a small folder it
can read as-is, and quantscan must read the same folder the same way (preprocess.json, labels, charset).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from quantscan.calib.calibset import CalibSet
from quantscan.calib.labels import LABELS_NAME
from quantscan.errors import UsageError
from quantscan.readers.jsonfile import read_json

MARKER = ".quantscan-picked"
"""Written into every picked folder: a rerun replaces a folder with it, and refuses one without."""

METADATA = ("preprocess.json", "charset.json", "charset.txt", "labels.txt", "labels.json")


def write_picked(cset: CalibSet, indices: Sequence[int], dest: Path) -> list[Path]:
    """Copy samples `indices` (one file each) and the folder's metadata files into `dest`."""
    if len(cset.files) != cset.n_samples:
        raise UsageError(f"--pick: expected one file per sample (an image folder or one .npy per sample), "
                         f"found {cset.n_samples} samples in {len(cset.files)} file(s) in {cset.source}")
    if dest.exists():
        if not (dest / MARKER).exists() and any(dest.iterdir()):
            raise UsageError(f"--pick: expected {dest} to be absent or a folder quantscan picked, found other files")
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    written = []
    for i in sorted(indices):
        written.append(Path(shutil.copy2(cset.files[i], dest / cset.files[i].name)))
    names = [cset.files[i].name for i in sorted(indices)]
    explicit = _explicit_labels(cset, sorted(indices))
    for meta in METADATA:
        src = cset.source / meta
        if src.is_file() and not (explicit is not None and meta == LABELS_NAME):
            written.append(_copy_meta(src, dest / meta, names, drop_labels=explicit is not None))
    if explicit is not None:
        written.append(dest / LABELS_NAME)
        (dest / LABELS_NAME).write_text(json.dumps(explicit, indent=2) + "\n", encoding="utf-8")
    (dest / MARKER).write_text("samples picked by quantscan calib-advice --pick\n", encoding="utf-8")
    return written


def _explicit_labels(cset: CalibSet, indices: Sequence[int]) -> dict[str, object] | None:
    """The picked files' labels spelled out (labels.json's `files` form), or None for an unlabelled set.

    Why not the names alone: the file-name rule depends on the whole set (an unrotated file is class 0
    only when no file spells rot0), so a subset could read its names differently from the full set."""
    if not cset.labels or not cset.label_names:
        return None
    files = {cset.files[i].name: cset.label_names[label] for i in indices
             if (label := cset.labels[i]) is not None}
    return {"classes": list(cset.label_names), "files": files}


def _copy_meta(src: Path, target: Path, names: Sequence[str], drop_labels: bool) -> Path:
    """A metadata file as is, except preprocess.json: its `files` list names the picked files only, and
    its `labels` go when labels.json spells them out per file (preprocess.json's would win)."""
    if src.name == "preprocess.json":
        data = read_json(src, "preprocess.json")
        if isinstance(data, dict) and (isinstance(data.get("files"), list) or (drop_labels and "labels" in data)):
            if isinstance(data.get("files"), list):
                data["files"] = [n for n in data["files"] if Path(str(n)).name in set(names)]
            if drop_labels:
                data.pop("labels", None)
            target.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
            return target
    return Path(shutil.copy2(src, target))
