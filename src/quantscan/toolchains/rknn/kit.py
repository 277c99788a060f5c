"""RKNN-Toolkit2 as quantscan knows it before running it: its name, its Python, its layer names.

Why a module of its own: the run (`run`, `hybrid`) needs the Python, the registry (`__init__`) and the
name mapping (`toolchains/renaming.py`) need the name rules, and neither side should import the other.
"""

from __future__ import annotations

from quantscan.toolchains.folder import Rename
from quantscan.toolchains.interpreter import VendorPython

NAME = "rknn"
LABEL = "RKNN-Toolkit2"
PYTHON = VendorPython(NAME, "rknn.api", "QUANTSCAN_RKNN_PYTHON")

RENAMES = (
    Rename(r"__cvt_[A-Za-z0-9_]+", "RKNN data-convert suffix"),
    Rename(r"__float16", "RKNN __float16 suffix"),
    Rename(r"_(?:int8|float16)", "RKNN dtype suffix"),
    Rename(r"_sw", "RKNN _sw suffix"),
    Rename(r"[-_]rs", "RKNN reshape suffix"),
    Rename(r"_(?:mm_)?tp", "RKNN transpose suffix"),
    Rename(r"#\d+", "RKNN #N suffix"),
    Rename(r"_2conv\d*", "RKNN _2conv suffix"),
    Rename(r"_sdpa", "RKNN fused-attention suffix"),
    Rename(r"_mm", "RKNN matmul suffix"),
    Rename(r"_i\d+", "RKNN _iN suffix"),
    Rename(r"_2[a-z][a-z_]*", "RKNN converted-op suffix"),
    Rename(r"_Conv[A-Za-z]+", "RKNN fused-Conv suffix"),
)
"""The suffixes RKNN derives layer names with (rknn-toolkit2 2.5.0; the one table `log`, `dumps`, `vendor`
and the hybrid names read). A layer it rewrote is named after the ONNX tensor or node plus: a dtype copy
(`x_int8`, `..._sw__cvt_int8_float16`, `__float16`), the op it moved above a Reshape it inserted (`_sw`:
`Add.9-rs_sw` is the Softmax reading Add.9), an inserted Reshape/Transpose (`-rs`, `_rs`, `_tp`, `_mm_tp`),
a split (`MatMul.0#2`), a pool or activation run as a Conv (`_2conv0`), the fused attention's output
(`_sdpa`), a MatMul run as a Conv (`out0_mm`), `_2<what>` an op it converted (`_2sdpa`, `_2sdpa_q_matmul` /
`_2sdpa_q_softmax`: fused attention, `_2ln`: LayerNorm, `_2sp`: Split, `_2exswish`), and `_Conv<Op>` a
fused Conv kernel in the layer table (`p2o.MatMul.6#2_ConvAdd`) (PP-OCRv4 rec). `_rs_sw` is `_sw` then
`_rs`. The first nine are the ones `log` has said in log_layers.csv `mapped_by` since it was written; the
rest came from `vendor`'s alignment, and are listed after them so the names the first nine explain keep
their `mapped_by`."""
