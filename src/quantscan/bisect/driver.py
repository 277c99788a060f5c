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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx
import pandas as pd

from quantscan.bisect.alternatives import measure_alternatives
from quantscan.bisect.batch import HereRound, SimulationRound, ToolchainRound, spare_of
from quantscan.bisect.external import BuildPool, Toolchain, ToolchainEvaluator, ToolchainFactory
from quantscan.bisect.external import verify as verify_plan
from quantscan.bisect.objective import MISSED_WITHIN_BUDGET, Choice, Objective, rechoose, require_cost, with_objective
from quantscan.bisect.plan import SummaryBlock, board_shapes, build_plan, held_out_warning, write_plan
from quantscan.bisect.realise import Judged, RealisedEvaluator, SampleSplit, held_out_claims, split_context
from quantscan.bisect.robust import DEFAULT_REALISATIONS, DEFAULT_SPREAD, DEFAULT_Z, Rounding
from quantscan.bisect.session import BisectSession, calibration_identity, machine_for
from quantscan.bisect.speculate import Measure, Spare, SpeculativeFeed
from quantscan.bisect.state import (
    BUDGET,
    FALLBACKS,
    METRICS,
    MODES,
    Bisector,
    Outcome,
    SessionFileError,
    Step,
    StepCallback,
    Target,
)
from quantscan.bisect.targets import gain_key, parse_target
from quantscan.bisect.verdict import Verdict, cannot_be_int8, cause_text
from quantscan.calib import CalibSet, load_calibration
from quantscan.calib.recurrent import state_consts
from quantscan.columns import Col
from quantscan.errors import UsageError
from quantscan.executors import Executor
from quantscan.graph.mixed import MixedBuilder
from quantscan.model import LoadedModel, load_model
from quantscan.records import Plan
from quantscan.runfolder import jsonable, save_model
from quantscan.runner import Runner
from quantscan.scanning.gain import GainResult, compute_gain, mixed_builder, sensitivity_order
from quantscan.scanning.options import MEASUREMENT_OPTIONS, ProgressFactory, ScanOptions, no_progress
from quantscan.scanning.prepare import ScanContext, prepare_scan
from quantscan.scanning.samples import given_input_specs
from quantscan.scanning.workers import ShardedCalibration, executor_for, needs_executor


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
        """The plan's verdict (bisect/verdict.py): met on the held-out samples, not only the searched ones."""
        return self.plan.reached


SCAN_OPTION_KEYS = MEASUREMENT_OPTIONS
"""Scan options a session records: a resume must measure exactly what the first run measured (the
profile too: without it a resumed `--profile rk3588` session measured its new steps with the default
scheme, and `--evaluator rknn` would not know the chip)."""


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


