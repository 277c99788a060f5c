"""The rewrite pipeline (`quantscan rewrite`): the id -> pass registry, passes applied in order, the proof.

Why a proof and not trust: an algebraic identity says nothing about the exporter's quirks (a BN whose
statistics are not what the name suggests, an opset whose Clip reads attributes, a -1 dim). Every run
executes the original and the rewritten model on the same inputs (the calibration set, else seeded random
data, said in the report) and compares every graph output *by name*:

- cosine (as in the contract), max_abs = max|x−y|, max_rel = max_abs / range(x) where range(x) is the
  reference output's max − min over all samples (a per-element relative error blows up at zeros);
- exact rewrites pass when max_abs ≤ tolerance × range(x) (default 1e-4: float32 rounding through a
  network), approximate ones (`gelu-tanh`) when cosine ≥ approx_min_cosine, and are labelled so.

The output model and `OUT.rewrite.json` are written atomically only when the proof passes (or `force`);
the input model is never overwritten. Sessions come from `quantscan.runner` (the only onnxruntime user).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantscan.calib import CalibSet
from quantscan.calib.synthetic import random_samples
from quantscan.errors import UsageError
from quantscan.graph.edit import node_label
from quantscan.graph.index import GraphIndex
from quantscan.graph.infer import check_model
from quantscan.metrics import ErrorAccumulator
from quantscan.model import ensure_not_quantized, graph_inputs, load_model, onnx_opset, upgrade_opset
from quantscan.records import RewriteId
from quantscan.rewrites.base import Change, Refusal, RewriteResult
from quantscan.rewrites.bias_correct import bias_correct, bias_sites, with_int8_weights
from quantscan.rewrites.calibstats import channel_stats, tensor_sqnr
from quantscan.rewrites.clamp_mask import CLAMP_CANDIDATES, CLAMP_VALUE, clamp_mask
from quantscan.rewrites.cleanup import cleanup
from quantscan.rewrites.decompose_hardsigmoid import decompose_hardsigmoid
from quantscan.rewrites.decompose_hardswish import decompose_hardswish
from quantscan.rewrites.decompose_layernorm import decompose_layernorm
from quantscan.rewrites.div_to_mul import div_to_mul
from quantscan.rewrites.equalize import equalize
from quantscan.rewrites.fix_ceil_mode import fix_ceil_mode
from quantscan.rewrites.fix_dim import fix_dim as fix_dims
from quantscan.rewrites.fix_dim import parse_dim_spec
from quantscan.rewrites.fold_bn import fold_batchnorm
from quantscan.rewrites.freeze_input import freeze_input as freeze_inputs
from quantscan.rewrites.freeze_input import frozen_values, parse_freeze_spec
from quantscan.rewrites.fuse_hardswish import fuse_hardswish
from quantscan.rewrites.fuse_layernorm import fuse_layernorm
from quantscan.rewrites.fuse_softmax import fuse_softmax
from quantscan.rewrites.gelu_tanh import gelu_tanh
from quantscan.rewrites.global_pool import rewrite_global_pools
from quantscan.rewrites.linear import WEIGHT_OPS, Linear, linear_of
from quantscan.rewrites.opset_down import opset_down
from quantscan.rewrites.reciprocal_to_div import reciprocal_to_div
from quantscan.rewrites.relu6_to_relu import relu6_candidates, relu6_to_relu
from quantscan.rewrites.smooth import smooth, smooth_sites
from quantscan.runfolder import (
    atomic_write_bytes,
    is_quantscan_json,
    is_quantscan_onnx,
    refuse_foreign_overwrite,
    refuse_inputs,
)
from quantscan.runfolder import jsonable as _json_safe
from quantscan.runner import Runner

RewriteFn = Callable[[onnx.ModelProto], RewriteResult]

REWRITES: dict[RewriteId, RewriteFn] = {
    RewriteId.FOLD_BN: fold_batchnorm,
    RewriteId.DECOMPOSE_HARDSWISH: decompose_hardswish,
    RewriteId.DECOMPOSE_HARDSIGMOID: decompose_hardsigmoid,
    RewriteId.FUSE_HARDSWISH: fuse_hardswish,
    RewriteId.CLEANUP: cleanup,
    RewriteId.DECOMPOSE_LAYERNORM: decompose_layernorm,
    RewriteId.FUSE_LAYERNORM: fuse_layernorm,
    RewriteId.FUSE_SOFTMAX: fuse_softmax,
    RewriteId.GELU_TANH: gelu_tanh,
    RewriteId.CLAMP_MASK: clamp_mask,
    RewriteId.DIV_TO_MUL: div_to_mul,
    RewriteId.FIX_CEIL_MODE: fix_ceil_mode,
    RewriteId.GLOBAL_POOL: rewrite_global_pools,
    RewriteId.RECIPROCAL: reciprocal_to_div,
    RewriteId.EQUALIZE: equalize,
}
"""Rewrite id -> pass. `fix-dim` takes dimension settings and is requested as `fix-dim` + `fix_dim=`."""

PARAMETRIZED: tuple[RewriteId, ...] = (RewriteId.FIX_DIM, RewriteId.FREEZE_INPUT, RewriteId.SMOOTH,
                                        RewriteId.BIAS_CORRECT, RewriteId.RELU6_TO_RELU)
CALIBRATED: tuple[RewriteId, ...] = (RewriteId.SMOOTH, RewriteId.BIAS_CORRECT, RewriteId.RELU6_TO_RELU)
"""Passes whose edit depends on per-channel statistics of the calibration data (`--calib` required)."""
DEFAULT_TOLERANCE = 1e-4
DEFAULT_APPROX_MIN_COSINE = 0.999
RANDOM_SAMPLES = 8


def rewrite_ids() -> list[RewriteId]:
    """Every id `rewrite` accepts, in a stable order (the registry's, then the parametrized ones)."""
    return [*REWRITES, *PARAMETRIZED]


# --- report records ---------------------------------------------------------------------------------


@dataclass
class StepReport:
    """One applied rewrite: what it changed and what it refused."""

    rewrite: str
    exact: bool
    changes: list[Change]
    refusals: list[Refusal]
    noop: str = ""
    """Why the pass changed nothing (it was skipped, the other passes kept); empty when it applied."""


@dataclass
class OutputProof:
    """The comparison of one graph output, original vs rewritten, with the threshold it was held to."""

    output: str
    cosine: float
    max_abs: float
    max_rel: float
    ref_range: float
    threshold: str
    passed: bool
    nonfinite_ref: int = 0
    nonfinite_test: int = 0
    note: str = ""


@dataclass
class Proof:
    """The numeric proof: which data, how many samples, which criterion, per-output results."""

    data: str
    samples: int
    exact: bool
    tolerance: float
    approx_min_cosine: float
    outputs: list[OutputProof]
    approximate_rewrites: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.outputs) and all(o.passed for o in self.outputs)


