"""Typed records that cross module lines, and the string enums their fields use.

One module so that a result has one shape wherever it travels: the scan, the bisection, the
compatibility check and the report all speak in these types, and each record converts to and
from its JSON/CSV form here, in one place (`to_json` / `from_json`). The enums are `str`
subclasses, so a value written to CSV or JSON is the plain word users already see
(`"error"`, `"cpu"`, `"int16"`), and comparing a record's field with that word still works.

Pure data: no onnxruntime, no pandas, no file I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class StrEnum(str, Enum):
    """A `str` enum whose `str()` and format are the bare value (Python 3.10 has no `enum.StrEnum`)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    @classmethod
    def parse(cls, value: object) -> StrEnum:
        """The member whose value is `value` (case-insensitive); ValueError naming the choices otherwise."""
        text = str(value).strip().lower()
        for member in cls:
            if member.value == text:
                return member
        choices = ", ".join(m.value for m in cls)
        raise ValueError(f"expected one of {choices}, found {value!r}")


class Severity(StrEnum):
    """How bad a finding is. Ordered: `Severity.rank` gives info < warn < error."""

    INFO = "info"
    WARN = "warn"
    ERROR = "error"

    @property
    def rank(self) -> int:
        """0 for info, 1 for warn, 2 for error: the one severity order of the project."""
        return _SEVERITY_ORDER.index(self)


_SEVERITY_ORDER: tuple[Severity, ...] = (Severity.INFO, Severity.WARN, Severity.ERROR)


def severity_rank(severity: object) -> int:
    """Position on the info < warn < error scale; -1 for "no finding" (None, empty or unknown)."""
    try:
        return Severity.parse(severity).rank  # type: ignore[attr-defined]
    except ValueError:
        return -1


class Placement(StrEnum):
    """Where a node runs on the target: on the NPU or pushed back to the CPU."""

    NPU = "npu"
    CPU = "cpu"


class Precision(StrEnum):
    """The precision a mixed-precision plan gives a site that does not stay int8."""

    FLOAT = "float"
    INT16 = "int16"


class CalibMethod(StrEnum):
    """How activation ranges are chosen from the calibration data."""

    MINMAX = "minmax"
    PERCENTILE = "percentile"
    ENTROPY = "entropy"
    MSE = "mse"


class ActivationScheme(StrEnum):
    """Activation quantization: asymmetric uint8 or symmetric int8, per tensor."""

    UINT8 = "uint8"
    INT8 = "int8"


# --- scan records (output metrics, headline, run info) -------------------------------------------


def _opt_float(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    return None if value is None else _float(value)


def _float(value: Any) -> float:
    """JSON carries inf/NaN as the strings "inf", "-inf", "nan" (see runfolder.jsonable)."""
    return float(value)


@dataclass
class OutputMetrics:
    """One graph output, FP32 against int8: the figures of the contract (see summary.md's Metrics).

    `top1_agreement` is set for classifier outputs only; `accuracy` / `fp32_accuracy` only when
    the evaluation set has labels. Absent figures are absent keys in the JSON form, not nulls.
    """

    cosine: float
    sqnr_db: float
    mse: float
    max_abs: float
    rel_l2: float
    worst_sample_cosine: float
    mean_sample_cosine: float
    top1_agreement: float | None = None
    accuracy: float | None = None
    fp32_accuracy: float | None = None

    def to_json(self) -> dict[str, float]:
        """The run.json / plan.json row: the optional figures only when measured."""
        row = {
            "cosine": self.cosine,
            "sqnr_db": self.sqnr_db,
            "mse": self.mse,
            "max_abs": self.max_abs,
            "rel_l2": self.rel_l2,
            "worst_sample_cosine": self.worst_sample_cosine,
            "mean_sample_cosine": self.mean_sample_cosine,
        }
        for key in ("top1_agreement", "accuracy", "fp32_accuracy"):
            value = getattr(self, key)
            if value is not None:
                row[key] = value
        return row

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OutputMetrics:
        nan = math.nan
        return cls(
            cosine=_float(data.get("cosine", nan)),
            sqnr_db=_float(data.get("sqnr_db", nan)),
            mse=_float(data.get("mse", nan)),
            max_abs=_float(data.get("max_abs", nan)),
            rel_l2=_float(data.get("rel_l2", nan)),
            worst_sample_cosine=_float(data.get("worst_sample_cosine", nan)),
            mean_sample_cosine=_float(data.get("mean_sample_cosine", nan)),
            top1_agreement=_opt_float(data, "top1_agreement"),
            accuracy=_opt_float(data, "accuracy"),
            fp32_accuracy=_opt_float(data, "fp32_accuracy"),
        )


@dataclass
class Headline:
    """The figure a scan is judged by: the worst headline output (contract), fake-quant and deployed."""

    output: str
    metrics: OutputMetrics
    deployed: OutputMetrics | None
    """The saved QDQ model under onnxruntime's integer kernels (ORT_ENABLE_ALL), beside, never mixed in."""
    outputs: list[str] = field(default_factory=list)
    """Every headline output, in graph order."""

    @property
    def cosine(self) -> float:
        return self.metrics.cosine

    @property
    def sqnr_db(self) -> float:
        return self.metrics.sqnr_db

    def to_json(self) -> dict[str, Any]:
        """`{"output": ..., <the worst output's metrics>, "deployed": {...}, "outputs": [...]}`."""
        return {
            "output": self.output,
            **self.metrics.to_json(),
            "deployed": self.deployed.to_json() if self.deployed is not None else {},
            "outputs": list(self.outputs),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Headline:
        deployed = data.get("deployed") or {}
        return cls(
            output=str(data.get("output", "")),
            metrics=OutputMetrics.from_json(data),
            deployed=OutputMetrics.from_json(deployed) if deployed else None,
            outputs=[str(o) for o in data.get("outputs", [])],
        )


@dataclass
class ModelInfo:
    """run.json "model": which file was scanned, by content."""

    path: str
    sha256: str
    opset: int
    nodes: int

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "opset": self.opset, "nodes": self.nodes}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelInfo:
        return cls(str(data.get("path", "")), str(data.get("sha256", "")), int(data.get("opset", 0)),
                   int(data.get("nodes", 0)))


@dataclass
class DataInfo:
    """run.json "calibration" / "evaluation": where the samples came from and how many were used.

    `kind` is set for the calibration set, `same_as_calibration` for the evaluation set.
    """

    path: str
    samples: int
    kind: str | None = None
    same_as_calibration: bool | None = None

    def to_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"path": self.path}
        if self.kind is not None:
            row["kind"] = self.kind
        row["samples"] = self.samples
        if self.same_as_calibration is not None:
            row["same_as_calibration"] = self.same_as_calibration
        return row

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DataInfo:
        same = data.get("same_as_calibration")
        kind = data.get("kind")
        return cls(str(data.get("path", "")), int(data.get("samples", 0)),
                   None if kind is None else str(kind), None if same is None else bool(same))