def bisect_model(
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
    summary_block: SummaryBlock | None = None,
    toolchain: ToolchainFactory | None = None,
    evaluator: str = "quantscan",
    verify: bool = False,
    realisations: int = DEFAULT_REALISATIONS,
    rounding_spread: float = DEFAULT_SPREAD,
    holdout: str = "interleave",
    bound_z: float = DEFAULT_Z,
    max_minutes: float | None = None,
    objective: str | None = None,
    max_extra_ms: float | None = None,
    **options: Any,
) -> BisectResult:
    """Output gain, then a resumable bisection to the target; writes plan files when `out` is given
    (and, with `summary_block`, puts the plan into a scan's summary.md there: `quantscan.api.run_bisect`).

    New run: `model`, `calib`, one `target_*`. Resume: `resume=FILE` (model/calib default to the
    session's; options come from the session). The session file is rewritten atomically after the
    gains and after every step, so a kill or Ctrl-C (KeyboardInterrupt propagates) loses at most the
    step in flight. `toolchain`, `evaluator`, `verify`: the vendor in the loop (`_toolchain_judge`).
    Rounding (issue 32): `_rounding`. `max_minutes`: a time budget from the start of this call; when it is
    spent the search stops after the step in flight and the plan is the smallest measured set that meets
    the target (status `budget`, resumable like an interrupted one).
    """
    started = time.perf_counter()
    deadline = _deadline(started, max_minutes)
    stored, session_path = _open_session(resume, session, out)
    _check_evaluator(stored, evaluator, toolchain is not None, verify)
    if stored is not None:
        model, calib, options, fallback, mode, loss_if_only = _as_stored(stored, model, calib, options)
    model, calib = _checked_request(model, calib, fallback, mode)
    loaded, cset, identity = _load_inputs(model, calib, options, stored)
    ctx = _prepare(loaded, cset, calib, progress, runner, options)
    aim_of = _objective_of(stored, objective, max_extra_ms, ctx)
    aim = _stored_target(stored) or target_from_flags(target_cosine, target_sqnr, target_top1, target)
    rounding = _rounding(stored, Rounding(realisations, rounding_spread, int(options.get("seed") or 0), bound_z,
                                          holdout))
    split = split_context(ctx, rounding, bool(options.get("eval")))
    builder = mixed_builder(ctx, fallback)
    chain, judge = _toolchain_judge(split.search, builder, aim, rounding, (loaded, cset), toolchain, evaluator,
                                    verify)
    workers = int(options.get("workers") or 1)  # as asked: ctx.opts holds the processes pass 1 could use
    search_opts, builds = replace(ctx.opts, workers=workers), isinstance(judge, ToolchainEvaluator)
    executor = (executor_for(search_opts, builds=builds, tool=chain.tool if chain is not None else None)
                if needs_executor(search_opts, builds=builds) else None)
    if isinstance(judge, ToolchainEvaluator):
        judge.pool.executor = executor
    try:
        run = _Search(ctx, loaded, identity, aim, fallback, mode, loss_if_only, keep_float, force_quant, rounding,
                      split, builder, chain, judge, executor, evaluator, verify, workers, deadline)
        run.objective = aim_of
        return _search(run, stored, session_path, progress, on_step, out, save_qdq, exports, summary_block, started)
    finally:
        if executor is not None:
            executor.close()


@dataclass
class _Search:
    """What the search and the plan are made from (`bisect_model` prepares it, `_search` runs it)."""

    ctx: ScanContext
    loaded: LoadedModel
    identity: dict[str, Any]
    aim: Target
    fallback: str
    mode: str
    loss_if_only: bool
    keep_float: Sequence[str]
    force_quant: Sequence[str]
    rounding: Rounding
    split: SampleSplit
    builder: MixedBuilder
    chain: Toolchain | None
    judge: RealisedEvaluator | ToolchainEvaluator
    executor: Executor | None
    evaluator: str
    verify: bool
    workers: int
    deadline: float | None = None
    """time.perf_counter() value past which no new round starts (`--max-minutes`)."""
    objective: Objective | None = None
    """`--objective`/`--max-extra-ms`, recorded in a new session (a resumed one keeps its own)."""