@dataclass
class RewriteReport:
    """Everything `quantscan rewrite` reports: steps, op counts, opsets, the proof, where it wrote."""

    source: str
    model: onnx.ModelProto
    steps: list[StepReport]
    op_counts_before: dict[str, int]
    op_counts_after: dict[str, int]
    opset_before: int
    opset_after: int
    proof: Proof
    out: Path | None = None
    written: bool = False
    forced: bool = False

    @property
    def passed(self) -> bool:
        return self.proof.passed

    @property
    def changes(self) -> list[Change]:
        return [c for s in self.steps for c in s.changes]

    @property
    def refusals(self) -> list[Refusal]:
        return [r for s in self.steps for r in s.refusals]

    def to_json(self) -> dict[str, Any]:
        """The content of OUT.rewrite.json (non-finite floats become strings: strict JSON)."""
        data: dict[str, Any] = {
            "source": self.source,
            "out": str(self.out) if self.out else None,
            "written": self.written,
            "forced": self.forced,
            "passed": self.passed,
            "opset_before": self.opset_before,
            "opset_after": self.opset_after,
            "op_counts_before": self.op_counts_before,
            "op_counts_after": self.op_counts_after,
            "steps": [asdict(s) for s in self.steps],
            "proof": {**asdict(self.proof), "passed": self.proof.passed},
        }
        return _json_safe(data)


# --- entry point ------------------------------------------------------------------------------------


