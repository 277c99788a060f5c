"""Typed records that cross module lines, and the string enums their fields use.

One module so that a result has one shape wherever it travels: the scan, the bisection, the
compatibility check and the report all speak in these types, and each record converts to and
from its JSON/CSV form here, in one place (`to_json` / `from_json`). The enums are `str`
subclasses, so a value written to CSV or JSON is the plain word users already see
(`"error"`, `"cpu"`, `"int16"`), and comparing a record's field with that word still works.

Pure data: no onnxruntime, no pandas, no file I/O.
"""

from __future__ import annotations

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
