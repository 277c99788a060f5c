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
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from quantscan.columns import Col


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
    """The precision a mixed-precision plan gives a site that does not stay at the scheme's base: float,
    int16, or (under a scheme with int4 weights) int8 weights with the scheme's activations."""

    FLOAT = "float"
    INT16 = "int16"
    INT8 = "int8"


class CalibMethod(StrEnum):
    """How activation ranges are chosen from the calibration data."""

    MINMAX = "minmax"
    PERCENTILE = "percentile"
    ENTROPY = "entropy"
    MSE = "mse"


class ActivationScheme(StrEnum):
    """Activation quantization, per tensor: asymmetric uint8, symmetric int8 or int16, or float (a
    weight-only scheme: activations are not quantized)."""

    UINT8 = "uint8"
    INT8 = "int8"
    INT16 = "int16"
    FLOAT = "float"


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
    task: dict[str, float] = field(default_factory=dict)
    """Task metrics (quantscan.taskmetrics: top5_agreement, string_agreement, cer, mask_iou, plugins);
    the JSON form has them under "task", absent when none was measured."""

    def to_json(self) -> dict[str, Any]:
        """The run.json / plan.json row: the optional figures only when measured."""
        base = {
            "cosine": self.cosine,
            "sqnr_db": self.sqnr_db,
            "mse": self.mse,
            "max_abs": self.max_abs,
            "rel_l2": self.rel_l2,
            "worst_sample_cosine": self.worst_sample_cosine,
            "mean_sample_cosine": self.mean_sample_cosine,
        }
        row: dict[str, Any] = dict(base)
        for key in ("top1_agreement", "accuracy", "fp32_accuracy"):
            value = getattr(self, key)
            if value is not None:
                row[key] = value
        if self.task:
            row["task"] = dict(self.task)
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
            task={str(k): _float(v) for k, v in (data.get("task") or {}).items()},
        )


DEPLOYED_GAP = 0.01
"""Fake-quant and deployed (ORT_ENABLE_ALL) output cosine further apart than this are flagged: the scan
names the sites behind the gap (scanning.deployed) and summary.md says so (report.verdict)."""