def rewrite(
    model: str | Path | onnx.ModelProto,
    rewrites: Sequence[str],
    *,
    fix_dim: Sequence[str] = (),
    opset: int | None = None,
    out: str | Path | None = None,
    calib: CalibSet | None = None,
    seed: int = 0,
    limit: int | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    approx_min_cosine: float = DEFAULT_APPROX_MIN_COSINE,
    force: bool = False,
    write: bool = True,
    runner: Runner | None = None,
    clamp_mask_value: float | None = None,
    freeze_input: Sequence[str] = (),
    smooth_alpha: float | None = None,
) -> RewriteReport:
    """Apply `rewrites` (ids from `rewrite_ids()`) in order, prove the result, write it when it passes.

    `fix_dim` holds the dimension settings of `fix-dim` (contract syntax); giving them without listing
    `fix-dim` applies it first. An `opset` above the model's converts it first (fusions may need
    the newer ops); one below lowers it last with `opset-down` (decompositions must run while their ops
    exist), refusing with the ops that block it. Without `out`, a model given by path is written beside
    itself as `<stem>.rewritten.onnx` (then `.rewritten.1.onnx`, ...); `write=False` only proves.
    Raises UsageError for unknown ids, bad dimension syntax, `out` equal to the input, a request where
    no rewrite applied anywhere (the error lists why, from the refusals), opset-down included. A pass
    that applies nowhere among others that apply is skipped and reported (`StepReport.noop`), the way
    `--all-for-profile` skips one: `--fix-dim batch=1 --cleanup` on a clean graph still fixes the dim, and
    an opset the Loop bodies block is skipped with its blockers while the other passes apply.
    `clamp_mask_value` is the finite value `clamp-mask` writes; without one, the smallest magnitude of
    `CLAMP_CANDIDATES` whose proof is exact on the same data is chosen (else `CLAMP_VALUE`).
    `freeze_input` holds `NAME=VALUE` settings (`freeze-input`, applied right after fix-dim); the proof
    feeds the original model VALUE for NAME on every sample.
    `smooth` and `bias-correct` need `calib` (their statistics); `smooth_alpha` None chooses alpha per
    site (smooth.py). bias-correct's changes carry per-site figures (`_site_figures`).
    """
    steps_wanted = _steps(rewrites, fix_dim, opset_only=opset is not None, freeze=freeze_input)
    source, original = _load(model)
    frozen = frozen_values(original, list(freeze_input)) if freeze_input else {}
    out_path = _out_path(model, out, force) if write else None

    opset_before = onnx_opset(original)
    current, steps = _apply_steps(original, steps_wanted, opset, calib=calib, seed=seed, limit=limit,
                                  tolerance=tolerance, runner=runner, clamp_mask_value=clamp_mask_value,
                                  smooth_alpha=smooth_alpha)
    check_model(current)

    proof = prove(
        original,
        current,
        calib=calib,
        seed=seed,
        limit=limit,
        tolerance=tolerance,
        approx_min_cosine=approx_min_cosine,
        approximate=[s.rewrite for s in steps if not s.exact],
        runner=runner,
        frozen=frozen,
    )
    if any(s.rewrite == RewriteId.BIAS_CORRECT.value for s in steps):
        hold_to_int8_weights(proof, original, current, calib, limit=limit, runner=runner)
    report = RewriteReport(
        source=source,
        model=current,
        steps=steps,
        op_counts_before=op_counts(original),
        op_counts_after=op_counts(current),
        opset_before=opset_before,
        opset_after=onnx_opset(current),
        proof=proof,
        out=out_path,
        forced=force and not proof.passed,
    )
    if out_path is not None and (proof.passed or force):
        _write(report, out_path)
    return report


def _write(report: RewriteReport, out_path: Path) -> None:
    """The rewritten model and its OUT.rewrite.json record, each atomic."""
    report.written = True
    atomic_write_bytes(out_path, report.model.SerializeToString())
    atomic_write_bytes(
        out_path.with_name(out_path.name + ".rewrite.json"),
        (json.dumps(report.to_json(), indent=1, allow_nan=False) + "\n").encode(),
    )


