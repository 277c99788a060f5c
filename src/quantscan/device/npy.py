"""The generic dump format: one `.npz` per sample, keyed by ONNX tensor names, float values.

CONTRACT.md fixes it: the file is named by the sample's file stem (or its index in file order, `000.npz`),
keys are tensor names of the original ONNX model, values already dequantized. Any runtime that can dump
(onnxruntime with every tensor as an output, TFLite's or QNN's debuggers through a small script) writes it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from quantscan.device.dumpset import DumpSet
from quantscan.errors import UsageError


def looks_like(folder: Path) -> bool:
    return any(folder.glob("*.npz"))


def read_folder(folder: Path) -> DumpSet:
    """The samples of `folder`, loaded lazily (every array as float32)."""
    files = sorted(folder.glob("*.npz"))
    if not files:
        raise UsageError(f"--dumps (npy): expected one .npz per sample in {folder}, found none")

    def load(i: int) -> dict[str, np.ndarray]:
        with np.load(files[i], allow_pickle=False) as data:
            out = {}
            for key in data.files:
                array = data[key]
                if array.dtype.kind not in "fiub":
                    raise UsageError(f"--dumps (npy): expected numeric arrays, found {array.dtype} for '{key}' "
                                     f"in {files[i].name}")
                out[key] = array.astype(np.float32, copy=False)
            return out

    return DumpSet("npy", folder, [f.stem for f in files], load)
