"""The generic dump format: one `.npz` per sample, keyed by ONNX tensor names, float values.

CONTRACT.md fixes it: the file is named by the sample's file stem (or its index in file order, `000.npz`),
keys are tensor names of the original ONNX model, values already dequantized. Any runtime that can dump
(onnxruntime with every tensor as an output, TFLite's or QNN's debuggers through a small script) writes it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from quantscan.errors import UsageError
from quantscan.readers.arrays import numeric, read_npz
from quantscan.toolchains.dumpset import DumpSet

WHAT = "--dumps (npy)"


def looks_like(folder: Path) -> bool:
    return any(folder.glob("*.npz"))


def read_folder(folder: Path) -> DumpSet:
    """The samples of `folder`, loaded lazily (every array as float32)."""
    files = sorted(folder.glob("*.npz"))
    if not files:
        raise UsageError(f"--dumps (npy): expected one .npz per sample in {folder}, found none")

    def load(i: int) -> dict[str, np.ndarray]:
        arrays = read_npz(files[i], WHAT)
        return {key: numeric(array, key, WHAT, files[i]) for key, array in arrays.items()}

    return DumpSet("npy", folder, [f.stem for f in files], load)