@dataclass
class Headline:
    """The figure a scan is judged by: the worst headline output (contract), fake-quant and deployed."""

    output: str
    metrics: OutputMetrics
    deployed: OutputMetrics | None
    """The saved QDQ model under onnxruntime's integer kernels (ORT_ENABLE_ALL), beside, never mixed in."""
    outputs: list[str] = field(default_factory=list)
    """Every headline output, in graph order."""
    unmeasured: list[str] = field(default_factory=list)
    """Control-flow nodes whose bodies hold quantizable nodes the scan left float (`If_0 (223 nodes)`):
    when any, the figures are of a partly quantized model, not the int8 model, and must say so."""
    deployed_samples: int | None = None
    """How many evaluation samples the deployed check ran on (the first ones; `--deployed-samples`);
    None: every sample."""
    deployed_basis: OutputMetrics | None = None
    """The fake-quant figures on the deployed check's samples, when those are fewer than all: the gap is
    taken between two figures of the same samples."""

    def deployed_gap(self) -> float | None:
        """Deployed minus fake-quant output cosine on the same samples; None when either is not finite."""
        if self.deployed is None:
            return None
        basis = self.deployed_basis if self.deployed_basis is not None else self.metrics
        if not (math.isfinite(self.deployed.cosine) and math.isfinite(basis.cosine)):
            return None
        return self.deployed.cosine - basis.cosine

    @property
    def measured(self) -> bool:
        """False when quantizable nodes inside If/Loop/Scan bodies stayed float (see `unmeasured`)."""
        return not self.unmeasured

    @property
    def cosine(self) -> float:
        return self.metrics.cosine

    @property
    def sqnr_db(self) -> float:
        return self.metrics.sqnr_db

    def to_json(self) -> dict[str, Any]:
        """`{"output": ..., <the worst output's metrics>, "deployed": {...}, "outputs": [...]}`."""
        return {
            Col.OUTPUT: self.output,
            **self.metrics.to_json(),
            "deployed": self.deployed.to_json() if self.deployed is not None else {},
            "outputs": list(self.outputs),
            "unmeasured": list(self.unmeasured),
            **({"deployed_samples": self.deployed_samples} if self.deployed_samples is not None else {}),
            **({"deployed_basis": self.deployed_basis.to_json()} if self.deployed_basis is not None else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Headline:
        deployed = data.get("deployed") or {}
        return cls(
            output=str(data.get(Col.OUTPUT, "")),
            metrics=OutputMetrics.from_json(data),
            deployed=OutputMetrics.from_json(deployed) if deployed else None,
            outputs=[str(o) for o in data.get("outputs", [])],
            unmeasured=[str(u) for u in data.get("unmeasured", [])],
            deployed_samples=int(data["deployed_samples"]) if data.get("deployed_samples") is not None else None,
            deployed_basis=OutputMetrics.from_json(data["deployed_basis"]) if data.get("deployed_basis") else None,
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
    preprocessing: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per input, the preprocessing as applied to the calibration data (resize mode and sizes, mean,
    std, channel order, layout, dtype, scale): the rest of the input contract beside the shapes."""
    worst_samples: list[dict[str, Any]] = field(default_factory=list)
    """The evaluation samples with the lowest output cosine (index, file, output, cosine), worst first:
    what `extract --worst RUN_DIR` feeds the minimal model."""
    memory: dict[str, Any] = field(default_factory=dict)
    """The memory plan (scanning/budget.py): budget, batch, segments, estimated and measured peak."""
    format: int = 1
    tool: str = "quantscan"
    deployed_gap_sites: list[dict[str, Any]] = field(default_factory=list)
    """Sites where onnxruntime's integer kernels part from the fake-quant simulation (only when the
    deployed output differs; scanning.deployed): node, kernel, output, sqnr_db, cosine, drop_db, reason."""
    chip: dict[str, Any] = field(default_factory=dict)
    """What the chip profile decided (scanning.options.ChipRecipe): scheme and why, fusions, CPU and float16
    nodes, consumer-range ops, recipe; `options` beside it keeps what the user asked."""

    def to_json(self) -> dict[str, Any]:
        """run.json's content, keys in the order the contract has always written them (the deployed-gap
        sites, when there are any, after them)."""
        extra = {"deployed_gap_sites": [dict(s) for s in self.deployed_gap_sites]} if self.deployed_gap_sites else {}
        return {
            "format": self.format,
            "tool": self.tool,
            "versions": dict(self.versions),
            "model": self.model.to_json(),
            "input_contract": {k: list(v) for k, v in self.input_contract.items()},
            "preprocessing": {k: dict(v) for k, v in self.preprocessing.items()},
            "worst_samples": [dict(w) for w in self.worst_samples],
            "inputs": [dict(i) for i in self.inputs],
            "calibration": self.calibration.to_json(),
            "evaluation": self.evaluation.to_json(),
            "options": dict(self.options),
            "chip": dict(self.chip),
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
            "memory": dict(self.memory),
            "headline": self.headline.to_json(),
            "times_s": dict(self.times_s),
            "output_metrics": {k: m.to_json() for k, m in self.output_metrics.items()},
            "deployed_metrics": {k: m.to_json() for k, m in self.deployed_metrics.items()},
            "warnings": list(self.warnings),
            **extra,
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
            chip=dict(data["chip"]) if isinstance(data.get("chip"), Mapping) else {},
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
            memory=dict(data["memory"]) if isinstance(data.get("memory"), Mapping) else {},
            headline=Headline.from_json(data.get("headline") or {}),
            times_s={str(k): _float(v) for k, v in (data.get("times_s") or {}).items()},
            output_metrics={str(k): OutputMetrics.from_json(v) for k, v in
                            (data.get("output_metrics") or {}).items()},
            deployed_metrics={str(k): OutputMetrics.from_json(v) for k, v in
                              (data.get("deployed_metrics") or {}).items()},
            warnings=[str(w) for w in data.get("warnings") or []],
            preprocessing={str(k): dict(v) for k, v in (data.get("preprocessing") or {}).items()},
            worst_samples=[dict(w) for w in data.get("worst_samples") or []],
            format=int(data.get("format", 1)),
            tool=str(data.get("tool", "quantscan")),
            deployed_gap_sites=[dict(s) for s in data.get("deployed_gap_sites") or [] if isinstance(s, Mapping)],
        )



# --- bisection records (target, plan, plan sites) ------------------------------------------------


Metrics = dict[str, float]
"""One configuration's headline metrics by name (`cosine`, `sqnr_db`, `top1_agreement`)."""


def json_float(value: float) -> float | str:
    """JSON has no NaN/inf: they are stored as the strings "nan"/"inf"/"-inf", so the file stays JSON."""
    return value if math.isfinite(value) else str(value)


def _metrics_json(metrics: Metrics | None) -> dict[str, float | str] | None:
    return None if metrics is None else {k: json_float(v) for k, v in metrics.items()}


def _metrics_from(raw: Any) -> Metrics | None:
    return None if raw is None else {str(k): float(v) for k, v in dict(raw).items()}


@dataclass(frozen=True)
class PlanTarget:
    """The target a plan was searched for: `metric` (cosine|sqnr|top1) >= `value` on `output`."""

    metric: str
    value: float
    output: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"metric": self.metric, "value": json_float(self.value), Col.OUTPUT: self.output}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> PlanTarget:
        output = raw.get(Col.OUTPUT)
        return cls(str(raw["metric"]), float(raw["value"]), None if output is None else str(output))


