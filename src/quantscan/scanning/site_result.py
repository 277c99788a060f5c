"""One quantization site's results as a typed record: what layers.csv holds, one row per `SiteResult`.

Why a record and not a DataFrame the passes add columns to: the scan's tables, the profile's placement,
the output-gain ranking and the inherited-cause rerun each used to take the layers DataFrame and add or
overwrite columns, so what a row held depended on which functions had run, and each column name was
spelled in every one of them. Now each pass returns records (`dataclasses.replace` on the frozen
`SiteResult`), the figures are grouped by what measured them, and `layers_frame` builds the DataFrame
once, where `scanning.run.measure` returns it (layers.csv's columns and their order: `row`).

A CPU-placed node (a chip profile runs it in float) is a row too: it has no isolated, channel or weight
figures (`None`: NaN cells) and its placement says `cpu`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from quantscan.columns import Col

NAN = math.nan


@dataclass(frozen=True)
class IsolatedFigures:
    """The site alone quantized, fed FP32 inputs (pass 2's isolated branch)."""

    cosine: float = NAN
    sqnr_db: float = NAN
    max_abs: float = NAN


@dataclass(frozen=True)
class IsolatedSplit:
    """The isolated error split in two (pass 2's weight-only and activation-only twins): only the site's
    weights quantized, and only its input/output activations, each fed FP32 inputs. Which half is close
    to the whole isolated figure says whether per-channel weights or weight rounding (the weight half)
    or the activation scheme (the activation half) is the lever."""

    weight_only: IsolatedFigures = IsolatedFigures()
    act_only: IsolatedFigures = IsolatedFigures()


@dataclass(frozen=True)
class CumulativeFigures:
    """The site's output with every site quantized, against FP32."""

    cosine: float = NAN
    sqnr_db: float = NAN
    mse: float = NAN
    max_abs: float = NAN
    worst_sample_cosine: float = NAN


@dataclass(frozen=True)
class ActivationFigures:
    """The output activation's per-channel figures and its int8 parameters."""

    worst_channel_sqnr_db: float = NAN
    channel_range_spread: float = NAN
    dead_channels: int = 0
    scale: float = NAN
    zero_point: int = 0


@dataclass(frozen=True)
class WeightFigures:
    """The int8 per-channel weight's own error (NaN: the site has no quantized weight)."""

    sqnr_db: float = NAN
    worst_channel_sqnr_db: float = NAN
    channel_range_spread: float = NAN


@dataclass(frozen=True)
class Diagnosis:
    """The first (most urgent) cause-rule finding, the others counted in `text`; tier 0/1 rank first."""

    text: str = ""
    cause: str = ""
    fix: str = ""
    tier: int = 2


@dataclass(frozen=True)
class ChipPlacement:
    """Where a chip profile puts the site (npu/cpu) and its most severe compat finding."""

    placement: str
    rule: str = ""
    fix: str = ""
    severity: str = ""


@dataclass(frozen=True)
class OutputGain:
    """The headline metric with this site float minus all-int8 (NaN: not a measured candidate), its
    jackknife standard errors, and rank 1's whole-set figure (None: not measured in this scan)."""

    if_float: float = NAN
    stderr: float = NAN
    gap_stderr: float = NAN
    whole_set: float | None = None


@dataclass(frozen=True)
class BoardTime:
    """The site's estimated time on the chip at int8, and what keeping it at the fallback precision adds
    (its slower kernel and the converter layers at the new precision boundaries), in ms."""

    est_ms: float
    fallback_extra_ms: float


@dataclass(frozen=True)
class SiteResult:
    """One layers.csv row: the site, its figures, its cause and rank, and what the later passes added."""

    node: str
    op_type: str
    kernel: str
    order: int
    output: str
    inputs: tuple[str, ...] | None
    """The site's input tensors; None for a CPU-placed row (not a quantization site)."""
    isolated: IsolatedFigures | None
    cumulative: CumulativeFigures
    input_sqnr_db: float | None
    eval_clip_fraction: float | None
    activation: ActivationFigures | None
    weight: WeightFigures | None
    sensitive_op: bool
    cause: str = ""
    reason: str = ""
    diagnosis: Diagnosis = Diagnosis()
    rank: int = 0
    chip: ChipPlacement | None = None
    gain: OutputGain | None = None
    board: BoardTime | None = None
    """Estimated board time (`scan --profile P` whose profile has a [cost] table; scanning/board.py)."""
    split: IsolatedSplit | None = None
    """Weight-only / activation-only isolated figures (None: the site has no weight, or not measured)."""

    def figures(self) -> dict[str, Any]:
        """The measured cells (the site through its int8 parameters): what `classify` and the cause
        rules read."""
        iso, cum = self.isolated, self.cumulative
        act, w = self.activation, self.weight
        return {
            Col.NODE: self.node, Col.OP_TYPE: self.op_type, Col.KERNEL: self.kernel, Col.ORDER: self.order,
            Col.OUTPUT: self.output, Col.INPUTS: ";".join(self.inputs) if self.inputs is not None else NAN,
            Col.ISOLATED_COSINE: iso.cosine if iso else NAN,
            Col.ISOLATED_SQNR_DB: iso.sqnr_db if iso else NAN,
            Col.ISOLATED_MAX_ABS: iso.max_abs if iso else NAN,
            **self._split_cells(),
            Col.CUMULATIVE_COSINE: cum.cosine, Col.CUMULATIVE_SQNR_DB: cum.sqnr_db, Col.CUMULATIVE_MSE: cum.mse,
            Col.CUMULATIVE_MAX_ABS: cum.max_abs, Col.CUMULATIVE_WORST_SAMPLE_COSINE: cum.worst_sample_cosine,
            Col.CUMULATIVE_INPUT_SQNR_DB: _or_nan(self.input_sqnr_db),
            Col.EVAL_CLIP_FRACTION: _or_nan(self.eval_clip_fraction),
            Col.ACT_WORST_CHANNEL_SQNR_DB: act.worst_channel_sqnr_db if act else NAN,
            Col.ACT_CHANNEL_RANGE_SPREAD: act.channel_range_spread if act else NAN,
            Col.ACT_DEAD_CHANNELS: act.dead_channels if act else NAN,
            Col.WEIGHT_SQNR_DB: w.sqnr_db if w else NAN,
            Col.WEIGHT_WORST_CHANNEL_SQNR_DB: w.worst_channel_sqnr_db if w else NAN,
            Col.WEIGHT_CHANNEL_RANGE_SPREAD: w.channel_range_spread if w else NAN,
            Col.SENSITIVE_OP: self.sensitive_op,
            Col.ACT_SCALE: act.scale if act else NAN,
            Col.ACT_ZERO_POINT: act.zero_point if act else NAN,
        }

    def row(self, *, whole_set: bool = False) -> dict[str, Any]:
        """The layers.csv row, columns in the contract's order; the placement and gain groups only when
        that pass ran (`whole_set`: the scan measured rank 1 on every sample)."""
        d = self.diagnosis
        row = {**self.figures(), Col.CAUSE: self.cause, Col.REASON: self.reason, Col.DIAGNOSIS: d.text,
               Col.DIAGNOSIS_CAUSE: d.cause, Col.DIAGNOSIS_FIX: d.fix, Col.DIAGNOSIS_TIER: d.tier, Col.RANK: self.rank}
        if self.chip is not None:
            row.update({Col.PLACEMENT: self.chip.placement, Col.COMPAT_RULE: self.chip.rule,
                        Col.COMPAT_FIX: self.chip.fix, Col.COMPAT_SEVERITY: self.chip.severity})
        if self.gain is not None:
            row.update({Col.GAIN_IF_FLOAT: self.gain.if_float, Col.GAIN_IF_FLOAT_STDERR: self.gain.stderr,
                        Col.GAIN_IF_FLOAT_GAP_STDERR: self.gain.gap_stderr})
            if whole_set:
                row[Col.GAIN_IF_FLOAT_WHOLE_SET] = _or_nan(self.gain.whole_set)
        if self.board is not None:
            row.update({Col.EST_MS: self.board.est_ms, Col.FALLBACK_EXTRA_MS: self.board.fallback_extra_ms})
        return row

    def _split_cells(self) -> dict[str, float]:
        w = self.split.weight_only if self.split else IsolatedFigures()
        a = self.split.act_only if self.split else IsolatedFigures()
        return {Col.ISOLATED_WEIGHT_ONLY_COSINE: w.cosine, Col.ISOLATED_WEIGHT_ONLY_SQNR_DB: w.sqnr_db,
                Col.ISOLATED_ACT_ONLY_COSINE: a.cosine, Col.ISOLATED_ACT_ONLY_SQNR_DB: a.sqnr_db}

    @property
    def on_chip(self) -> bool:
        """Not a CPU-placed row: a quantization site the chip runs in int8."""
        return self.chip is None or self.chip.placement != "cpu"


def _or_nan(value: float | None) -> float:
    return NAN if value is None else value


def layers_frame(results: Sequence[SiteResult]) -> pd.DataFrame:
    """layers.csv as a DataFrame, rows in the order given (rank order, as the scan returns them)."""
    whole_set = any(r.gain is not None and r.gain.whole_set is not None for r in results)
    return pd.DataFrame([r.row(whole_set=whole_set) for r in results])


def ranked(results: Iterable[SiteResult], key: Any) -> list[SiteResult]:
    """`results` sorted by `key` (stable: ties keep their order), `rank` renumbered 1..n."""
    ordered = sorted(results, key=key)
    return [replace(r, rank=i) for i, r in enumerate(ordered, start=1)]


def sort_value(value: float | None) -> float:
    """A figure as a sort key, the way the rank has always read them: +inf after every finite value,
    a missing or NaN figure after that (-inf stays first: an overflowed figure is the worst)."""
    if value is None or math.isnan(value):
        return 1e12
    return 1e9 if value == math.inf else float(value)


def by_node(results: Iterable[SiteResult]) -> Mapping[str, SiteResult]:
    return {r.node: r for r in results}