def _apply_steps(
    original: onnx.ModelProto,
    steps_wanted: Sequence[tuple[RewriteId, Sequence[str]]],
    opset: int | None,
    *,
    calib: CalibSet | None,
    seed: int,
    limit: int | None,
    tolerance: float,
    runner: Runner | None,
    clamp_mask_value: float | None,
    smooth_alpha: float | None,
) -> tuple[onnx.ModelProto, list[StepReport]]:
    """The passes in order (an opset raised first, lowered last); a pass that applies nowhere among
    others is skipped and reported, all of them applying nowhere is a refusal."""
    current = original
    steps: list[StepReport] = []
    opset_before = onnx_opset(original)
    if opset is not None and opset > opset_before:
        current = upgrade_opset(current, opset)
        change = Change("opset", "", f"opset {opset_before} -> {opset} (onnx.version_converter)")
        steps.append(StepReport("opset", True, [change], []))
    for rid, args in steps_wanted:
        if rid is RewriteId.CLAMP_MASK:
            value = clamp_mask_value
            if value is None:
                value = _smallest_exact_mask(current, calib=calib, seed=seed, limit=limit, tolerance=tolerance,
                                             runner=runner)
            result = clamp_mask(current, value)
        elif rid in CALIBRATED:
            result = calibrated_step(rid, current, calib, limit=limit, runner=runner, alpha=smooth_alpha)
        else:
            result = _plain_step(rid, args, current, frozen=_freeze_settings(steps_wanted))
        noop = "" if result.changes else _applied_nowhere(rid, result)
        steps.append(StepReport(rid.value, result.exact, result.changes, result.refusals, noop))
        if not noop:
            current = result.model
    if opset is not None and opset < opset_before:
        current = _opset_down(current, opset, steps)
    if not any(s.changes for s in steps):  # one no-op pass among others is skipped; all no-ops is a refusal
        raise UsageError(next(s.noop for s in steps if s.noop))
    return current, steps


def _freeze_settings(steps_wanted: Sequence[tuple[RewriteId, Sequence[str]]]) -> Sequence[str]:
    return next((args for rid, args in steps_wanted if rid is RewriteId.FREEZE_INPUT), ())


def _plain_step(
    rid: RewriteId, args: Sequence[str], current: onnx.ModelProto, frozen: Sequence[str] = ()
) -> RewriteResult:
    """A pass that needs nothing but the model (and, for fix-dim and freeze-input, its settings; fix-dim
    also the request's freeze-input settings, which run after it and fold the Ifs its sizes may break)."""
    if rid is RewriteId.FIX_DIM:
        return fix_dims(current, args, frozen=frozen, check_load=True)
    if rid is RewriteId.FREEZE_INPUT:
        return freeze_inputs(current, args)
    return REWRITES[rid](current)


def calibrated_step(
    rid: RewriteId,
    model: onnx.ModelProto,
    calib: CalibSet | None,
    *,
    limit: int | None = None,
    runner: Runner | None = None,
    alpha: float | None = None,
) -> RewriteResult:
    """`smooth`, `bias-correct` or `relu6-to-relu` on `model`: statistics first (one calibration run), then
    the pass."""
    if calib is None:
        raise UsageError(f"{rid.value}: expected --calib (its factors come from per-channel statistics of the "
                         "calibration data), found none")
    runner = runner or Runner()
    if rid is RewriteId.RELU6_TO_RELU:
        stats = channel_stats(model, dict.fromkeys(relu6_candidates(model), "conv"), calib, limit=limit, runner=runner)
        return relu6_to_relu(model, {t: float(np.max(s.max)) for t, s in stats.items()})
    if rid is RewriteId.SMOOTH:
        return smooth(model, channel_stats(model, smooth_sites(model), calib, limit=limit, runner=runner), alpha)
    result = bias_correct(model, channel_stats(model, bias_sites(model), calib, limit=limit, runner=runner))
    if result.changes:
        _site_figures(model, result, calib, limit=limit, runner=runner)
    return result


def hold_to_int8_weights(
    proof: Proof, original: onnx.ModelProto, rewritten: onnx.ModelProto, calib: CalibSet | None, *,
    limit: int | None, runner: Runner | None,
) -> None:
    """bias-correct's criterion, in place of a fixed FP32 cosine: with int8 weights, the rewritten model's
    output cosine (against the FP32 original) must not fall below the original's with int8 weights.

    Why: the correction moves the FP32 model on purpose, by the mean of the int8 weights' error; what
    it promises is the int8 side. The FP32 change stays in the proof (cosine, max_abs) for the record.
    """
    kw: dict[str, Any] = {"calib": calib, "limit": limit, "approximate": ["int8 weights"], "runner": runner}
    before = {o.output: o.cosine for o in prove(original, with_int8_weights(original), **kw).outputs}
    after = {o.output: o.cosine for o in prove(original, with_int8_weights(rewritten), **kw).outputs}
    for o in proof.outputs:
        b, a = before.get(o.output, math.nan), after.get(o.output, math.nan)
        o.threshold = (f"bias-correct: FP32 change reported; int8-weight output cosine {b:.6f} -> {a:.6f} "
                       "must not drop")
        o.passed = bool(a >= b) and not o.note


