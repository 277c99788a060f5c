"""The rewrite runner (`quantscan rewrite`): the id -> pass registry, passes applied in order, the numeric proof.

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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from quantscan.calib import CalibSet
from quantscan.calib.synthetic import random_samples
from quantscan.errors import UsageError
from quantscan.metrics import ErrorAccumulator
from quantscan.model import graph_inputs, load_model, onnx_opset, upgrade_opset
from quantscan.records import RewriteId
from quantscan.rewrites.base import Change, Refusal, RewriteResult
from quantscan.rewrites.clamp_mask import CLAMP_CANDIDATES, CLAMP_VALUE, clamp_mask
from quantscan.rewrites.cleanup import cleanup
from quantscan.rewrites.decompose_hardsigmoid import decompose_hardsigmoid
from quantscan.rewrites.decompose_hardswish import decompose_hardswish
from quantscan.rewrites.decompose_layernorm import decompose_layernorm
from quantscan.rewrites.div_to_mul import div_to_mul
from quantscan.rewrites.fix_ceil_mode import fix_ceil_mode
from quantscan.rewrites.fix_dim import fix_dim as fix_dims
from quantscan.rewrites.fix_dim import parse_dim_spec
from quantscan.rewrites.fold_bn import fold_batchnorm
from quantscan.rewrites.freeze_input import freeze_input as freeze_inputs
from quantscan.rewrites.freeze_input import frozen_values, parse_freeze_spec
from quantscan.rewrites.fuse_hardswish import fuse_hardswish
from quantscan.rewrites.fuse_layernorm import fuse_layernorm
from quantscan.rewrites.gelu_tanh import gelu_tanh
from quantscan.rewrites.opset_down import opset_down
from quantscan.rewrites.reciprocal_to_div import reciprocal_to_div
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
    RewriteId.GELU_TANH: gelu_tanh,
    RewriteId.CLAMP_MASK: clamp_mask,
    RewriteId.DIV_TO_MUL: div_to_mul,
    RewriteId.FIX_CEIL_MODE: fix_ceil_mode,
    RewriteId.RECIPROCAL: reciprocal_to_div,
}
"""Rewrite id -> pass. `fix-dim` takes dimension settings and is requested as `fix-dim` + `fix_dim=`."""

PARAMETRIZED: tuple[RewriteId, ...] = (RewriteId.FIX_DIM, RewriteId.FREEZE_INPUT)
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
) -> RewriteReport:
    """Apply `rewrites` (ids from `rewrite_ids()`) in order, prove the result, write it when it passes.

    `fix_dim` holds the dimension settings of `fix-dim` (contract syntax); giving them without listing
    `fix-dim` applies it first. An `opset` above the model's converts it first (fusions may need
    the newer ops); one below lowers it last with `opset-down` (decompositions must run while their ops
    exist), refusing with the ops that block it. Without `out`, a model given by path is written beside
    itself as `<stem>.rewritten.onnx` (then `.rewritten.1.onnx`, ...); `write=False` only proves.
    Raises UsageError for unknown ids, bad dimension syntax, `out` equal to the input, a requested
    rewrite that applied nowhere (the error lists why, from the refusals) and an opset it cannot lower.
    `clamp_mask_value` is the finite value `clamp-mask` writes; without one, the smallest magnitude of
    `CLAMP_CANDIDATES` whose proof is exact on the same data is chosen (else `CLAMP_VALUE`).
    `freeze_input` holds `NAME=VALUE` settings (`freeze-input`, applied right after fix-dim); the proof
    feeds the original model VALUE for NAME on every sample.
    """
    steps_wanted = _steps(rewrites, fix_dim, opset_only=opset is not None, freeze=freeze_input)
    source, original = _load(model)
    frozen = frozen_values(original, list(freeze_input)) if freeze_input else {}
    out_path = _out_path(model, out, force) if write else None

    current = original
    steps: list[StepReport] = []
    opset_before = onnx_opset(original)
    if opset is not None and opset > opset_before:
        current = upgrade_opset(current, opset)
        change = Change("opset", "", f"opset {opset_before} -> {opset} (onnx.version_converter)")
        steps.append(StepReport("opset", True, [change], []))
    for rid, args in steps_wanted:
        if rid is RewriteId.FIX_DIM:
            result = fix_dims(current, args)
        elif rid is RewriteId.FREEZE_INPUT:
            result = freeze_inputs(current, args)
        elif rid is RewriteId.CLAMP_MASK:
            value = clamp_mask_value
            if value is None:
                value = _smallest_exact_mask(current, calib=calib, seed=seed, limit=limit, tolerance=tolerance,
                                             runner=runner)
            result = clamp_mask(current, value)
        else:
            result = REWRITES[rid](current)
        steps.append(StepReport(rid.value, result.exact, result.changes, result.refusals))
        if not result.changes:
            raise UsageError(_applied_nowhere(rid, result))
        current = result.model
    if opset is not None and opset < opset_before:
        current = _opset_down(current, opset, steps)
    onnx.checker.check_model(current)

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
    report = RewriteReport(
        source=source,
        model=current,
        steps=steps,
        op_counts_before=_op_counts(original),
        op_counts_after=_op_counts(current),
        opset_before=opset_before,
        opset_after=onnx_opset(current),
        proof=proof,
        out=out_path,
        forced=force and not proof.passed,
    )
    if out_path is not None and (proof.passed or force):
        report.written = True
        atomic_write_bytes(out_path, current.SerializeToString())
        atomic_write_bytes(
            out_path.with_name(out_path.name + ".rewrite.json"),
            (json.dumps(report.to_json(), indent=1, allow_nan=False) + "\n").encode(),
        )
    return report


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
    settings = {RewriteId.FIX_DIM: tuple(dims), RewriteId.FREEZE_INPUT: tuple(freeze)}
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
    """Lower the opset last (the other rewrites may need the newer one), or say which ops block it."""
    result = opset_down(model, target)
    steps.append(StepReport(RewriteId.OPSET_DOWN.value, result.exact, result.changes, result.refusals))
    if not result.changes:
        blockers = sorted({r.reason for r in result.refusals})
        shown = "; ".join(blockers[:5]) + (f" (and {len(blockers) - 5} more)" if len(blockers) > 5 else "")
        raise UsageError(f"--opset {target}: cannot lower the model's opset {onnx_opset(model)}: {shown}")
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


def _op_counts(model: onnx.ModelProto) -> dict[str, int]:
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
    accs = {n: ErrorAccumulator() for n in common}
    lo = {n: math.inf for n in common}
    hi = {n: -math.inf for n in common}
    if calib is not None:
        data = f"calibration set {calib.source}"
        samples: Iterable[dict[str, np.ndarray]] = calib.samples()
    else:
        data = f"seeded random data (seed {seed}): no calibration set given"
        if frozen:
            data += f"; frozen inputs fed their value ({', '.join(sorted(frozen))})"
        samples = random_samples(
            graph_inputs(original), graph_inputs(rewritten), seed, limit or RANDOM_SAMPLES
        )
    count = 0
    for sample in samples:
        if limit is not None and count >= limit:
            break
        sample = {**sample, **(frozen or {})}
        ra = a.run(sample, common)
        rb = b.run(sample, common)
        for n in common:
            x = np.asarray(ra[n])
            accs[n].update(x[None] if x.ndim == 0 else x, np.asarray(rb[n])[None] if x.ndim == 0 else rb[n])
            if np.issubdtype(x.dtype, np.number) and x.size:
                finite = x[np.isfinite(x)] if np.issubdtype(x.dtype, np.floating) else x
                if finite.size:
                    lo[n] = min(lo[n], float(finite.min()))
                    hi[n] = max(hi[n], float(finite.max()))
        count += 1
    exact = not approximate
    results: list[OutputProof] = []
    for n in names:
        if n not in b_names:
            results.append(
                OutputProof(
                    n,
                    math.nan,
                    math.nan,
                    math.nan,
                    math.nan,
                    "output present",
                    False,
                    note="the rewritten model has no output of this name",
                )
            )
            continue
        acc = accs[n]
        rng = hi[n] - lo[n] if hi[n] >= lo[n] else 0.0
        scale = rng if rng > 0 else max(abs(lo[n]), abs(hi[n]), 0.0) if math.isfinite(lo[n]) else 0.0
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
        results.append(
            OutputProof(
                n,
                acc.cosine,
                max_abs,
                max_rel,
                rng,
                threshold,
                passed,
                acc.nonfinite_ref,
                acc.nonfinite_test,
                "non-finite values appeared" if new_nonfinite else "",
            )
        )
    return Proof(
        f"{data}, {count} samples", count, exact, tolerance, approx_min_cosine, results, list(approximate)
    )