def _search(run: _Search, stored: BisectSession | None, session_path: Path | None, progress: ProgressFactory,
            on_step: StepCallback | None, out: str | Path | None, save_qdq: str | Path | None,
            exports: Sequence[str] | None, summary_block: SummaryBlock | None, started: float) -> BisectResult:
    """Gains, session, the search in rounds (bisect/speculate.py), then the plan."""
    ctx, builder, judge, aim, split, chain = run.ctx, run.builder, run.judge, run.aim, run.split, run.chain
    keep_float, force_quant, mode = run.keep_float, run.force_quant, run.mode
    measured: dict[tuple[str, ...], tuple[Judged, float]] = {}
    if stored is None:
        met = mode == "search" and not keep_float and _all_int8_meets(judge, builder, aim, measured)
        if isinstance(judge, RealisedEvaluator):
            judge.release()  # its switchable session is rebuilt after the gain graph's session is gone
        gains = (
            None
            if mode == "first_bad" or met
            else compute_gain(split.search, builder, key=gain_key(aim), loss_if_only=run.loss_if_only,
                              progress=progress)
        )
        stored = _new_session(ctx, run.loaded, run.identity, aim, run.fallback, mode, run.loss_if_only, keep_float,
                              force_quant, gains, run.rounding)
        keep_float, force_quant, stored.options["evaluator"] = (), (), run.evaluator
        stored.options.update((run.objective or Objective()).as_dict())
    machine = machine_for(stored)
    if keep_float or force_quant:
        machine.mark(keep_float, force_quant)
        stored.events = list(machine.events)
    _save(stored, session_path, machine)
    feed = SpeculativeFeed(machine, _round_measure(run), _width(run))
    feed.spare.update({sites: spare_of(j, seconds) for sites, (j, seconds) in measured.items()})
    session = stored

    def noted(step: Step, machine: Bisector) -> None:
        _note_graph(session, judge)  # saved with the next step: a search stopped by a cap still says
        if on_step is not None:
            on_step(step, machine)

    _drive(feed, stored, session_path, progress, noted, run.deadline)
    if isinstance(judge, RealisedEvaluator):
        _note_graph(stored, judge)
        _save(stored, session_path, feed.machine, feed.spare)
        judge.release()
    pool = judge.pool if isinstance(judge, ToolchainEvaluator) else BuildPool(chain, run.executor) if chain else None
    result = _finish(ctx, builder, machine, stored, session_path, aim, out, save_qdq, exports,
                     time.perf_counter() - started, summary_block, (chain, run.verify, pool),
                     (split, run.rounding) if run.evaluator == "quantscan" else None, feed)
    if chain is not None:  # only after a finished search: an interrupted one resumes from step 1's files
        chain.close()
    return result


def _note_graph(session: BisectSession, judge: RealisedEvaluator | ToolchainEvaluator) -> None:
    """Which graph the search's evaluations ran on (bisect/switched.py), in session.json's options."""
    if isinstance(judge, RealisedEvaluator):
        session.options["evaluation_graph"] = judge.graph_note()
        session.options["evaluation_graph_timing"] = judge.graph_timing()


def _width(run: _Search) -> int:
    """How many candidates a round measures: `--workers` (toolchain builds: as many at once, in threads
    or Ray tasks; the simulation: the executor's workers, capped by the CPUs or the cluster)."""
    if run.executor is None:
        return 1
    return max(1, run.workers if isinstance(run.judge, ToolchainEvaluator) else run.executor.workers)


def _round_measure(run: _Search) -> Measure:
    """Who measures a round's candidates (bisect/batch.py)."""
    if isinstance(run.judge, ToolchainEvaluator):
        return ToolchainRound(run.judge, run.builder)
    if run.executor is None:
        return HereRound(run.judge, run.builder)
    return SimulationRound(run.executor, run.split.search, run.fallback, run.aim, run.rounding, run.judge,
                           run.builder)


def _checked_request(
    model: str | Path | None, calib: str | Path | None, fallback: str, mode: str
) -> tuple[str | Path, str | Path]:
    """Refuse a request that names no model or data, or an unknown fallback or mode, before any work."""
    if model is None or calib is None:
        raise UsageError("bisect: expected MODEL and --calib DIR (or --resume FILE)")
    if fallback not in FALLBACKS or mode not in MODES:
        raise UsageError(
            f"bisect: expected --fallback float|int16|int8 and mode search|first_bad, found {fallback}, {mode}"
        )
    return model, calib


def _toolchain_judge(
    ctx: ScanContext, builder: MixedBuilder, aim: Target, rounding: Rounding, data: tuple[LoadedModel, CalibSet],
    toolchain: ToolchainFactory | None, evaluator: str, verify: bool,
) -> tuple[Toolchain | None, RealisedEvaluator | ToolchainEvaluator]:
    """The vendor toolchain (bisect/external.py), made for this model and these very samples when
    `--verify` or a toolchain `--evaluator` needs it, and who measures the search's candidates: the
    toolchain (each evaluation one build in it; the session records which) or quantscan's simulation."""
    chain = toolchain(*data) if toolchain is not None and (verify or evaluator != "quantscan") else None
    if chain is None or evaluator == "quantscan":
        return chain, RealisedEvaluator(ctx, builder, aim, rounding, settle=True)  # realise.py `settle`
    return chain, ToolchainEvaluator(ctx, chain, aim.key)