def _site_figures(
    before: onnx.ModelProto, result: RewriteResult, calib: CalibSet, *, limit: int | None, runner: Runner
) -> None:
    """Append to each bias-correct change the measured figures at the layer's output (SQNR vs the FP32
    input model): the FP32 change the correction makes, and the error with int8 weights before/after."""
    folded = fold_batchnorm(before).model
    index = GraphIndex(result.model.graph, ir_version=result.model.ir_version)
    layers = {node_label(n): linear_of(n, index) for n in index.nodes if n.op_type in WEIGHT_OPS}
    sites = {label: layer.output for label, layer in layers.items() if isinstance(layer, Linear)}
    tests = {"fp32": result.model, "before": with_int8_weights(folded), "after": with_int8_weights(result.model)}
    wanted = {sites[c.node] for c in result.changes if c.rewrite == "bias-correct" and c.node in sites}
    got = tensor_sqnr(folded, tests, sorted(wanted), calib, limit=limit, runner=runner)
    for c in result.changes:
        t = sites.get(c.node)
        if c.rewrite == "bias-correct" and t is not None:
            c.detail += (f"; at {t!r}: FP32 change SQNR {got['fp32'][t]:.1f} dB, int8-weight SQNR "
                         f"{got['before'][t]:.1f} -> {got['after'][t]:.1f} dB")


def _smallest_exact_mask(
    model: onnx.ModelProto,
    *,
    calib: CalibSet | None,
    seed: int,
    limit: int | None,
    tolerance: float,
    runner: Runner | None,
) -> float:
    """The clamp value to write: the first candidate whose clamped model proves exact against `model`.

    Proven on the same data as the final proof, so a model whose scores span more than a candidate
    allows falls through to the next (larger) value, and to `CLAMP_VALUE` last.
    """
    for value in CLAMP_CANDIDATES:
        trial = clamp_mask(model, value)
        if not trial.changes:
            return CLAMP_VALUE
        proof = prove(model, trial.model, calib=calib, seed=seed, limit=limit, tolerance=tolerance,
                      approximate=[], runner=runner)
        if proof.passed:
            return value
    return CLAMP_VALUE


def _steps(
    rewrites: Sequence[str], dims: Sequence[str], *, opset_only: bool = False, freeze: Sequence[str] = ()
) -> list[tuple[RewriteId, tuple[str, ...]]]:
    """The requested ids, typed and validated, each with its settings (fix-dim's dims first if implied,
    then freeze-input's settings: folding an If on a shape needs the dims fixed)."""
    known = rewrite_ids()
    steps: list[tuple[RewriteId, tuple[str, ...]]] = []
    settings: dict[RewriteId, tuple[str, ...]] = {RewriteId.FIX_DIM: tuple(dims), RewriteId.FREEZE_INPUT: tuple(freeze)}
    for rid in rewrites:
        if rid not in known:
            raise UsageError(f"unknown rewrite {rid!r}: expected one of {', '.join(known)}")
        typed = RewriteId(rid)
        steps.append((typed, settings.get(typed, ())))
    for d in dims:
        parse_dim_spec(d)  # syntax errors before any work
    for f in freeze:
        parse_freeze_spec(f)
    if dims and "fix-dim" not in rewrites:
        steps.insert(0, (RewriteId.FIX_DIM, tuple(dims)))
    if freeze and "freeze-input" not in rewrites:
        after_dims = [k + 1 for k, (rid, _) in enumerate(steps) if rid is RewriteId.FIX_DIM]
        steps.insert(after_dims[0] if after_dims else 0, (RewriteId.FREEZE_INPUT, tuple(freeze)))
    if any(rid is RewriteId.FREEZE_INPUT for rid, _ in steps) and not freeze:
        raise UsageError("freeze-input: expected at least one NAME=VALUE")
    if any(rid is RewriteId.FIX_DIM for rid, _ in steps) and not dims:
        raise UsageError("fix-dim: expected at least one dimension (INPUT:AXIS=V, DIMPARAM=V or batch=V)")
    if not steps and not opset_only:
        raise UsageError(f"no rewrite requested: expected one or more of {', '.join(known)}")
    return steps