@dataclass(frozen=True)
class PlanSite:
    """A site the plan keeps above int8, with what the vendor exports need to address it.

    `nodes` are the kernel's node names in the user's model (a folded BatchNormalization included),
    `output` the tensor the kernel writes; `weights`/`weight_axis` and `int16_tensors` say what an
    int16 site quantizes at 16 bit.
    """

    node: str
    output: str
    precision: Precision
    op_type: str = ""
    kernel: str = ""
    order: int = 0
    nodes: tuple[str, ...] = ()
    gain_if_float: float = math.nan
    weights: tuple[str, ...] = ()
    weight_axis: int = 0
    int16_tensors: tuple[str, ...] = ()

    @property
    def node_names(self) -> tuple[str, ...]:
        """The nodes an export names: the kernel's nodes, or the site node alone when none are known."""
        return self.nodes or (self.node,)

    def to_json(self) -> dict[str, Any]:
        return {
            Col.NODE: self.node,
            Col.OUTPUT: self.output,
            "precision": str(self.precision),
            Col.OP_TYPE: self.op_type,
            Col.KERNEL: self.kernel,
            Col.ORDER: self.order,
            "nodes": list(self.nodes),
            Col.GAIN_IF_FLOAT: json_float(self.gain_if_float),
            "weights": list(self.weights),
            "weight_axis": self.weight_axis,
            "int16_tensors": list(self.int16_tensors),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> PlanSite:
        return cls(
            node=str(raw[Col.NODE]),
            output=str(raw[Col.OUTPUT]),
            precision=Precision(Precision.parse(raw["precision"])),
            op_type=str(raw.get(Col.OP_TYPE, "")),
            kernel=str(raw.get(Col.KERNEL, "")),
            order=int(raw.get(Col.ORDER, 0)),
            nodes=tuple(str(n) for n in raw.get("nodes", ())),
            gain_if_float=float(raw.get(Col.GAIN_IF_FLOAT, math.nan)),
            weights=tuple(str(w) for w in raw.get("weights", ())),
            weight_axis=int(raw.get("weight_axis", 0)),
            int16_tensors=tuple(str(t) for t in raw.get("int16_tensors", ())),
        )


@dataclass(frozen=True)
class ParetoPoint:
    """Best measured metric with `float_sites` sites kept high precision (Pareto-optimal points only)."""

    float_sites: int
    value: float
    sites: tuple[str, ...]
    search_value: float | None = None
    """What the search measured (its lower bound on the searched samples) when `value` is held out."""
    interval: Mapping[str, float] | None = None
    """{low, high} of the metric over rounding realisations and held-out samples."""
    verified: dict[str, Any] | None = None
    """`bisect --verify`: the point applied by the real toolchain (as `Plan.verified`)."""

    def to_json(self) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if self.search_value is not None:
            extra["search_value"] = json_float(self.search_value)
        if self.interval is not None:
            extra["interval"] = {k: json_float(v) for k, v in self.interval.items()}
        if self.verified is not None:
            extra["verified"] = dict(self.verified)
        return {"float_sites": self.float_sites, "value": json_float(self.value), "sites": list(self.sites), **extra}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ParetoPoint:
        search, interval, verified = raw.get("search_value"), raw.get("interval"), raw.get("verified")
        return cls(int(raw["float_sites"]), float(raw["value"]), tuple(str(s) for s in raw.get("sites", ())),
                   None if search is None else float(search),
                   {str(k): float(v) for k, v in interval.items()} if isinstance(interval, dict) else None,
                   dict(verified) if isinstance(verified, dict) else None)


@dataclass(frozen=True)
class PlanStep:
    """One finished evaluation of the search, as the plan's step log keeps it."""

    sites: tuple[str, ...]
    phase: str
    value: float
    passed: bool
    seconds: float
    metrics: Metrics = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "eval",
            "sites": list(self.sites),
            "phase": self.phase,
            "value": json_float(self.value),
            "passed": self.passed,
            "seconds": round(self.seconds, 4),
            "metrics": {k: json_float(v) for k, v in self.metrics.items()},
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> PlanStep:
        return cls(
            sites=tuple(str(s) for s in raw["sites"]),
            phase=str(raw["phase"]),
            value=float(raw["value"]),
            passed=bool(raw["passed"]),
            seconds=float(raw.get("seconds", 0.0)),
            metrics=_metrics_from(raw.get("metrics", {})) or {},
        )


PLAN_FORMAT = 1
"""plan.json format version."""
PLAN_TOOL = "quantscan"


@dataclass(frozen=True)
class Plan:
    """A mixed-precision plan: what `quantscan bisect` found, as plan.json holds it (the contract).

    `sites` are the sites kept at the fallback precision; `all_int8`, `all_float` and `achieved` the
    headline metrics of nothing kept, everything kept (but `force_quant`) and the plan (None when not
    measured); `pareto` the measured float-sites -> metric curve; `steps` the evaluation log.
    `to_json`/`from_json` are the one place the file's keys are spelled.
    """

    model: str
    model_sha256: str
    target: PlanTarget
    fallback: Precision
    mode: str
    status: str
    reached: bool
    all_int8: Metrics | None
    all_float: Metrics | None
    achieved: Metrics | None
    sites: tuple[PlanSite, ...]
    pareto: tuple[ParetoPoint, ...]
    evaluations: int
    evaluations_before_prune: int
    evaluations_reduce: int
    site_count: int
    first_bad: str | None
    keep_float: tuple[str, ...]
    force_quant: tuple[str, ...]
    qdq_opset: int
    qdq_note: str
    calibration: dict[str, Any]
    seconds: float
    search_seconds: float
    last_phase: str | None
    phases: tuple[str, ...]
    steps: tuple[PlanStep, ...]
    format: int = PLAN_FORMAT
    tool: str = PLAN_TOOL
    recipe: dict[str, Any] | None = None
    """How the plan was measured, for the exports: `profile`, `recipe` (kernels|onnxruntime) and the
    `quantize_static` keyword arguments of its activation scheme (None in older plan files)."""
    interval: Mapping[str, float] | None = None
    """{low, high} of the achieved metric over rounding realisations and held-out samples (issue 32)."""
    held_out: Mapping[str, Any] | None = None
    """How the claims were measured: sample counts, split, realisations, spread, seed, bound."""
    search: Mapping[str, Any] | None = None
    """The search's own figures (searched samples, realisation 0, plus its bounds) of achieved/all_int8/all_float."""
    verified: dict[str, Any] | None = None
    """`bisect --verify`: the plan applied by the real toolchain (CONTRACT: `tool`, `version`, `value`;
    also `claimed`, `builds`, vanished sites, what each site ran at). None when no toolchain ran."""
    speculation: Mapping[str, int] | None = None
    """`--workers` > 1: the search measured in rounds (bisect/speculate.py): `workers`, `rounds`, `measured`
    (sets measured, speculation included), `unused` (measured, never asked for), `reused_from_session`.
    None with one worker (a round is one evaluation)."""
    unmeasured: tuple[str, ...] = ()
    """Control-flow nodes whose bodies hold quantizable nodes the search left float (`p2o.Loop.0 (114
    nodes)`): every figure of the plan is of the model with those bodies float, not the all-int8 model."""
    verdict: Mapping[str, Any] | None = None
    """What bisect may claim (bisect/verdict.py `Verdict.to_json`): reached on the held-out samples or not,
    no plan helps, and, for a plan keeping more than half the sites float, that the output cannot be int8
    with its cause and the measured alternatives. None in older plan files."""
    scheme: Mapping[str, Any] | None = None
    """The scheme the bisection ran under (quantscan.schemes `Scheme.to_json`: `name`, `weights`,
    `group_size`, `weight_zero_point`, `activations`): a site at `int8` holds the scheme's weights and
    activations, not literally int8. None in plan files from before schemes (w8a8)."""

    early_stop: str | None = None
    """Why the search ended after its prefix search (bisect/state.py EARLY_STOP_SHARE): the target needs nearly
    every site float, so the plan is a measured passing set, not a minimal one. None when it did not stop early."""

    objective: Mapping[str, Any] | None = None
    """`bisect --objective`/`--max-extra-ms` (bisect/objective.py): what was optimised, the fewest-sites plan's
    estimated extra ms and the chosen set's. None in older plan files."""

    def sites_at(self, precision: Precision | None = None) -> list[PlanSite]:
        """The plan's sites, or only those at `precision`."""
        return [s for s in self.sites if precision is None or s.precision == precision]

    def to_json(self) -> dict[str, Any]:
        """plan.json's content, keys in the file's order; non-finite floats as strings."""
        return {
            "format": self.format,
            "tool": self.tool,
            "model": self.model,
            "model_sha256": self.model_sha256,
            "target": self.target.to_json(),
            "fallback": str(self.fallback),
            "mode": self.mode,
            "status": self.status,
            "reached": self.reached,
            "all_int8": _metrics_json(self.all_int8),
            "all_float": _metrics_json(self.all_float),
            "achieved": _metrics_json(self.achieved),
            "sites": [s.to_json() for s in self.sites],
            "pareto": [p.to_json() for p in self.pareto],
            "evaluations": self.evaluations,
            "evaluations_before_prune": self.evaluations_before_prune,
            "evaluations_reduce": self.evaluations_reduce,
            "site_count": self.site_count,
            "first_bad": self.first_bad,
            "keep_float": list(self.keep_float),
            "force_quant": list(self.force_quant),
            "qdq_opset": self.qdq_opset,
            "qdq_note": self.qdq_note,
            "calibration": dict(self.calibration),
            "seconds": self.seconds,
            "search_seconds": self.search_seconds,
            "last_phase": self.last_phase,
            "phases": list(self.phases),
            "steps": [s.to_json() for s in self.steps],
            **({"recipe": dict(self.recipe)} if self.recipe is not None else {}),
            **({"interval": {k: json_float(v) for k, v in self.interval.items()}} if self.interval is not None else {}),
            **({"held_out": dict(self.held_out)} if self.held_out is not None else {}),
            **({"search": {k: _metrics_json(v) for k, v in self.search.items()}} if self.search is not None else {}),
            **({"verified": dict(self.verified)} if self.verified is not None else {}),
            **({"speculation": dict(self.speculation)} if self.speculation is not None else {}),
            **({"unmeasured": list(self.unmeasured)} if self.unmeasured else {}),
            **({"verdict": dict(self.verdict)} if self.verdict is not None else {}),
            **({"scheme": dict(self.scheme)} if self.scheme is not None else {}),
            **({"objective": dict(self.objective)} if self.objective is not None else {}),
            **({"early_stop": self.early_stop} if self.early_stop is not None else {}),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Plan:
        """Read plan.json's content back (KeyError/ValueError when a contract key is missing or bad)."""
        first_bad, last_phase = raw.get("first_bad"), raw.get("last_phase")
        return cls(
            model=str(raw["model"]),
            model_sha256=str(raw["model_sha256"]),
            target=PlanTarget.from_json(raw["target"]),
            fallback=Precision(Precision.parse(raw["fallback"])),
            mode=str(raw["mode"]),
            status=str(raw["status"]),
            reached=bool(raw["reached"]),
            all_int8=_metrics_from(raw.get("all_int8")),
            all_float=_metrics_from(raw.get("all_float")),
            achieved=_metrics_from(raw.get("achieved")),
            sites=tuple(PlanSite.from_json(s) for s in raw["sites"]),
            pareto=tuple(ParetoPoint.from_json(p) for p in raw["pareto"]),
            evaluations=int(raw["evaluations"]),
            evaluations_before_prune=int(raw.get("evaluations_before_prune", 0)),
            evaluations_reduce=int(raw.get("evaluations_reduce", 0)),
            site_count=int(raw.get("site_count", 0)),
            first_bad=None if first_bad is None else str(first_bad),
            keep_float=tuple(str(n) for n in raw.get("keep_float", ())),
            force_quant=tuple(str(n) for n in raw.get("force_quant", ())),
            qdq_opset=int(raw.get("qdq_opset", 0)),
            qdq_note=str(raw.get("qdq_note", "")),
            calibration=dict(raw.get("calibration", {})),
            seconds=float(raw.get("seconds", 0.0)),
            search_seconds=float(raw.get("search_seconds", 0.0)),
            last_phase=None if last_phase is None else str(last_phase),
            phases=tuple(str(p) for p in raw.get("phases", ())),
            steps=tuple(PlanStep.from_json(s) for s in raw.get("steps", ())),
            format=int(raw.get("format", PLAN_FORMAT)),
            tool=str(raw.get("tool", PLAN_TOOL)),
            recipe=dict(raw["recipe"]) if isinstance(raw.get("recipe"), dict) else None,
            interval={str(k): float(v) for k, v in raw["interval"].items()}
            if isinstance(raw.get("interval"), dict) else None,
            held_out=dict(raw["held_out"]) if isinstance(raw.get("held_out"), dict) else None,
            search={str(k): _metrics_from(v) for k, v in raw["search"].items()}
            if isinstance(raw.get("search"), dict) else None,
            verified=dict(raw["verified"]) if isinstance(raw.get("verified"), dict) else None,
            speculation={str(k): int(v) for k, v in raw["speculation"].items()}
            if isinstance(raw.get("speculation"), dict) else None,
            unmeasured=tuple(str(u) for u in raw.get("unmeasured", ())),
            verdict=dict(raw["verdict"]) if isinstance(raw.get("verdict"), dict) else None,
            scheme=dict(raw["scheme"]) if isinstance(raw.get("scheme"), dict) else None,
            objective=dict(raw["objective"]) if isinstance(raw.get("objective"), dict) else None,
            early_stop=str(raw["early_stop"]) if raw.get("early_stop") is not None else None,
        )



# --- compatibility records (findings) -------------------------------------------------------------


class RewriteId(StrEnum):
    """Every rewrite `quantscan rewrite` implements, by the id users type and findings suggest.

    A closed enum, not a dynamic registry: each id has a CLI flag and a pass module, so adding one is
    a code change anyway. `rewrites.pipeline.REWRITES` maps the plain passes; `fix-dim` takes settings.
    """

    FOLD_BN = "fold-bn"
    DECOMPOSE_HARDSWISH = "decompose-hardswish"
    DECOMPOSE_HARDSIGMOID = "decompose-hardsigmoid"
    FUSE_HARDSWISH = "fuse-hardswish"
    CLEANUP = "cleanup"
    DECOMPOSE_LAYERNORM = "decompose-layernorm"
    FUSE_LAYERNORM = "fuse-layernorm"
    FUSE_SOFTMAX = "fuse-softmax"
    GELU_TANH = "gelu-tanh"
    DIV_TO_MUL = "div-to-mul"
    FIX_CEIL_MODE = "fix-ceil-mode"
    GLOBAL_POOL = "global-pool"
    OPSET_DOWN = "opset-down"
    FIX_DIM = "fix-dim"
    CLAMP_MASK = "clamp-mask"
    FREEZE_INPUT = "freeze-input"
    RECIPROCAL = "reciprocal"
    EQUALIZE = "equalize"
    SMOOTH = "smooth"
    BIAS_CORRECT = "bias-correct"
    RELU6_TO_RELU = "relu6-to-relu"


FINDING_COLUMNS: tuple[str, ...] = (
    Col.NODE,
    Col.OP_TYPE,
    "rule",
    "attribute",
    "value",
    "limit",
    "severity",
    Col.PLACEMENT,
    "partition",
    "fix",
    "profile",
)
"""compat.csv columns, in the contract's order."""

FINDING_DETAIL_COLUMNS: tuple[str, ...] = (
    Col.REASON,
    "source",
    "unverified",
    "forces_cpu",
    "rewrite",
    "rewrite_args",
)
"""Extra per-finding columns kept beside the contract table (same row order); never in compat.csv."""


@dataclass(frozen=True)
class Finding:
    """One reason a node will not run (well) on a chip, with the value, the limit and a fix.

    Rules fill the judgement (severity, reason, fix); the check fills where the node ended up
    (`placement`, `partition`) and for which `profile`. `fix` is the free text users read; when it
    names a rewrite, `rewrite` holds that id (and `rewrite_args` its settings, e.g. fix-dim's
    `batch=1`), so no one parses the text back. `forces_cpu` says the node cannot stay on the NPU
    because of this finding; `unverified` marks a limit no vendor document confirmed: such findings
    are capped at `warn` so CI never fails on a guess.
    """

    node: str
    op_type: str
    rule: str
    severity: Severity
    reason: str
    attribute: str = ""
    value: str = ""
    limit: str = ""
    fix: str = ""
    source: str = ""
    unverified: bool = False
    forces_cpu: bool = False
    rewrite: RewriteId | None = None
    rewrite_args: tuple[str, ...] = ()
    placement: Placement | None = None
    partition: int | None = None
    profile: str = ""

    def __post_init__(self) -> None:
        # Enum fields accept their plain words too (rows read back from CSV), and stay typed after.
        object.__setattr__(self, "severity", Severity.parse(self.severity))
        if self.rewrite is not None:
            object.__setattr__(self, "rewrite", RewriteId.parse(self.rewrite))
        if self.placement is not None:
            object.__setattr__(self, Col.PLACEMENT, Placement.parse(self.placement))

    def capped(self) -> Finding:
        """This finding with severity at most `warn` when its limit is unverified."""
        if self.unverified and self.severity is Severity.ERROR:
            return replace(self, severity=Severity.WARN)
        return self

    def to_row(self) -> dict[str, object]:
        """The compat.csv row (contract columns, plain strings) followed by the detail columns."""
        return {
            Col.NODE: self.node,
            Col.OP_TYPE: self.op_type,
            "rule": self.rule,
            "attribute": self.attribute,
            "value": self.value,
            "limit": self.limit,
            "severity": self.severity.value,
            Col.PLACEMENT: self.placement.value if self.placement is not None else "",
            "partition": self.partition if self.partition is not None else "",
            "fix": self.fix,
            "profile": self.profile,
            Col.REASON: self.reason,
            "source": self.source,
            "unverified": self.unverified,
            "forces_cpu": self.forces_cpu,
            "rewrite": self.rewrite.value if self.rewrite is not None else "",
            "rewrite_args": " ".join(self.rewrite_args),
        }

    @classmethod
    def from_row(cls, row: Mapping[str, object]) -> Finding:
        """The finding `to_row` wrote (also a compat.csv row read back: missing details default)."""
        return cls(
            node=_text(row.get(Col.NODE)),
            op_type=_text(row.get(Col.OP_TYPE)),
            rule=_text(row.get("rule")),
            severity=Severity(Severity.parse(row.get("severity")).value),
            reason=_text(row.get(Col.REASON)),
            attribute=_text(row.get("attribute")),
            value=_text(row.get("value")),
            limit=_text(row.get("limit")),
            fix=_text(row.get("fix")),
            source=_text(row.get("source")),
            unverified=_flag(row.get("unverified")),
            forces_cpu=_flag(row.get("forces_cpu")),
            rewrite=RewriteId(_text(row.get("rewrite"))) if _text(row.get("rewrite")) else None,
            rewrite_args=tuple(_text(row.get("rewrite_args")).split()),
            placement=Placement(_text(row.get(Col.PLACEMENT))) if _text(row.get(Col.PLACEMENT)) else None,
            partition=_partition(row.get("partition")),
            profile=_text(row.get("profile")),
        )


def _text(value: object) -> str:
    """A CSV cell as text: None and NaN (pandas' empty cell) are ""."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value)


def _flag(value: object) -> bool:
    return value is True or _text(value).strip().lower() in ("true", "1")


def _partition(value: object) -> int | None:
    text = _text(value).strip()
    return int(float(text)) if text else None