def _check_evaluator(stored: BisectSession | None, evaluator: str, has_toolchain: bool, verify: bool) -> None:
    """A toolchain evaluator or --verify needs the toolchain; a session resumes with its own evaluator
    (its steps were measured by it: mixing two would compare two simulators' figures)."""
    if (evaluator != "quantscan" or verify) and not has_toolchain:
        raise UsageError(f"bisect: expected a toolchain for --evaluator {evaluator} / --verify, found none")
    if stored is not None and str(stored.options.get("evaluator", "quantscan")) != evaluator:
        raise SessionFileError(f"session was measured with --evaluator {stored.options.get('evaluator', 'quantscan')}"
                               f", found --evaluator {evaluator}: resume with the same evaluator")


def _prepare(loaded: LoadedModel, cset: CalibSet, calib: str | Path, progress: ProgressFactory,
             runner: Runner | None, options: Mapping[str, Any]) -> ScanContext:
    """Load-to-calibration; with `--executor`/`--workers` > 1, pass 1's sample shards go through the
    executor seam as the scan's do (the search's steps stay here: each depends on the one before)."""
    opts = ScanOptions(**options).validate()
    if not needs_executor(opts):
        return prepare_scan(loaded, cset, progress=progress, runner=runner, opts=opts)
    executor = executor_for(opts)
    opts = replace(opts, workers=executor.workers)
    try:
        return prepare_scan(loaded, cset, progress=progress, runner=runner, opts=opts,
                            calibrate_with=ShardedCalibration(executor, calib))
    finally:
        executor.close()


def _stored_target(stored: BisectSession | None) -> Target | None:
    if stored is None:
        return None
    return Target(str(stored.options["target_metric"]), float(stored.options["target_value"]),
                  stored.options.get(Col.OUTPUT))


def _rounding(stored: BisectSession | None, given: Rounding) -> Rounding:
    """How candidates are judged (bisect/robust.py): the search sees the even samples (or `--calib` when
    `eval` is given) and compares each candidate's lower bound over the realisations (activation scales
    jittered) with the target; the plan's figures and intervals come from the held-out samples only.
    A resumed session keeps its own; one from before issue 32 searched with one rounding and no split."""
    return Rounding.from_dict(stored.options.get("rounding")) if stored is not None else given


def _as_stored(
    stored: BisectSession, model: str | Path | None, calib: str | Path | None, options: dict[str, Any]
) -> tuple[str | Path, str | Path, dict[str, Any], str, str, bool]:
    """A resumed run: model and data default to the session's, the options are the session's (this run's
    thread count and --force aside), and so are the fallback, the mode and loss_if_only."""
    scan_options = {
        **stored.options.get("scan", {}),
        "threads": options.get("threads", stored.options["scan"].get("threads")),
        "force": bool(options.get("force", False)),  # this run's --force, not the stored one's
        **{k: options[k] for k in ("workers", "executor", "ray_address") if k in options},  # where, not what
    }
    return (
        model or stored.model_path,
        calib or stored.calibration["path"],
        scan_options,
        str(stored.options["fallback"]),
        str(stored.options.get("mode", "search")),
        bool(stored.options.get(Col.LOSS_IF_ONLY, False)),
    )


def _all_int8_meets(
    evaluator: RealisedEvaluator | ToolchainEvaluator, builder: MixedBuilder, aim: Target,
    measured: dict[tuple[str, ...], tuple[Judged, float]],
) -> bool:
    """Measure all-int8 before the output gains; True when it already meets the target.

    Why: the gains cost one evaluation per site or more (minutes on a ViT) and answer nothing when the
    plan is empty. The measurement is kept in `measured` for the search's own all-int8 step, so it is
    not run twice.
    """
    t0 = time.perf_counter()
    base = evaluator.judge(builder.precisions(()))
    measured[()] = (base, time.perf_counter() - t0)
    return aim.met(base.value)


