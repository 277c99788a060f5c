"""Sophgo tpu-mlir as quantscan knows it before running it: its name, its Python, its layer names.

Why a module of its own: the run needs the Python, the registry (`__init__`) and the name mapping
(`toolchains/renaming.py`) need the name rules, and neither side should import the other.
"""

from __future__ import annotations

from quantscan.toolchains.folder import Rename
from quantscan.toolchains.interpreter import VendorPython

NAME = "tpu-mlir"
LABEL = "tpu-mlir"
PYTHON = VendorPython(NAME, "tpu_mlir", "QUANTSCAN_TPU_MLIR_PYTHON")

DTYPE = Rename(r"_(?:f32|f16|bf16|si8|ui8|i8|u8|i16|i32)", "tpu-mlir dtype suffix")
OP_TYPE = Rename(r"_[A-Z][A-Za-z0-9]*", "tpu-mlir _OpType suffix")
RENAMES = (DTYPE, OP_TYPE)
"""tpu-mlir names an op `<ONNX output tensor>_<OpType>` (`/text_model/Flatten_output_0_Flatten`,
`1197_MatMul`); a converted copy adds a dtype (`..._Softmax_f32`) (tpu-mlir 1.30.2)."""
