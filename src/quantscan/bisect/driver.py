"""The bisection driver: output gain, then the resumable search to a target, then the plan files.

`run_bisect` loads and identifies the model and data (a wrong session is refused before any long
work), computes the output gain of every site (gain.py), stores a session (bisect/session.py),
feeds measured values to the pure state machine (bisect/state.py) until it ends, and builds and
writes the plan (bisect/plan.py). The session file is rewritten atomically after the gains and
after every step, so a kill or Ctrl-C loses at most the step in flight.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import pandas as pd

from quantscan.bisect.plan import REACHED, build_plan, write_plan
from quantscan.bisect.session import Session, calibration_identity, machine_for
from quantscan.bisect.state import (
    FALLBACKS,
    MODES,
    Bisector,
    Outcome,
    SessionFileError,
    Step,
    StepCallback,
    Target,
)
from quantscan.bisect.targets import gain_key, make_evaluator, parse_target
from quantscan.calib import CalibSet, load_calibration
from quantscan.calib.state import state_consts
from quantscan.errors import UsageError
from quantscan.gain import Evaluator, GainResult, MixedBuilder, compute_gain, sensitivity_order
from quantscan.graph.subgraphs import unquantized_warning
from quantscan.model import LoadedModel, load_model
from quantscan.records import Plan
from quantscan.runfolder import jsonable, save_model
from quantscan.runner import Runner
from quantscan.scanning.options import ProgressFactory, no_progress
from quantscan.scanning.prepare import ScanContext, given_input_specs, prepare_scan


@dataclass
class BisectResult:
    """What `run_bisect` found. `reached` False means exit code 1 for the CLI (no plan meets the target)."""

    plan: Plan
    gains: pd.DataFrame
    steps: list[Step]
    outcome: Outcome
    session_path: Path | None
    qdq_model: onnx.ModelProto | None
    files: dict[str, Path]
    warnings: list[str]

    @property
    def reached(self) -> bool:
        return self.outcome.status in REACHED


SCAN_OPTION_KEYS = (
    "calib_method",
    "activations",
    "input_shape",
    "const",
    "limit",
    "eval",
    "output",
    "preprocess",
    "preprocess_overrides",
    "threads",
    "seed",
    "batch_size",
    "task",
    "charset",
    "mask_threshold",
    "max_memory",
)
"""Scan options a session records: a resume must measure exactly what the first run measured."""


def target_from_flags(
    target_cosine: float | None = None,
    target_sqnr: float | None = None,
    target_top1: float | None = None,
    target: str | None = None,
) -> Target:
    """One target: `--target METRIC=VALUE` (any metric, bisect/targets.py) or one of the older flags."""
    given = [
        (m, v)
        for m, v in (("cosine", target_cosine), ("sqnr", target_sqnr), ("top1", target_top1))
        if v is not None
    ]
    if len(given) + (target is not None) != 1:
        raise UsageError(
            "bisect: expected exactly one of --target METRIC=VALUE, --target-cosine, --target-sqnr, "
            f"--target-top1, found {len(given) + (target is not None) or 'none'}"
        )
    return parse_target(target) if target is not None else Target(given[0][0], float(given[0][1]))


def run_bisect(
    model: str | Path | None = None,
    calib: str | Path | None = None,
    *,
    target_cosine: float | None = None,
    target_sqnr: float | None = None,
    target_top1: float | None = None,
    target: str | None = None,
    fallback: str = "float",
    mode: str = "search",
    session: str | Path | None = None,
    resume: str | Path | None = None,
    keep_float: Sequence[str] = (),
    force_quant: Sequence[str] = (),
    loss_if_only: bool = False,
    out: str | Path | None = None,
    save_qdq: str | Path | None = None,
    exports: Sequence[str] | None = None,
    progress: ProgressFactory = no_progress,
    on_step: StepCallback | None = None,
    runner: Runner | None = None,
    **options: Any,
) -> BisectResult:
    """Output gain, then a resumable bisection to the target; writes plan files when `out` is given.

    New run: `model`, `calib`, one `target_*`. Resume: `resume=FILE` (model/calib default to the
    session's; options come from the session). The session file is rewritten atomically after the
    gains and after every step, so a kill or Ctrl-C (KeyboardInterrupt propagates) loses at most the
    step in flight.
    """
    started = time.perf_counter()
    stored, session_path = _open_session(resume, session, out)
    if stored is not None:
        model = model or stored.model_path
        calib = calib or stored.calibration["path"]
        options = {
            **stored.options.get("scan", {}),
            "threads": options.get("threads", stored.options["scan"].get("threads")),
            "force": bool(options.get("force", False)),  # this run's --force, not the stored one's
        }
        fallback, mode = str(stored.options["fallback"]), str(stored.options.get("mode", "search"))
        loss_if_only = bool(stored.options.get("loss_if_only", False))
    if model is None or calib is None:
        raise UsageError("bisect: expected MODEL and --calib DIR (or --resume FILE)")
    if fallback not in FALLBACKS or mode not in MODES:
        raise UsageError(
            f"bisect: expected --fallback float|int16 and mode search|first_bad, found {fallback}, {mode}"
        )
    loaded, cset, identity = _load_inputs(model, calib, options, stored)
    ctx = prepare_scan(loaded, cset, progress=progress, runner=runner, **options)
    _refuse_unanalysed_bodies(ctx)
    aim = (
        Target(
            str(stored.options["target_metric"]),
            float(stored.options["target_value"]),
            stored.options.get("output"),
        )
        if stored is not None
        else target_from_flags(target_cosine, target_sqnr, target_top1, target)
    )
    builder = MixedBuilder(ctx, fallback)
    evaluator = make_evaluator(ctx, builder, aim)
    if stored is None:
        gains = (
            None
            if mode == "first_bad"
            else compute_gain(ctx, builder, key=gain_key(aim), loss_if_only=loss_if_only, progress=progress)
        )
        stored = _new_session(
            ctx,
            loaded,
            identity,
            aim,
            fallback,
            mode,
            loss_if_only,
            keep_float,
            force_quant,
            options,
            gains,
        )
        keep_float, force_quant = (), ()
    machine = machine_for(stored)
    if keep_float or force_quant:
        machine.mark(keep_float, force_quant)
        stored.events = list(machine.events)
    _save(stored, session_path, machine)
    _drive(machine, builder, evaluator, stored, session_path, progress, on_step)
    return _finish(
        ctx,
        builder,
        machine,
        stored,
        session_path,
        aim,
        out,
        save_qdq,
        exports,
        time.perf_counter() - started,
    )


def _open_session(
    resume: str | Path | None, session: str | Path | None, out: str | Path | None
) -> tuple[Session | None, Path | None]:
    if resume is not None:
        return Session.load(resume), Path(resume)
    path = Path(session) if session is not None else (Path(out) / "session.json" if out is not None else None)
    if session is not None and path is not None and path.exists():
        raise SessionFileError(f"session file {path} already exists: continue it with --resume {path}")
    return None, path


def _refuse_unanalysed_bodies(ctx: ScanContext) -> None:
    """A model with float nodes inside If/Loop/Scan bodies cannot be bisected honestly: all-int8 would
    leave them float and could report the target "already met" with nothing quantized."""
    warning = unquantized_warning(ctx.prepared.proto)
    if warning is not None:
        raise UsageError(f"bisect: expected every quantization site analysed, found {warning}")


def _load_inputs(
    model: str | Path, calib: str | Path, options: Mapping[str, Any], stored: Session | None
) -> tuple[LoadedModel, CalibSet, dict[str, Any]]:
    """Load and identify model and data first, so a wrong session is refused before any long work."""
    loaded = load_model(model)
    if stored is not None:
        stored.check_model(loaded.sha256, model)
    cset = load_calibration(
        calib,
        given_input_specs(loaded.inputs, options.get("input_shape") or {}, options.get("input_dims") or ()),
        preprocess=options.get("preprocess"),
        overrides=options.get("preprocess_overrides") or {},
        consts=state_consts(options.get("state") or {}, options.get("const") or {}),
        limit=options.get("limit"),
    )
    identity = calibration_identity(cset.source, cset.files, cset.n_samples)
    if stored is not None:
        stored.check_calibration(identity)
    return loaded, cset, identity


def _new_session(
    ctx: ScanContext,
    loaded: LoadedModel,
    identity: dict[str, Any],
    target: Target,
    fallback: str,
    mode: str,
    loss_if_only: bool,
    keep_float: Sequence[str],
    force_quant: Sequence[str],
    options: Mapping[str, Any],
    gains: GainResult | None,
) -> Session:
    outputs = ctx.headline_outputs()
    scan_opts = {k: jsonable(v) for k, v in options.items() if k in SCAN_OPTION_KEYS}
    sites = [
        {
            "node": s.node,
            "output": s.output,
            "order": ctx.order.get(s.node, k),
            "op_type": s.op_type,
            "kernel": s.kernel,
        }
        for k, s in enumerate(ctx.sites)
    ]
    order = (
        sensitivity_order(gains.table, gain_key(target))
        if gains is not None
        else [str(s["node"]) for s in sorted(sites, key=lambda s: int(str(s["order"])))]
    )
    opts = {
        "target_metric": target.metric,
        "target_value": target.value,
        "output": outputs[0] if len(outputs) == 1 else ",".join(outputs),
        "fallback": fallback,
        "mode": mode,
        "loss_if_only": loss_if_only,
        "keep_float": list(keep_float),
        "force_quant": list(force_quant),
        "scan": scan_opts,
    }
    gain_rows = gains.table.to_dict("records") if gains is not None else []
    session = Session(str(loaded.path.resolve()), loaded.sha256, identity, opts, sites, order, gain_rows)
    if gains is not None:
        session.options["gain_seconds"] = round(gains.seconds, 4)
        session.options["gain_work_ratio"] = round(gains.work_ratio, 4)
    return session


def _save(session: Session, path: Path | None, machine: Bisector) -> None:
    session.events = list(machine.events)
    session.status = machine.outcome.status if machine.outcome is not None else "running"
    if path is not None:
        session.save(path)


def _drive(
    machine: Bisector,
    builder: MixedBuilder,
    evaluator: Evaluator,
    session: Session,
    path: Path | None,
    progress: ProgressFactory,
    on_step: StepCallback | None,
) -> None:
    bar = progress("bisecting", None)
    try:
        while (cand := machine.next()) is not None:
            t0 = time.perf_counter()
            measured = evaluator.evaluate(builder.precisions(cand.sites))
            metrics = {k: v for k, v in measured.worst.items() if isinstance(v, float)}
            step = machine.record(
                measured.worst[evaluator.key], seconds=time.perf_counter() - t0, metrics=metrics
            )
            _save(session, path, machine)
            bar.update(1)
            if on_step is not None:
                on_step(step, machine)
    finally:
        bar.close()


def _finish(
    ctx: ScanContext,
    builder: MixedBuilder,
    machine: Bisector,
    session: Session,
    path: Path | None,
    target: Target,
    out: str | Path | None,
    save_qdq: str | Path | None,
    exports: Sequence[str] | None,
    seconds: float,
) -> BisectResult:
    outcome = machine.outcome
    assert outcome is not None
    steps = [e for e in machine.events if isinstance(e, Step)]
    chosen = set(outcome.sites) if outcome.status in ("reached", "already_met") else set()
    chosen |= machine.keep_float if outcome.status == "already_met" else set()
    prec = builder.precisions(chosen)
    plan = build_plan(ctx, builder, machine, session, target, prec, steps, seconds)
    qdq = builder.model(prec)
    files: dict[str, Path] = {}
    if save_qdq is not None:
        files["qdq"] = save_model(qdq, Path(save_qdq), protect=[ctx.loaded.path], flag="--save-qdq",
                                  force=ctx.opts.force)
    if out is not None:
        files.update(write_plan(plan, session, Path(out), exports, ctx.loaded.proto))
    return BisectResult(
        plan, pd.DataFrame(session.gain), steps, outcome, path, qdq, files, list(ctx.warnings)
    )


@dataclass(frozen=True)
class Progress:
    """Where a bisection stands: evaluations done, the best passing set so far, what is likely left.

    The estimate follows the search's phases (bisect/state.py): the two bounds, ⌈log2 n⌉ prefix steps,
    then about one evaluation per member of the best set for reduce/prune; the seconds are that count
    times the mean evaluation so far. An estimate, said as one ("about").
    """

    evaluations: int
    best_sites: int | None
    best_value: float | None
    left: int
    seconds_left: float | None

    def line(self) -> str:
        """One status line for the CLI."""
        best = (f"best so far {self.best_sites} float sites at {self.best_value:.5f}"
                if self.best_sites is not None and self.best_value is not None else "no passing set yet")
        eta = f", ~{_duration(self.seconds_left)}" if self.seconds_left is not None and self.left else ""
        return f"{self.evaluations} evaluations done; {best}; about {self.left} left{eta}"


def progress_of(machine: Bisector) -> Progress:
    """The machine's progress, from its measured steps and its pending candidate's phase."""
    steps = machine.steps
    passing = [s for s in steps if s.passed]
    best = min(passing, key=lambda s: (len(s.sites), -s.value)) if passing else None
    free = [n for n in machine.order if n not in machine.keep_float and n not in machine.force_quant]
    log = math.ceil(math.log2(max(len(free), 2)))
    size = len(best.sites) if best is not None else log
    pending = machine.next()
    phase = pending.phase if pending is not None else None
    in_phase = sum(1 for s in steps if s.phase == phase)
    left = {
        None: 0,
        "all_float": 2 + log + size,
        "all_int8": 1 + log + size,
        "search": max(1, log - in_phase) + size,
        "reduce": 2 * size,
        "prune": max(1, machine.prune_left),
        "first_bad": max(1, log - in_phase),
    }.get(phase, size)
    timed = [s.seconds for s in steps if s.seconds > 0]
    seconds = left * sum(timed) / len(timed) if timed else None
    return Progress(len(steps), len(best.sites) if best else None, best.value if best else None, left, seconds)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"