def _opset_down(model: onnx.ModelProto, target: int, steps: list[StepReport]) -> onnx.ModelProto:
    """Lower the opset last (the other rewrites may need the newer one), or say which ops block it.

    Blocked, it is one more pass that applies nowhere: skipped with its reason when another pass
    changed the model (a valid Loop-decoder model still gets its fix-dim and div-to-mul), a refusal when
    it was the only one that could have (the `_apply_steps` rule for every pass)."""
    result = opset_down(model, target)
    noop = ""
    if not result.changes:
        blockers = sorted({r.reason for r in result.refusals})
        shown = "; ".join(blockers[:5]) + (f" (and {len(blockers) - 5} more)" if len(blockers) > 5 else "")
        noop = f"--opset {target}: cannot lower the model's opset {onnx_opset(model)}: {shown}"
        if not any(s.changes for s in steps):
            raise UsageError(noop)
    steps.append(StepReport(RewriteId.OPSET_DOWN.value, result.exact, result.changes, result.refusals, noop))
    return result.model


def _applied_nowhere(rid: str, result: RewriteResult) -> str:
    if not result.refusals:
        return f"rewrite {rid} applied nowhere: the model has nothing it rewrites"
    reasons = "; ".join(f"{r.node}: {r.reason}" for r in result.refusals[:5])
    more = f" (and {len(result.refusals) - 5} more)" if len(result.refusals) > 5 else ""
    return f"rewrite {rid} applied nowhere: {reasons}{more}"


def _load(model: str | Path | onnx.ModelProto) -> tuple[str, onnx.ModelProto]:
    if isinstance(model, onnx.ModelProto):
        return "<in-memory model>", model
    loaded = load_model(model)
    ensure_not_quantized(loaded.proto, loaded.path.name)
    return str(loaded.path), loaded.proto


RECORD_KEYS = ("source", "steps", "proof")
"""Keys every OUT.rewrite.json has: a JSON file with them is a record quantscan wrote."""


def is_rewrite_output(path: Path) -> bool:
    """A model `rewrite` wrote: its OUT.rewrite.json record is beside it (the model keeps its own
    producer_name: a rewrite is still the user's model, for the vendor's tools), or quantscan made it."""
    return (is_quantscan_json(path.with_name(path.name + ".rewrite.json"), RECORD_KEYS)
            or is_quantscan_onnx(path))


def _out_path(model: str | Path | onnx.ModelProto, out: str | Path | None, force: bool) -> Path | None:
    """Where to write: `out`, refused when it is the input, or a file (or record) quantscan did not write
    unless `force`; else a fresh versioned name beside the input."""
    src = None if isinstance(model, onnx.ModelProto) else Path(model)
    if out is not None:
        target = Path(out)
        if not target.name or target.is_dir():
            raise UsageError(f"-o: expected a file path for the model, found a folder at {out or '.'}")
        if src is not None and (
            target.resolve() == src.resolve() or (target.exists() and os.path.samefile(target, src))
        ):
            raise UsageError(
                f"-o: expected a path other than the input model, found the input itself ({src})"
            )
        record = target.with_name(target.name + ".rewrite.json")
        refuse_inputs([record], [src], "-o")
        refuse_foreign_overwrite(target, "-o", is_rewrite_output, force)
        refuse_foreign_overwrite(record, "-o", lambda p: is_quantscan_json(p, RECORD_KEYS), force)
        return target
    if src is None:
        return None
    base = src.with_name(f"{src.stem}.rewritten.onnx")
    k = 0
    candidate = base
    while candidate.exists():
        k += 1
        candidate = src.with_name(f"{src.stem}.rewritten.{k}.onnx")
    return candidate


def op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(sorted(Counter(n.op_type for n in model.graph.node).items()))


# --- the proof --------------------------------------------------------------------------------------