def _open_session(
    resume: str | Path | None, session: str | Path | None, out: str | Path | None
) -> tuple[BisectSession | None, Path | None]:
    if resume is not None:
        return BisectSession.load(resume), Path(resume)
    path = Path(session) if session is not None else (Path(out) / "session.json" if out is not None else None)
    if session is not None and path is not None and path.exists():
        raise SessionFileError(f"session file {path} already exists: continue it with --resume {path}")
    return None, path


def _load_inputs(
    model: str | Path, calib: str | Path, options: Mapping[str, Any], stored: BisectSession | None
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
        consts=state_consts(options.get("state") or {}, options.get("const") or {}, calib),
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
    gains: GainResult | None,
    rounding: Rounding,
) -> BisectSession:
    outputs = ctx.headline_outputs()
    # what the run measured with (the validated options, defaults included), so a resume measures the same
    scan_opts = {k: jsonable(getattr(getattr(ctx.opts, k), "value", getattr(ctx.opts, k))) for k in SCAN_OPTION_KEYS}
    sites = [
        {
            Col.NODE: s.node,
            Col.OUTPUT: s.output,
            Col.ORDER: ctx.graph.order.get(s.node, -1 if s.is_input else k),  # a model input: before every node
            Col.OP_TYPE: s.op_type,
            Col.KERNEL: s.kernel,
        }
        for k, s in enumerate(ctx.graph.sites)
    ]
    order = (
        sensitivity_order(gains.table, gain_key(target), broad=rounding.z if rounding.realisations > 1 else 0.0)
        if gains is not None
        else [str(s[Col.NODE]) for s in sorted(sites, key=lambda s: int(str(s[Col.ORDER])))]
    )
    opts = {
        "target_metric": target.metric,
        "target_value": target.value,
        Col.OUTPUT: outputs[0] if len(outputs) == 1 else ",".join(outputs),
        "fallback": fallback,
        "mode": mode,
        Col.LOSS_IF_ONLY: loss_if_only,
        "early_stop": loss_if_only,  # bisect/state.py EARLY_STOP_SHARE: only an order that saw each loss alone
        "keep_float": list(keep_float),
        "force_quant": list(force_quant),
        "scan": scan_opts,
        "rounding": rounding.as_dict(),
    }
    gain_rows = gains.table.to_dict("records") if gains is not None else []
    session = BisectSession(str(loaded.path.resolve()), loaded.sha256, identity, opts, sites, order, gain_rows)
    if gains is not None:
        session.options["gain_seconds"] = round(gains.seconds, 4)
        session.options["gain_work_ratio"] = round(gains.work_ratio, 4)
    return session


def _save(session: BisectSession, path: Path | None, machine: Bisector,
          spare: Mapping[tuple[str, ...], Spare] | None = None) -> None:
    session.events = list(machine.events)
    if spare is not None:
        session.spare = [got.as_dict(sites) for sites, got in spare.items()]
    session.status = machine.outcome.status if machine.outcome is not None else "running"
    if path is not None:
        session.save(path)


def _deadline(started: float, max_minutes: float | None) -> float | None:
    """The perf_counter value the search stops at, None without a budget."""
    if max_minutes is None:
        return None
    if not (math.isfinite(max_minutes) and max_minutes > 0):
        raise UsageError(f"--max-minutes: expected a positive number of minutes, found {max_minutes}")
    return started + 60.0 * max_minutes


def _drive(feed: SpeculativeFeed, session: BisectSession, path: Path | None, progress: ProgressFactory,
           on_step: StepCallback | None, deadline: float | None = None) -> None:
    """Measure rounds until the machine is done, feeding it each round's results in its own order; the
    session is saved after every step, with the results measured ahead (`spare`) beside the events. Spare
    results a resumed session holds are fed first, never measured again."""
    stored = _stored_spare(session, path)
    feed.spare.update(stored)
    bar = progress("bisecting", None)
    assert feed.counts is not None
    try:
        while (cand := feed.machine.next()) is not None:
            if deadline is not None and time.perf_counter() >= deadline:
                feed.machine.stop_early()
                _save(session, path, feed.machine, feed.spare)
                break
            if cand.sites not in feed.spare:
                try:
                    feed.round()
                finally:
                    _save(session, path, feed.machine, feed.spare)
            for step in feed.feed():
                feed.counts.reused += step.sites in stored
                _save(session, path, feed.machine, feed.spare)
                bar.update(1)
                if on_step is not None:
                    on_step(step, feed.machine)
    finally:
        bar.close()


