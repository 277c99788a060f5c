"""Horizon hb_mapper as quantscan knows it: its name and its layer names (logs only; no run, no dumps).
"""

from __future__ import annotations

from quantscan.toolchains.folder import Rename

NAME = "horizon"
LABEL = "hb_mapper"

RENAMES = (
    Rename(r"UNIT_CONV_FOR_", "hb_mapper UNIT_CONV_FOR_ prefix", prefix=True),
    Rename(r"HZ_PREPROCESS_FOR_", "hb_mapper HZ_PREPROCESS_FOR_ prefix", prefix=True),
    Rename(r"_calibrated_(?:Requantize|pad)", "hb_mapper _calibrated_ suffix"),
    Rename(r"_Hz(?:Dequantize|Quantize)", "hb_mapper quantize-node suffix"),
    Rename(r"_(?:pre_)?reshape(?:_output|_\d+)?", "hb_mapper reshape suffix"),
)
"""hb_mapper keeps ONNX node names but adds its own: `UNIT_CONV_FOR_<Add>`, `HZ_PREPROCESS_FOR_<input>`,
`<tensor>_calibrated_Requantize`, `<node>_reshape_output` (it also cuts long names from the left,
`...ge1.0/nonlinearity/Relu`, which `renaming.NameMapper` undoes by suffix match)."""