def prove(
    original: onnx.ModelProto,
    rewritten: onnx.ModelProto,
    *,
    calib: CalibSet | None = None,
    seed: int = 0,
    limit: int | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    approx_min_cosine: float = DEFAULT_APPROX_MIN_COSINE,
    approximate: Sequence[str] = (),
    runner: Runner | None = None,
    frozen: dict[str, np.ndarray] | None = None,
) -> Proof:
    """Run both models on the same samples and hold every output to the exact or approximate criterion.

    `frozen` inputs (freeze-input) take their frozen value in every sample; the frozen model has no
    such input and the session drops the feed.
    """
    runner = runner or Runner()
    a = runner.session(original)
    b = runner.session(rewritten, built=True)  # a graph quantscan built: rejected = our bug (exit 3)
    names = list(a.output_names)
    b_names = set(b.output_names)
    common = [n for n in names if n in b_names]
    data, samples = _proof_samples(original, rewritten, calib, seed, limit, frozen)
    sums = _OutputSums(common)
    count = 0
    for sample in samples:
        if limit is not None and count >= limit:
            break
        sample = {**sample, **(frozen or {})}
        sums.update(a.run(sample, common), b.run(sample, common))
        count += 1
    exact = not approximate
    results = [
        _output_proof(n, sums, exact, tolerance, approx_min_cosine, approximate) if n in b_names
        else OutputProof(n, math.nan, math.nan, math.nan, math.nan, "output present", False,
                         note="the rewritten model has no output of this name")
        for n in names
    ]
    return Proof(
        f"{data}, {count} samples", count, exact, tolerance, approx_min_cosine, results, list(approximate)
    )


def _proof_samples(
    original: onnx.ModelProto, rewritten: onnx.ModelProto, calib: CalibSet | None, seed: int, limit: int | None,
    frozen: dict[str, np.ndarray] | None,
) -> tuple[str, Iterable[dict[str, np.ndarray]]]:
    """What the proof runs on, said in words: the calibration set, else seeded random data."""
    if calib is not None:
        return f"calibration set {calib.source}", calib.samples()
    data = f"seeded random data (seed {seed}): no calibration set given"
    if frozen:
        data += f"; frozen inputs fed their value ({', '.join(sorted(frozen))})"
    return data, random_samples(graph_inputs(original), graph_inputs(rewritten), seed, limit or RANDOM_SAMPLES)


class _OutputSums:
    """Per output: the error between the two models and the original's finite range."""

    def __init__(self, names: Sequence[str]) -> None:
        self.accs = {n: ErrorAccumulator() for n in names}
        self.lo = {n: math.inf for n in names}
        self.hi = {n: -math.inf for n in names}

    def update(self, ra: Mapping[str, np.ndarray], rb: Mapping[str, np.ndarray]) -> None:
        for n, acc in self.accs.items():
            x = np.asarray(ra[n])
            acc.update(x[None] if x.ndim == 0 else x, np.asarray(rb[n])[None] if x.ndim == 0 else rb[n])
            if np.issubdtype(x.dtype, np.number) and x.size:
                finite = x[np.isfinite(x)] if np.issubdtype(x.dtype, np.floating) else x
                if finite.size:
                    self.lo[n] = min(self.lo[n], float(finite.min()))
                    self.hi[n] = max(self.hi[n], float(finite.max()))


def _output_proof(
    n: str, sums: _OutputSums, exact: bool, tolerance: float, approx_min_cosine: float, approximate: Sequence[str],
) -> OutputProof:
    """One output held to the exact criterion (max_abs within `tolerance` x its range) or, after an
    approximate rewrite, to the cosine floor; new non-finite values fail either."""
    acc, lo, hi = sums.accs[n], sums.lo[n], sums.hi[n]
    rng = hi - lo if hi >= lo else 0.0
    scale = rng if rng > 0 else max(abs(lo), abs(hi), 0.0) if math.isfinite(lo) else 0.0
    max_abs = acc.max_abs if acc.count else 0.0
    max_rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    new_nonfinite = acc.nonfinite_test > acc.nonfinite_ref
    if exact:
        limit_abs = tolerance * scale
        passed = max_abs <= limit_abs and not new_nonfinite
        threshold = f"exact: max_abs <= {tolerance:g} x output range = {limit_abs:.3g}"
    else:
        passed = acc.cosine >= approx_min_cosine and not new_nonfinite
        threshold = f"approximate ({', '.join(approximate)}): cosine >= {approx_min_cosine:g}"
    return OutputProof(n, acc.cosine, max_abs, max_rel, rng, threshold, passed, acc.nonfinite_ref,
                       acc.nonfinite_test, "non-finite values appeared" if new_nonfinite else "")