def _stored_spare(session: BisectSession, path: Path | None) -> dict[tuple[str, ...], Spare]:
    """The sets a session measured ahead; one that cannot be read is a damaged file (one line, exit 2)."""
    try:
        return dict(Spare.from_dict(raw) for raw in session.spare)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SessionFileError(f"session {path} is damaged: expected spare sets of the form quantscan writes, "
                               f"found {type(exc).__name__}: {exc}") from None


def _finish(
    ctx: ScanContext,
    builder: MixedBuilder,
    machine: Bisector,
    session: BisectSession,
    path: Path | None,
    target: Target,
    out: str | Path | None,
    save_qdq: str | Path | None,
    exports: Sequence[str] | None,
    seconds: float,
    summary_block: SummaryBlock | None,
    vendor: tuple[Toolchain | None, bool, BuildPool | None],
    judging: tuple[SampleSplit, Rounding] | None,
    feed: SpeculativeFeed | None = None,
) -> BisectResult:
    """The plan from the finished search. Its claims are the held-out samples' under quantscan's roundings
    (`judging`), or, when a toolchain measured the search (`judging` None), the toolchain's own figures."""
    outcome = machine.outcome
    assert outcome is not None
    steps = [e for e in machine.events if isinstance(e, Step)]
    chosen = set(outcome.sites) if outcome.status in ("reached", "already_met", BUDGET) else set()
    chosen |= machine.keep_float if outcome.status == "already_met" else set()
    picked, objective_record = _objective_choice(ctx, builder, machine, session, out, target, judging, chosen)
    chosen = set(picked.sites) if picked is not None else chosen
    prec = builder.precisions(chosen)
    ceiling = [n for n in machine.order if n not in machine.force_quant]
    reported = [(), ceiling, tuple(chosen), *(p.sites for p in machine.pareto())]
    claims = held_out_claims(judging[0], builder, target, judging[1], reported) if judging is not None else None
    plan = build_plan(ctx, builder, machine, session, target, prec, steps, seconds, claims,
                      achieved_sites=picked.sites if picked is not None else None)
    if feed is not None and feed.width > 1 and feed.counts is not None:
        plan = replace(plan, speculation=feed.counts.as_dict(len(feed.spare)))
    chain, verify, pool = vendor
    if chain is not None and verify:
        plan = verify_plan(plan, ctx, builder.precisions, chain, pool)
    step1_names = chain.names_for(plan.sites) if chain is not None else None
    plan = with_int8_verdict(plan, ctx, judging, builder, target, session.gain)
    plan = with_objective(plan, objective_record)
    warning = held_out_warning(plan) if plan.status != MISSED_WITHIN_BUDGET else None  # said by the verdict
    qdq = builder.model(prec)
    files: dict[str, Path] = {}
    if save_qdq is not None:
        files["qdq"] = save_model(qdq, Path(save_qdq), protect=[ctx.loaded.path], flag="--save-qdq",
                                  force=ctx.opts.force)
    if out is not None:
        files.update(write_plan(plan, session, Path(out), exports, ctx.loaded.proto, summary_block, step1_names))
    warnings = [*ctx.warnings, *([warning] if warning else [])]
    return BisectResult(plan, pd.DataFrame(session.gain), steps, outcome, path, qdq, files, warnings)


def _objective_of(stored: BisectSession | None, name: str | None, max_extra_ms: float | None,
                  ctx: ScanContext) -> Objective:
    """This run's objective (a resumed session keeps the one it recorded); a cost objective needs the scan's
    profile to have a [cost] table, checked before any search time is spent."""
    objective = (Objective.stored(stored.options) if stored is not None else None) or Objective.parse(
        name, max_extra_ms)
    if objective.needs_cost:
        from quantscan.compat.profiles import load_profile

        profile = ctx.chip.profile
        require_cost(objective, bool(profile) and bool(load_profile(str(profile)).cost), profile)
    return objective


