"""What a vendor conversion log says, in one shape for every tool: stage, failure, placements, cosines.

Each tool's parser (`rknn.py`, `horizon.py`, `tpumlir.py`) turns its log text into a `ParsedLog`; the finding
builder (`findings.py`) and the name mapping (`renaming.py`) only read this shape, so a new tool is
one parser file. Vendor names stay as the log spells them (`layer`); mapping them to ONNX nodes is a
separate step because it needs the model, which the user may not give.

Pure data and text helpers: no onnxruntime, no file I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from quantscan.records import StrEnum

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    """The log without terminal colour codes (RKNN colours warnings and low cosines yellow)."""
    return ANSI.sub("", text)


def file_lines(text: str) -> list[str]:
    """The lines as an editor numbers them ("\n" only; a CRLF log's "\r" dropped), colours stripped."""
    return [line.rstrip("\r") for line in strip_ansi(text).split("\n")]


class Stage(StrEnum):
    """The conversion steps the tools share, in the order a conversion runs them.

    RKNN's API calls (load_onnx, build, export_rknn, accuracy_analysis) and hb_mapper's "Start to ..."
    phases (parse, optimize, calibrate, quantize, compile) both map onto these words, so "which stage
    failed" reads the same for every tool (seed step 1 of a conversion post-mortem).
    """

    LOAD = "load"
    BUILD = "build"
    QUANTIZE = "quantize"
    COMPILE = "compile"
    EXPORT = "export"
    ANALYSIS = "analysis"


@dataclass(frozen=True)
class Failure:
    """The error that stopped the conversion: where, on which node (when the message names one), why."""

    stage: Stage
    message: str
    layer: str = ""
    """The node name as the message spells it (e.g. RKNN's `NonZero('result')` gives `result`)."""
    vendor_op: str = ""
    line: int = 0
    """1-based line of the log where the error is printed."""
    step: str = ""
    """The tool's own name for the step that failed when it has one (tpu-mlir: model_transform,
    run_calibration, model_deploy); `stage` is the shared word for it."""


@dataclass(frozen=True)
class VendorLayer:
    """One row of the tool's placement table: where the compiled layer runs and in which dtype."""

    layer: str
    vendor_op: str
    target: str
    """"npu" or "cpu" (Horizon's BPU is the NPU)."""
    dtype: str = ""
    """The tool's word, lower case: int8, float16, int16, "int8/int32" (Horizon prints in/out)."""
    partition: int | None = None
    """The NPU subgraph the layer belongs to, when the tool numbers them (Horizon `id(N)`)."""
    cosine: float | None = None
    """Horizon prints each node's cosine (quantized vs float) in the same table."""
    io_operator: bool = False
    """RKNN's InputOperator/OutputOperator rows: bookkeeping, not layers; never a finding."""
    line: int = 0


@dataclass(frozen=True)
class LayerSimilarity:
    """One row of a per-layer similarity table the tool printed (float reference vs quantized model).

    RKNN's accuracy_analysis gives `entire` (errors accumulated from the input, like quantscan's
    cumulative) and `single` (this layer alone fed float inputs, like quantscan's isolated); Horizon's
    node table gives one cosine (accumulated). A row the tool fused into the next prints no figures.
    """

    layer: str
    vendor_op: str
    entire_cosine: float | None = None
    single_cosine: float | None = None
    entire_euclidean: float | None = None
    single_euclidean: float | None = None
    is_output: bool = False
    line: int = 0
    passed: bool | None = None
    """The tool's own verdict on the row when it prints one (tpu-mlir's npz compare: PASSED/FAILED)."""


@dataclass(frozen=True)
class WeightOutlier:
    """A weight tensor the tool warns about: values far from the rest (RKNN "found outlier value")."""

    tensor: str
    abs_mean: float | None
    abs_std: float | None
    values: tuple[float, ...]
    """The outlying values as printed (RKNN checks the weights after folding BatchNormalization)."""
    line: int = 0


@dataclass
class ParsedLog:
    """Everything one log told us. `stage_reached` is the last stage the log shows as finished."""

    tool: str
    version: str = ""
    target: str = ""
    stage_reached: Stage | None = None
    failure: Failure | None = None
    layers: list[VendorLayer] = field(default_factory=list)
    similarity: list[LayerSimilarity] = field(default_factory=list)
    float_tensors: list[str] = field(default_factory=list)
    """Tensors the tool says it keeps in float16 (RKNN "Meet hybrid type")."""
    weight_outliers: list[WeightOutlier] = field(default_factory=list)
    unsupported_ops: list[str] = field(default_factory=list)
    """Op types the tool says it cannot convert (tpu-mlir "Op not support:{...}"), as it spells them."""
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The `profile` column of the findings: tool, version and target as far as the log says."""
        text = f"{self.tool} {self.version}".strip()
        return f"{text} ({self.target})" if self.target else text


def parse_float(text: str) -> float | None:
    """A number from a table cell; None for blanks and the tools' "--" placeholders."""
    try:
        return float(text)
    except ValueError:
        return None