@dataclass
class RunInfo:
    """What run.json holds: versions, the model and data identities, the options, the headline.

    `options`, `versions`, `runner` and `preparation` stay plain mappings: they are echoed for the
    record, never computed on. `times_s` grows while the run folder is written (writing, total).
    """

    versions: dict[str, str]
    model: ModelInfo
    input_contract: dict[str, list[int]]
    inputs: list[dict[str, Any]]
    calibration: DataInfo
    evaluation: DataInfo
    options: dict[str, Any]
    opset_used: int
    opset_original: int
    preparation: list[str]
    preparation_check_max_abs: dict[str, float]
    ort_level: str
    deployed_ort_level: str
    threads: int | None
    seed: int
    sites: int
    qdq_pairs: int
    runner: dict[str, int]
    headline: Headline
    times_s: dict[str, float] = field(default_factory=dict)
    output_metrics: dict[str, OutputMetrics] = field(default_factory=dict)
    deployed_metrics: dict[str, OutputMetrics] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    format: int = 1
    tool: str = "quantscan"

    def to_json(self) -> dict[str, Any]:
        """run.json's content, keys in the order the contract has always written them."""
        return {
            "format": self.format,
            "tool": self.tool,
            "versions": dict(self.versions),
            "model": self.model.to_json(),
            "input_contract": {k: list(v) for k, v in self.input_contract.items()},
            "inputs": [dict(i) for i in self.inputs],
            "calibration": self.calibration.to_json(),
            "evaluation": self.evaluation.to_json(),
            "options": dict(self.options),
            "opset_used": self.opset_used,
            "opset_original": self.opset_original,
            "preparation": list(self.preparation),
            "preparation_check_max_abs": dict(self.preparation_check_max_abs),
            "ort_level": self.ort_level,
            "deployed_ort_level": self.deployed_ort_level,
            "threads": self.threads,
            "seed": self.seed,
            "sites": self.sites,
            "qdq_pairs": self.qdq_pairs,
            "runner": dict(self.runner),
            "headline": self.headline.to_json(),
            "times_s": dict(self.times_s),
            "output_metrics": {k: m.to_json() for k, m in self.output_metrics.items()},
            "deployed_metrics": {k: m.to_json() for k, m in self.deployed_metrics.items()},
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunInfo:
        """Read run.json back; sections a run folder lacks come back empty rather than failing."""
        threads = data.get("threads")
        return cls(
            versions={str(k): str(v) for k, v in (data.get("versions") or {}).items()},
            model=ModelInfo.from_json(data.get("model") or {}),
            input_contract={str(k): [int(d) for d in v] for k, v in (data.get("input_contract") or {}).items()},
            inputs=[dict(i) for i in data.get("inputs") or []],
            calibration=DataInfo.from_json(data.get("calibration") or {}),
            evaluation=DataInfo.from_json(data.get("evaluation") or {}),
            options=dict(data.get("options") or {}),
            opset_used=int(data.get("opset_used", 0)),
            opset_original=int(data.get("opset_original", 0)),
            preparation=[str(p) for p in data.get("preparation") or []],
            preparation_check_max_abs={str(k): _float(v) for k, v in
                                       (data.get("preparation_check_max_abs") or {}).items()},
            ort_level=str(data.get("ort_level", "")),
            deployed_ort_level=str(data.get("deployed_ort_level", "")),
            threads=None if threads is None else int(threads),
            seed=int(data.get("seed", 0)),
            sites=int(data.get("sites", 0)),
            qdq_pairs=int(data.get("qdq_pairs", 0)),
            runner={str(k): int(v) for k, v in (data.get("runner") or {}).items()},
            headline=Headline.from_json(data.get("headline") or {}),
            times_s={str(k): _float(v) for k, v in (data.get("times_s") or {}).items()},
            output_metrics={str(k): OutputMetrics.from_json(v) for k, v in
                            (data.get("output_metrics") or {}).items()},
            deployed_metrics={str(k): OutputMetrics.from_json(v) for k, v in
                              (data.get("deployed_metrics") or {}).items()},
            warnings=[str(w) for w in data.get("warnings") or []],
            format=int(data.get("format", 1)),
            tool=str(data.get("tool", "quantscan")),
        )



# --- bisection records (target, plan, plan sites) ------------------------------------------------


# --- compatibility records (findings) -------------------------------------------------------------
