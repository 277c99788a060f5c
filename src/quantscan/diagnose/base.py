"""The typed finding every cause rule returns, the facts it reads, and the human number format.

Why a package of small rules (like compat/rules): each root cause has its own evidence and its own
fix, and a rule that can be tested alone on hand-built facts (fires / stays silent) is one a user
can trust. Pure numpy: the facts are gathered by the scan (scanning/causes.py); rules never see
a graph or a runtime.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]

SENTINEL = 1.0e30
"""|values| at or beyond this are sentinels (float-min/max masks), never data."""
FLOAT32_SUM_LIMIT = 1.8e19
"""|x| beyond this overflows a float32 Σx² (sqrt of float32's max 3.4e38): error figures go non-finite."""


class Cause(StrEnum):
    """Root causes the diagnosis names (the `diagnosis_cause` column)."""

    NONFINITE = "nonfinite-figures"
    ABSURD_SCALE = "absurd-scale"
    OUTLIER_CHANNELS = "outlier-channels"
    RANGE_MISMATCH = "range-mismatch"
    CODE_WASTE = "code-waste"
    DEAD_CHANNELS = "dead-channels"
    SATURATED_CHANNELS = "saturated-channels"
    INHERITED = "inherited-error"
    PAIR_EQUALIZATION = "pair-equalization"


class FixKind(StrEnum):
    """What kind of action a finding's fix is."""

    REWRITE = "rewrite"
    CALIBRATION = "calibration"
    PER_CHANNEL = "per-channel"
    INT16 = "int16"
    SCHEME = "scheme"
    KEEP_FLOAT = "keep-float"


@dataclass(frozen=True)
class CauseFix:
    """A concrete action: `kind` plus what to type or choose (`value`: a rewrite id, a method...)."""

    kind: FixKind
    value: str
    how: str

    def text(self) -> str:
        """`kind value: how`; `how` alone when the value only repeats the kind ("int16 int16: int16 ...")."""
        if self.value == self.kind.value:
            return self.how
        return f"{self.kind.value} {self.value}: {self.how}"


@dataclass(frozen=True)
class CauseFinding:
    """One root cause at one site: evidence numbers, a one-line reason, the fix. `tier` orders rank
    (0 first): findings that make a site's own figures meaningless sort above every measured figure."""

    node: str
    cause: Cause
    evidence: dict[str, float]
    reason: str
    fix: CauseFix
    tier: int = 2

    def text(self) -> str:
        """`cause: reason -> fix`, the layers.csv `diagnosis` cell."""
        return f"{self.cause.value}: {self.reason} -> {self.fix.text()}"


@dataclass(frozen=True)
class PairFacts:
    """A site read as the consumer of a layer pair (diagnose/pair_equalization.py): per input channel, the
    calibrated range of what it reads and the range of its weights for that channel, and what sits between
    it and the producer that equalization cannot pass."""

    producer: str
    """The weight layer (its site's node) whose output channels this site reads."""
    act_ranges: F64
    """Per input channel, max |x| over the calibration data."""
    weight_ranges: F64
    """Per input channel, max |W| (a depthwise conv: its per-channel weights)."""
    depthwise: bool = False
    blocker: str = ""
    """The op between them that is not positive-homogeneous (`Clip`, `HardSwish`, ...); empty: none."""
    blocker_cap: float = math.nan
    """A Clip's upper bound (6 for Relu6)."""
    blocker_max: float = math.nan
    """The largest value the blocker wrote on the calibration data."""


@dataclass(frozen=True)
class SiteFacts:
    """What the rules read about one site, all measured on the calibration set.

    `lo`/`hi`: the output tensor's range; `ch_lo`/`ch_hi`: per-channel ranges (may be empty);
    `scale`, `zero_point`, `qmin`, `qmax`: its quantization; `input_ranges`: ranges of its data inputs;
    `figures`: isolated/cumulative SQNR and cosine; `feeds_softmax`: the output reaches a Softmax;
    `upstream_gains`: the measured output gain of keeping each upstream site float.
    """

    node: str
    op_type: str
    output: str
    lo: float
    hi: float
    scale: float = math.nan
    zero_point: int = 0
    qmin: int = 0
    qmax: int = 255
    ch_lo: F64 = field(default_factory=lambda: np.zeros(0))
    ch_hi: F64 = field(default_factory=lambda: np.zeros(0))
    input_ranges: dict[str, tuple[float, float]] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)
    feeds_softmax: bool = False
    upstream_gains: dict[str, float] = field(default_factory=dict)
    """Measured `gain_if_float` of the sites upstream of this one (empty until the gain is measured)."""
    passes: tuple[str, ...] = ()
    """No-latency rewrites that can rescale this site's output channels (`smooth`, `equalize`)."""
    pair: PairFacts | None = None
    """This site as the consumer of a layer pair, when it reads another weight layer's channels."""
    kernel: str = ""
    """The kernel the site is (`Softmax[ReduceMax+...+Div]` for a recognised decomposed Softmax, whose
    first node, `op_type`, is a ReduceMax); empty when unknown."""

    def bounded_by(self, ops: frozenset[str]) -> bool:
        """The site's op, or the op its recognised kernel computes, is one of `ops`."""
        return self.op_type in ops or self.kernel.split("[", 1)[0] in ops

    def typical_magnitude(self) -> float:
        """Median per-channel max |value| over channels without sentinels (NaN when unknown): what the
        tensor's data looks like once masks and outliers are set aside."""
        if self.ch_lo.size == 0:
            return math.nan
        mag = np.maximum(np.abs(self.ch_lo), np.abs(self.ch_hi))
        mag = mag[np.isfinite(mag) & (mag < SENTINEL) & (mag > 0)]
        return float(np.median(mag)) if mag.size else math.nan


def human(x: float) -> str:
    """A number a person reads at a glance: 3.7e37, 1.2e-05, 12.5, never 37 digits."""
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    a = abs(x)
    short = f"{x:.3g}"
    if a != 0 and (a >= 1e4 or a < 1e-3 or "e" in short):
        mant, exp = f"{x:.1e}".split("e")
        return f"{mant}e{int(exp)}"
    return short
