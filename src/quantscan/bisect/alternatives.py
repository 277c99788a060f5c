"""The measured ways out when a plan keeps more than half the sites float (bisect/verdict.py says why).

Each alternative is measured on the held-out samples the plan's claims come from, with the target's
metric, so it stands beside the plan's figures: all sites at int16 activations (where the profile's NPU
takes int16), all-int8 after bias correction (the `rewrite --recover` pass that needs no search: one
statistics pass), all-int8 under another calibration method, and the looser target a small plan reaches
(read from the Pareto front, no measurement). Only run for such plans: each costs a calibration pass.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from quantscan.bisect.realise import SampleSplit, split_context
from quantscan.bisect.robust import Rounding
from quantscan.bisect.state import Target
from quantscan.bisect.targets import make_evaluator
from quantscan.bisect.verdict import Alternative, looser_target
from quantscan.compat.profiles import load_profile
from quantscan.errors import QuantscanError
from quantscan.graph.mixed import MixedBuilder
from quantscan.records import Plan, RewriteId
from quantscan.rewrites.pipeline import calibrated_step
from quantscan.scanning.gain import mixed_builder
from quantscan.scanning.prepare import ScanContext, prepare_scan

OTHER_METHODS = ("percentile", "entropy", "minmax")
"""Calibration methods tried instead of the one used, the first that differs from it."""


def measure_alternatives(
    ctx: ScanContext, split: SampleSplit, builder: MixedBuilder, target: Target, rounding: Rounding, plan: Plan,
) -> tuple[Alternative, ...]:
    """Every alternative that applies, measured (int16, bias correction, calibration method, looser target)."""
    all_int8 = float((plan.all_int8 or {}).get(target.key, math.nan))
    found = [
        _measured(lambda: int16_everywhere(ctx, split, builder, target)),
        _measured(lambda: bias_corrected(ctx, split, target, rounding, all_int8)),
        _measured(lambda: other_calibration(ctx, split, target, rounding, all_int8)),
        looser_target(plan.pareto, plan.site_count, target.metric),
    ]
    return tuple(a for a in found if a is not None)


def _measured(measure: Callable[[], Alternative | None]) -> Alternative | None:
    """One alternative, or None when this model refuses it (an int16 opset upgrade the converter cannot
    do, a rewrite that does not apply): the plan it follows is already measured and stays."""
    try:
        return measure()
    except QuantscanError:
        return None


def int16_allowed(ctx: ScanContext) -> bool:
    """Without a profile every scheme is open; a profile's NPU must list int16 among its dtypes."""
    profile = ctx.chip.profile
    if profile is None or profile == "onnxruntime":
        return True
    try:
        return "int16" in load_profile(profile).npu_dtypes
    except QuantscanError:
        return False


def int16_everywhere(ctx: ScanContext, split: SampleSplit, builder: MixedBuilder, target: Target) -> Alternative | None:
    """Every site at int16 activations (weights int8): the all-int16 fallback figure on the held-out samples."""
    if not int16_allowed(ctx):
        return None
    wide = builder if builder.fallback == "int16" else mixed_builder(split.held, "int16")
    value = _value(split.held, wide, target, [s.node for s in wide.sites])
    return Alternative("int16_activations", value, target.metric, "bisect --fallback int16 (every site int16)",
                       "all sites at int16 activations, held out")


def bias_corrected(
    ctx: ScanContext, split: SampleSplit, target: Target, rounding: Rounding, all_int8: float,
) -> Alternative | None:
    """All-int8 after bias correction (`rewrite --bias-correct`, the pass `--recover` keeps when it helps),
    re-calibrated and measured on the same held-out samples; None when the pass applies nowhere."""
    result = calibrated_step(RewriteId.BIAS_CORRECT, ctx.loaded.proto, ctx.data.cset, runner=ctx.runner)
    if not any(c.rewrite == RewriteId.BIAS_CORRECT.value for c in result.changes):
        return None
    corrected = dataclasses.replace(ctx.loaded, proto=result.model)
    held = _held(prepare_scan(corrected, ctx.data.cset, opts=ctx.opts, runner=ctx.runner), rounding, ctx)
    value = _value(held, mixed_builder(held), target, [])
    return Alternative("recover", value, target.metric, "rewrite --recover (bias correction), then all-int8",
                       "held out", baseline=all_int8)


def other_calibration(
    ctx: ScanContext, split: SampleSplit, target: Target, rounding: Rounding, all_int8: float,
) -> Alternative | None:
    """All-int8 under the first calibration method other than the one used, on the held-out samples."""
    used = str(getattr(ctx.opts.calib_method, "value", ctx.opts.calib_method))
    method = next(m for m in OTHER_METHODS if m != used)
    opts = dataclasses.replace(ctx.opts, calib_method=type(ctx.opts.calib_method)(method))
    held = _held(prepare_scan(ctx.loaded, ctx.data.cset, opts=opts, runner=ctx.runner), rounding, ctx)
    value = _value(held, mixed_builder(held), target, [])
    return Alternative("calib_method", value, target.metric, f"--calib-method {method}, then all-int8", "held out",
                       baseline=all_int8)


def _held(other: ScanContext, rounding: Rounding, ctx: ScanContext) -> ScanContext:
    """The held-out half of another preparation of the same data (the same split as the plan's)."""
    other = dataclasses.replace(other, data=dataclasses.replace(other.data, eval_set=ctx.data.eval_set))
    return split_context(other, rounding, bool(ctx.opts.eval)).held


def _value(ctx: ScanContext, builder: MixedBuilder, target: Target, float_sites: Sequence[str]) -> float:
    """The target's metric of one precision assignment on `ctx`'s evaluation set (realisation 0)."""
    measured = make_evaluator(ctx, builder, target)[0].evaluate(builder.precisions(float_sites))
    return float(measured.worst.get(target.key, math.nan))
