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
from dataclasses import dataclass, replace
from enum import Enum


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


# --- bisection records (target, plan, plan sites) ------------------------------------------------


# --- compatibility records (findings) -------------------------------------------------------------


class RewriteId(StrEnum):
    """Every rewrite `quantscan rewrite` implements, by the id users type and findings suggest.

    A closed enum, not a dynamic registry: each id has a CLI flag and a pass module, so adding one is
    a code change anyway. `rewrites.runner.REWRITES` maps the plain passes; `fix-dim` takes settings.
    """

    FOLD_BN = "fold-bn"
    DECOMPOSE_HARDSWISH = "decompose-hardswish"
    DECOMPOSE_HARDSIGMOID = "decompose-hardsigmoid"
    FUSE_HARDSWISH = "fuse-hardswish"
    CLEANUP = "cleanup"
    DECOMPOSE_LAYERNORM = "decompose-layernorm"
    FUSE_LAYERNORM = "fuse-layernorm"
    GELU_TANH = "gelu-tanh"
    FIX_DIM = "fix-dim"


FINDING_COLUMNS: tuple[str, ...] = (
    "node",
    "op_type",
    "rule",
    "attribute",
    "value",
    "limit",
    "severity",
    "placement",
    "partition",
    "fix",
    "profile",
)
"""compat.csv columns, in the contract's order."""

FINDING_DETAIL_COLUMNS: tuple[str, ...] = (
    "reason",
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
            object.__setattr__(self, "placement", Placement.parse(self.placement))

    def capped(self) -> Finding:
        """This finding with severity at most `warn` when its limit is unverified."""
        if self.unverified and self.severity is Severity.ERROR:
            return replace(self, severity=Severity.WARN)
        return self

    def to_row(self) -> dict[str, object]:
        """The compat.csv row (contract columns, plain strings) followed by the detail columns."""
        return {
            "node": self.node,
            "op_type": self.op_type,
            "rule": self.rule,
            "attribute": self.attribute,
            "value": self.value,
            "limit": self.limit,
            "severity": self.severity.value,
            "placement": self.placement.value if self.placement is not None else "",
            "partition": self.partition if self.partition is not None else "",
            "fix": self.fix,
            "profile": self.profile,
            "reason": self.reason,
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
            node=_text(row.get("node")),
            op_type=_text(row.get("op_type")),
            rule=_text(row.get("rule")),
            severity=Severity(Severity.parse(row.get("severity")).value),
            reason=_text(row.get("reason")),
            attribute=_text(row.get("attribute")),
            value=_text(row.get("value")),
            limit=_text(row.get("limit")),
            fix=_text(row.get("fix")),
            source=_text(row.get("source")),
            unverified=_flag(row.get("unverified")),
            forces_cpu=_flag(row.get("forces_cpu")),
            rewrite=RewriteId(_text(row.get("rewrite"))) if _text(row.get("rewrite")) else None,
            rewrite_args=tuple(_text(row.get("rewrite_args")).split()),
            placement=Placement(_text(row.get("placement"))) if _text(row.get("placement")) else None,
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
