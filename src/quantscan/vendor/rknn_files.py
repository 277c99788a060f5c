"""Reading what RKNN-Toolkit2 writes: `error_analysis.txt` and the build log's layer table.

Pure text parsing (no rknn, no onnxruntime), so CI tests run on recorded real outputs.
Formats as rknn-toolkit2 2.5.0 writes them (recorded under tests/fixtures/vendor/rknn-toolkit2-2.5.0):

* `error_analysis.txt` (from `accuracy_analysis`): one row per layer, `[OpType] layer_name` then
  `entire cos | euc   single cos | euc`; a layer fused into the next one (Conv before its HardSwish)
  has a row without figures. Layer names are the tensor names RKNN gives a layer's output: the ONNX
  tensor name where the layer is an ONNX node, otherwise a name RKNN derived from one (`_rs`, `_sw`,
  `__float16`, `_int8` suffixes).
* the verbose log's "Network Layer Information Table": `ID OpType DataType Target InputShape
  OutputShape Cycles RW FullName`, FullName being `OpType:node name` (ONNX node names, or names RKNN
  derived from them: `GlobalAveragePool.0_2conv0`, `MatMul.0#2`). Target CPU/NPU and DataType
  INT8/FLOAT16 are where and how the toolkit placed the layer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ROW = re.compile(
    r"^\[(?P<op>[^\]]+)\]\s+(?P<name>\S+)"
    r"(?:\s+(?P<ecos>[-\d.naif]+)\s*\|\s*(?P<eeuc>[-\d.naif]+)\s+(?P<scos>[-\d.naif]+)\s*\|\s*(?P<seuc>[-\d.naif]+))?\s*$"
)
_TABLE_ROW = re.compile(
    r"^\s*(?P<id>\d+)\s+(?P<op>\S+)\s+(?P<dtype>[A-Z0-9]+)\s+(?P<target>CPU|NPU|GPU)\s+.*\s(?P<full>\S+:\S+)\s*$"
)


@dataclass(frozen=True)
class AnalysisRow:
    """One layer of `error_analysis.txt`; NaN where RKNN printed no figure (a fused layer)."""

    layer: str
    op_type: str
    entire_cosine: float
    entire_euclid: float
    single_cosine: float
    single_euclid: float


@dataclass(frozen=True)
class LayerPlacement:
    """One row of the build log's Network Layer Information Table."""

    index: int
    op_type: str
    dtype: str
    target: str
    name: str
    """The node name after `OpType:` in FullName."""

    @property
    def placement(self) -> str:
        """quantscan's word for it: npu, cpu, npu-float16, cpu-float16 (int8 needs no suffix)."""
        where = self.target.lower()
        return f"{where}-float16" if self.dtype.upper() in ("FLOAT16", "FP16") else where


def _number(text: str | None) -> float:
    if text is None:
        return math.nan
    try:
        return float(text)
    except ValueError:
        return math.nan


def strip_ansi(text: str) -> str:
    """RKNN colours figures below its threshold (ESC[1;33m); the colour is not data."""
    return _ANSI.sub("", text)


def parse_error_analysis(text: str) -> list[AnalysisRow]:
    """Rows of RKNN's `error_analysis.txt` (simulator_error: entire and single cos/euc)."""
    rows = []
    for line in strip_ansi(text).splitlines():
        match = _ROW.match(line.strip())
        if match is None:
            continue
        rows.append(AnalysisRow(
            layer=match["name"], op_type=match["op"],
            entire_cosine=_number(match["ecos"]), entire_euclid=_number(match["eeuc"]),
            single_cosine=_number(match["scos"]), single_euclid=_number(match["seuc"]),
        ))
    return rows


def parse_layer_table(log: str) -> list[LayerPlacement]:
    """The last "Network Layer Information Table" in an RKNN verbose log (one per build)."""
    lines = strip_ansi(log).splitlines()
    starts = [i for i, line in enumerate(lines) if "Network Layer Information Table" in line]
    if not starts:
        return []
    rows = []
    for line in lines[starts[-1] + 1:]:
        body = line.split("] ", 1)[1] if line.startswith("D RKNN: [") and "] " in line else line
        if "Feature Tensor Information Table" in body or body.startswith(">>>>") or "end: rknn::" in body:
            break
        match = _TABLE_ROW.match(body)
        if match is None:
            continue
        full = match["full"]
        rows.append(LayerPlacement(
            index=int(match["id"]), op_type=match["op"], dtype=match["dtype"], target=match["target"],
            name=full.split(":", 1)[1],
        ))
    return rows


def toolkit_version(log: str) -> str | None:
    """`I rknn-toolkit2 version: 2.5.0` at the top of every log."""
    match = re.search(r"rknn-toolkit2 version:\s*(\S+)", strip_ansi(log))
    return match[1] if match else None