def _objective_choice(
    ctx: ScanContext, builder: MixedBuilder, machine: Bisector, session: BisectSession, out: str | Path | None,
    target: Target, judging: tuple[SampleSplit, Rounding] | None, chosen: set[str],
) -> tuple[Choice | None, dict[str, Any] | None]:
    """`--objective latency` / `--max-extra-ms`: the measured set the objective picks, judged held out like
    the plan's claim (bisect/objective.py), and plan.json's `objective` record; (None, record) otherwise."""
    objective = Objective.stored(session.options) or Objective()
    if not objective.needs_cost or judging is None:
        return None, objective.as_dict() if "objective" in session.options else None
    from quantscan.compat.profiles import load_profile
    from quantscan.cost import Pricer

    pricer = Pricer.of(ctx.loaded.proto, load_profile(str(ctx.chip.profile)),
                       board_shapes(session, Path(out)) if out is not None else None)
    key = METRICS[target.metric]

    def held_out_of(sets: Sequence[Sequence[str]]) -> Callable[[Sequence[str]], float]:
        claims = held_out_claims(judging[0], builder, target, judging[1], sets)
        return lambda sites: float((claims.metrics(sites) or {}).get(key, math.nan))

    return rechoose(objective, pricer, builder.fallback, machine.known.values(), sorted(chosen), held_out_of,
                    target.value)


def with_int8_verdict(
    plan: Plan, ctx: ScanContext, judging: tuple[SampleSplit, Rounding] | None, builder: MixedBuilder,
    target: Target, gains: Sequence[Mapping[str, Any]],
) -> Plan:
    """A plan keeping more than half the sites above int8 gets the "cannot be int8" verdict: its cause
    (the output head or a chain, from the output gains) and the measured alternatives (bisect/alternatives.py,
    a calibration pass each: only for such plans, and only when quantscan's simulation judged the search:
    `judging`; a toolchain-judged plan gets the verdict and its cause, its figures being the toolchain's)."""
    if plan.verdict is None:  # a toolchain measured the search: no held-out claims to judge
        text = f"{plan.status}: measured by the toolchain on the search's samples (no held-out split)"
        plan = replace(plan, verdict=Verdict(plan.status, plan.reached, text, plan.status, len(plan.sites),
                                             plan.site_count).to_json())
    assert plan.verdict is not None
    if not cannot_be_int8(len(plan.sites), plan.site_count):
        return plan
    key = gain_key(target)
    heads = set(ctx.headline_outputs())
    head = next((s.node for s in ctx.graph.sites if s.output in heads), None)
    head_range = _calibrated_range(ctx, next(s.output for s in ctx.graph.sites if s.node == head)) if head else None
    cause = cause_text(gains, head, head_range, float((plan.all_int8 or {}).get(key, math.nan)),
                       float((plan.all_float or {}).get(key, math.nan)), Col.GAIN_IF_FLOAT)
    alternatives = measure_alternatives(ctx, judging[0], builder, target, judging[1], plan) if judging else ()
    verdict = Verdict(**{**{k: v for k, v in plan.verdict.items() if k in _VERDICT_KEYS},
                         "cannot_be_int8": True, "why": cause, "alternatives": alternatives})
    return replace(plan, verdict=verdict.to_json())


_VERDICT_KEYS = ("kind", "reached", "text", "search_status", "float_sites", "site_count")


def _calibrated_range(ctx: ScanContext, tensor: str) -> tuple[float, float] | None:
    """The calibrated [min, max] of a tensor, None when no observer saw it."""
    observer = ctx.quant.calib_stats.observers.get(ctx.graph.origins.get(tensor, tensor))
    if observer is None:
        return None
    low, high = observer.range()
    return float(low), float(high)


@dataclass(frozen=True)
class BisectProgress:
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


def progress_of(machine: Bisector) -> BisectProgress:
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
    return BisectProgress(len(steps), len(best.sites) if best else None, best.value if best else None, left, seconds)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"
