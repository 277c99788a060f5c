"""The bisection driver: a request in, a plan out.

`bisect_model` takes the model, the data, a typed `BisectRequest` (bisect/request.py), the `ScanOptions` and
a few hooks. It loads and identifies the model and data first (a wrong session is refused before any long
work), prepares the scan, makes the search's judge from the registry (bisect/judges.py), runs the search
(bisect/search.py: all-int8, output gains, the resumable session, rounds of candidates) and builds and
writes the plan (bisect/finish.py). The old keyword spelling is `quantscan.api.run_bisect`.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from quantscan.bisect.external import BuildPool
from quantscan.bisect.finish import BisectResult, finish
from quantscan.bisect.judge import JudgeSetup
from quantscan.bisect.judges import JudgeSpec, continuing, judge_spec
from quantscan.bisect.objective import Objective, require_cost
from quantscan.bisect.progress import BisectProgress, progress_of
from quantscan.bisect.realise import split_context
from quantscan.bisect.request import BisectHooks, BisectRequest, resumed_scan
from quantscan.bisect.search import Search, run
from quantscan.bisect.session import BisectSession, calibration_identity
from quantscan.bisect.state import SessionFileError
from quantscan.calib import CalibSet, load_calibration
from quantscan.calib.recurrent import state_consts
from quantscan.errors import UsageError
from quantscan.executors import Executor
from quantscan.graph.mixed import MixedBuilder
from quantscan.model import LoadedModel, load_model
from quantscan.scanning.gain import mixed_builder
from quantscan.scanning.options import ScanOptions
from quantscan.scanning.prepare import ScanContext, prepare_scan
from quantscan.scanning.samples import given_input_specs
from quantscan.scanning.workers import ShardedCalibration, executor_for, needs_executor

__all__ = ["BisectHooks", "BisectProgress", "BisectRequest", "BisectResult", "bisect_model", "progress_of"]


def bisect_model(
    model: str | Path | None,
    calib: str | Path | None,
    request: BisectRequest,
    scan: ScanOptions | None = None,
    hooks: BisectHooks | None = None,
) -> BisectResult:
    """Output gain, then a resumable bisection to the request's target; the plan files when it names `out`.

    New run: `model`, `calib`, a request with a target. Resume: a request with `resume=FILE` (model and data
    default to the session's; the session's target, roundings and measurement options are the search's).
    The session file is rewritten after the gains and after every step, so a kill or Ctrl-C
    (KeyboardInterrupt propagates) loses at most the step in flight. `request.max_minutes`: a budget from
    the start of this call, after which the search stops after the step in flight (status `budget`).
    """
    started = time.perf_counter()
    scan, hooks = scan or ScanOptions(), hooks or BisectHooks()
    request = request.checked()
    spec = judge_spec(request.judge)
    stored, session_path = _open_session(request)
    if (spec.builds or request.verify) and hooks.toolchain is None:
        raise UsageError(f"bisect: expected a toolchain for --evaluator {request.judge} / --verify, found none")
    if stored is not None:
        spec = continuing(spec, stored.options)
        request, scan = request.resumed(stored.options), resumed_scan(scan, stored.options["scan"])
        model, calib = model or stored.model_path, calib or stored.calibration["path"]
    if model is None or calib is None:
        raise UsageError("bisect: expected MODEL and --calib DIR (or --resume FILE)")
    loaded, cset, identity = _load_inputs(model, calib, scan, stored)
    ctx = _prepare(loaded, cset, calib, hooks, scan)
    _require_cost(request.objective, ctx)
    chain = hooks.toolchain(loaded, cset) if hooks.toolchain is not None and (request.verify or spec.builds) else None
    executor = _search_executor(ctx, scan, spec, chain.tool if chain is not None else None)
    try:
        pool = BuildPool(chain, executor) if chain is not None else None
        split = split_context(ctx, request.rounding, bool(scan.eval))
        builder = mixed_builder(ctx, request.fallback)
        _refuse_derived_marks(request, builder)
        assert request.target is not None
        judge = spec.make(JudgeSetup(split, builder, request.target, request.rounding, request.fallback,
                                     request.graph, pool, executor, scan.workers))
        search = Search(ctx, loaded, identity, request, split, builder, judge, pool)
        session, feed = run(search, stored, session_path, hooks, request.deadline(started))
        result = finish(search, session, session_path, feed, time.perf_counter() - started, hooks.summary_block)
        if chain is not None:  # only after a finished search: an interrupted one resumes from step 1's files
            chain.close()
        return result
    finally:
        if executor is not None:
            executor.close()


def _refuse_derived_marks(request: BisectRequest, builder: MixedBuilder) -> None:
    """`--keep-float`/`--force-quant` naming a site that is not a choice on this chip (the model input under
    `[input] follows_readers`): one line naming the sites that decide it, exit 2."""
    named = [n for n in (*request.keep_float, *request.force_quant) if n in builder.derived_sites]
    if not named:
        return
    k = builder.index[named[0]]
    readers = ", ".join(builder.sites[j].node for j in builder.input_readers[k])
    raise UsageError(f"--keep-float/--force-quant {named[0]}: expected a site the plan can choose, found the model "
                     f"input, which this profile rounds only for an int8 reader ([input] follows_readers): "
                     f"keep its readers ({readers}) float instead")


def _search_executor(ctx: ScanContext, scan: ScanOptions, spec: JudgeSpec, tool: str | None) -> Executor | None:
    """Where a round's candidates run (scanning/workers.executor_for, the scan's policy): `--workers` as
    asked (ctx.opts holds the processes pass 1 could use); a judge that builds in a toolchain runs its
    builds in threads or on Ray nodes offering the toolchain. None: everything here, one at a time."""
    opts = replace(ctx.opts, workers=scan.workers)
    if not needs_executor(opts, builds=spec.builds):
        return None
    return executor_for(opts, builds=spec.builds, tool=tool)


def _open_session(request: BisectRequest) -> tuple[BisectSession | None, Path | None]:
    if request.resume is not None:
        return BisectSession.load(request.resume), request.resume
    out = request.out
    path = request.session if request.session is not None else (out / "session.json" if out is not None else None)
    if request.session is not None and request.session.exists():
        raise SessionFileError(f"session file {path} already exists: continue it with --resume {path}")
    return None, path


def _load_inputs(
    model: str | Path, calib: str | Path, scan: ScanOptions, stored: BisectSession | None
) -> tuple[LoadedModel, CalibSet, dict[str, Any]]:
    """Load and identify model and data first, so a wrong session is refused before any long work."""
    loaded = load_model(model)
    if stored is not None:
        stored.check_model(loaded.sha256, model)
    cset = load_calibration(
        calib,
        given_input_specs(loaded.inputs, scan.input_shape or {}, scan.input_dims or ()),
        preprocess=scan.preprocess,
        overrides=scan.preprocess_overrides or {},
        consts=state_consts(scan.state or {}, scan.const or {}, calib),
        limit=scan.limit,
    )
    identity = calibration_identity(cset.source, cset.files, cset.n_samples)
    if stored is not None:
        stored.check_calibration(identity)
    return loaded, cset, identity


def _prepare(loaded: LoadedModel, cset: CalibSet, calib: str | Path, hooks: BisectHooks,
             scan: ScanOptions) -> ScanContext:
    """Load-to-calibration; with `--executor`/`--workers` > 1, pass 1's sample shards go through the
    executor seam as the scan's do (the search's rounds get their own executor: `_search_executor`)."""
    opts = scan.validate()
    if not needs_executor(opts):
        return prepare_scan(loaded, cset, progress=hooks.progress, runner=hooks.runner, opts=opts)
    executor = executor_for(opts)
    opts = replace(opts, workers=executor.workers)
    try:
        return prepare_scan(loaded, cset, progress=hooks.progress, runner=hooks.runner, opts=opts,
                            calibrate_with=ShardedCalibration(executor, calib))
    finally:
        executor.close()


def _require_cost(objective: Objective, ctx: ScanContext) -> None:
    """A cost objective needs the scan's profile to have a [cost] table, checked before any search time."""
    if objective.needs_cost:
        from quantscan.compat.profiles import load_profile

        profile = ctx.chip.profile
        require_cost(objective, bool(profile) and bool(load_profile(str(profile)).cost), profile)
