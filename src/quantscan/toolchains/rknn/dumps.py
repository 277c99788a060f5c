"""RKNN-Toolkit2 `accuracy_analysis` folders (rknn-toolkit2 2.5.0 layout).

`rknn.accuracy_analysis(inputs=..., output_dir=D)` writes per sample: `D/map_name_to_file.txt` (layer
name -> dump file stem), `D/error_analysis.txt` (one row per layer, execution order), `D/golden/npy/`
(the toolkit's FP32) and `D/simulator/npy/` (its int8 simulator, dequantized floats, NCHW); with a board
connected (`init_runtime(target=...)`) also the on-device tensors, under `D/runtime/npy/`, same names.
A layer RKNN fused into the next one (the Conv under its HardSwish) has a row without figures in
error_analysis.txt: its dump is not a kernel output and is left out here.

`--dumps DIR` is either one such folder (one sample, key `000`) or a folder of them, one per sample,
named by the sample's file stem or index. The on-device dumps are read when present, else the simulator's.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from quantscan.errors import UsageError
from quantscan.readers.arrays import numeric, read_npy
from quantscan.readers.text import inside, read_text
from quantscan.toolchains.dumpset import DumpSet
from quantscan.toolchains.rknn.files import parse_error_analysis

MAP_FILE = "map_name_to_file.txt"
WHAT = "--dumps (rknn)"
LOOKS = f"RKNN accuracy_analysis folders ({MAP_FILE} + simulator/ or runtime/)"
"""What `looks_like` recognises (said when a folder looks like no format)."""
SOURCES = ("runtime", "simulator")
"""Which dumps of a folder are "the device", first present wins."""


def looks_like(folder: Path) -> bool:
    return (folder / MAP_FILE).exists() or any((d / MAP_FILE).exists() for d in folder.iterdir() if d.is_dir())


def _names(folder: Path) -> dict[str, str]:
    """map_name_to_file.txt: layer name -> dump file stem (rows after the header rule)."""
    out = {}
    for line in read_text(folder / MAP_FILE, WHAT).splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].endswith(".txt"):
            out[parts[0]] = parts[1][: -len(".txt")]
    return out


def _fused(folder: Path) -> set[str]:
    """Layers error_analysis.txt prints without figures: fused into the next layer, no output of their own."""
    path = folder / "error_analysis.txt"
    if not path.exists():
        return set()
    return {r.layer for r in parse_error_analysis(read_text(path, WHAT)) if math.isnan(r.entire_cosine)}


def _order(folder: Path) -> list[str]:
    path = folder / "error_analysis.txt"
    if not path.exists():
        return []
    return [r.layer for r in parse_error_analysis(read_text(path, WHAT))]


def _tensors_dir(folder: Path) -> Path:
    for source in SOURCES:
        if (folder / source / "npy").is_dir():
            return folder / source / "npy"
    raise UsageError(f"--dumps (rknn): expected {' or '.join(s + '/npy' for s in SOURCES)} in {folder}, found "
                     f"neither (pass accuracy_analysis's output_dir as written)")


def read_folder(folder: Path) -> DumpSet:
    """One accuracy_analysis folder, or a folder of them (one per sample, sorted by name)."""
    if (folder / MAP_FILE).exists():
        samples, keys = [folder], ["000"]
    else:
        samples = sorted(d for d in folder.iterdir() if d.is_dir() and (d / MAP_FILE).exists())
        keys = [d.name for d in samples]
    if not samples:
        raise UsageError(f"--dumps (rknn): expected accuracy_analysis folders ({MAP_FILE} inside) in {folder}, "
                         f"found none")

    def load(i: int) -> dict[str, np.ndarray]:
        where = samples[i]
        tensors, skip = _tensors_dir(where), _fused(where)
        out = {}
        for layer, stem in _names(where).items():
            path = inside(tensors, f"{stem}.npy", f"{WHAT}: {MAP_FILE} of {where}")
            if layer in skip or not path.exists():
                continue
            out[layer] = numeric(read_npy(path, WHAT), layer, WHAT, path)
        return out

    return DumpSet("rknn", folder, keys, load, lambda: _order(samples[0]))
