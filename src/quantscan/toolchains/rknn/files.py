"""Reading what RKNN-Toolkit2 writes: `error_analysis.txt` and the build log's layer table.

Pure text parsing (no rknn, no onnxruntime), so CI tests run on recorded real outputs. The parsing
itself is `quantscan.toolchains.rknn.log`'s (the `quantscan log` reader); this module keeps the two views
`quantscan vendor` aligns: per-layer figures with NaN for "no figure", placements with their index.
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
* `<model>.quantization.cfg` (from `hybrid_quantization_step1`): under `quantize_parameters:`, per
  tensor (4-space indent, name quoted where YAML needs it) the int8 grid the build uses (`min`, `max`,
  `scale`, `zero_point`, one-item lists, `[]` for a float tensor) and `ori_min`/`ori_max`, the range
  calibration saw before the toolkit's quant_optimizer adjusted it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from quantscan.toolchains.rknn.log import parse_accuracy_analysis, parse_rknn


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
class TensorQuant:
    """One tensor of a quantization.cfg: the range the build quantizes to and the one calibration saw."""

    tensor: str
    dtype: str
    min: float
    max: float
    scale: float
    zero_point: int | None
    ori_min: float
    ori_max: float


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


def _number(value: float | None) -> float:
    return math.nan if value is None else float(value)


def parse_error_analysis(text: str) -> list[AnalysisRow]:
    """Rows of RKNN's `error_analysis.txt` (simulator_error: entire and single cos/euc)."""
    return [
        AnalysisRow(layer=r.layer, op_type=r.vendor_op, entire_cosine=_number(r.entire_cosine),
                    entire_euclid=_number(r.entire_euclidean), single_cosine=_number(r.single_cosine),
                    single_euclid=_number(r.single_euclidean))
        for r in parse_accuracy_analysis(text)
    ]


def parse_layer_table(log: str) -> list[LayerPlacement]:
    """The last "Network Layer Information Table" in an RKNN verbose log (one per build)."""
    return [
        LayerPlacement(index=i, op_type=layer.vendor_op, dtype=layer.dtype.upper(), target=layer.target.upper(),
                       name=layer.layer)
        for i, layer in enumerate(parse_rknn(log).layers)
    ]


def toolkit_version(log: str) -> str | None:
    """`I rknn-toolkit2 version: 2.5.0` at the top of every log."""
    return parse_rknn(log).version or None


def parse_quantization_cfg(text: str) -> dict[str, TensorQuant]:
    """Tensor -> its `quantize_parameters` entry (NaN / None where the cfg gives `[]`: a float tensor).

    The file is YAML, but only a regular subset of it (block lists of one number, `[]`, and the
    `&id001` / `*id001` anchors PyYAML writes when two tensors share one list): a line-based reader
    keeps quantscan free of a YAML dependency."""
    out: dict[str, TensorQuant] = {}
    fields: dict[str, dict[str, list[str]]] = {}
    anchors: dict[str, list[str]] = {}
    tensor, key, inside = "", "", False
    for line in text.splitlines():
        if not line.startswith(" "):
            inside = line.strip() == "quantize_parameters:"
            continue
        if not inside or not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        body = line.strip()
        if indent == 4 and body.endswith(":"):
            tensor = body[:-1].strip().strip('"').strip("'")
            fields[tensor] = {}
        elif indent == 8 and ":" in body and tensor:
            key, value = (part.strip() for part in body.split(":", 1))
            if value.startswith("*"):  # a YAML alias: the list an `&anchor` named earlier
                fields[tensor][key] = anchors.get(value[1:], [])
                continue
            values: list[str] = [] if value in ("", "[]") or value.startswith("&") else [value]
            if value.startswith("&"):
                anchors[value[1:]] = values
            fields[tensor][key] = values
        elif indent == 8 and body.startswith("-") and tensor and key:
            fields[tensor][key].append(body[1:].strip())
    for name, f in fields.items():
        zero_point = _first(f, "zero_point")
        out[name] = TensorQuant(
            tensor=name, dtype=_first(f, "dtype") or "", min=_float(f, "min"), max=_float(f, "max"),
            scale=_float(f, "scale"), zero_point=None if zero_point is None else int(zero_point),
            ori_min=_float(f, "ori_min"), ori_max=_float(f, "ori_max"),
        )
    return out


def _first(fields: dict[str, list[str]], key: str) -> str | None:
    values = fields.get(key) or []
    return values[0] if values else None


def _float(fields: dict[str, list[str]], key: str) -> float:
    value = _first(fields, key)
    return math.nan if value is None else float(value)
