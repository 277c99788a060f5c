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
from quantscan.errors import UsageError

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
    for meta in METADATA:
        src = cset.source / meta
        if src.is_file():
            written.append(_copy_meta(src, dest / meta, names))
    (dest / MARKER).write_text("samples picked by quantscan calib-advice --pick\n", encoding="utf-8")
    return written


def _copy_meta(src: Path, target: Path, names: Sequence[str]) -> Path:
    """A metadata file as is, except a preprocess.json `files` list, which names the picked files only."""
    if src.name == "preprocess.json":
        data = json.loads(src.read_text(encoding="utf-8"))
        if isinstance(data, dict) and isinstance(data.get("files"), list):
            data["files"] = [n for n in data["files"] if Path(str(n)).name in set(names)]
            target.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
            return target
    return Path(shutil.copy2(src, target))
