"""One scan, start to end: prepare (passes 0-1), evaluate (pass 2), tables; a typed result.

`measure()` returns a `ScanResult` and writes nothing. The run folder (the contract's files, summary.md
and report.html among them) is written by `quantscan.api.save_scan`, the public `quantscan.scan` being
`measure` plus that when `out=` is given: the analysis never imports the report renderers.
"""

from __future__ import annotations

import copy
import platform
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pandas as pd

from quantscan import graph as qgraph
from quantscan.calib import CalibSet
from quantscan.columns import Col
from quantscan.executors import Executor
from quantscan.graph.index import GraphIndex
from quantscan.graph.subgraphs import quantizable_bodies
from quantscan.model import LoadedModel
from quantscan.records import DataInfo, Headline, ModelInfo, OutputMetrics, RunInfo
from quantscan.runner import Runner
from quantscan.scanning.advice_eval import with_coverage, with_decider_cosines
from quantscan.scanning.board import BoardEstimate, board_estimate, probe_input_shapes, with_board_time
from quantscan.scanning.budget import measured_peak_bytes
from quantscan.scanning.calib_advice import CalibAdvice, advise_run
from quantscan.scanning.causes import with_inherited
from quantscan.scanning.deployed import deployed_gap_sites
from quantscan.scanning.evaluate import Evaluation, accumulate_evaluation, finish_evaluation, headline
from quantscan.scanning.impact import (
    GainMeasure,
    Impact,
    gains_here,
    measure_impact,
    rank_by_gain,
    with_gain_stderr,
    with_whole_set_gain,
)
from quantscan.scanning.inputs import InputSite, measure_inputs, with_input_findings
from quantscan.scanning.options import ProgressFactory, ScanOptions, no_progress, worker_count
from quantscan.scanning.prepare import ScanContext, prepare_timed
from quantscan.scanning.recover_check import bias_correction_check
from quantscan.scanning.scheme_gain import scheme_gains, with_scheme_gains
from quantscan.scanning.site_result import SiteResult, layers_frame
from quantscan.scanning.tables import ScanTables, build_tables, ops_table, with_profile
from quantscan.scanning.tasks import decoder_notes, task_table
from quantscan.scanning.workers import (
    ShardedCalibration,
    ShardedGain,
    evaluate_in_workers,
    executor_for,
    needs_executor,
    reopenable,
)
from quantscan.schemes import Scheme
from quantscan.sites import Site


@dataclass
class ScanResult:
    """What a scan found: `site_results` typed, one per layers.csv row (rank order), and the DataFrames as
    written to the CSV files of the contract (`layers` is `site_result.layers_frame(site_results)`)."""

    layers: pd.DataFrame
    tensors: pd.DataFrame
    ops: pd.DataFrame
    channels: pd.DataFrame
    hist: dict[str, np.ndarray]
    output_metrics: dict[str, OutputMetrics]
    headline: Headline
    run_info: RunInfo
    warnings: list[str]
    sites: list[Site]
    site_results: list[SiteResult]
    qdq_model: onnx.ModelProto
    model: LoadedModel
    compat: Any = None
    """compat.CheckResult when a profile was given."""
    profile: str | None = None
    no_report: bool = False
    """Leave report.html out of the run folder (the `--no-report` flag)."""
    files: list[Path] = field(default_factory=list)
    """What `api.save_scan` / `api.save_qdq` wrote, in order."""
    task: pd.DataFrame | None = None
    """task.csv (output, task, metric, value) when any task metric was measured."""
    calib_advice: CalibAdvice | None = None
    """`scan --calib-advice`: scale spread against n, deciding samples (calib_advice.csv)."""


RECOVER_CHECK_BELOW = 0.999
"""The headline cosine below which the scan measures bias correction (report.verdict's CLOSE_COSINE:
above it the summary calls the output close to FP32 and suggests no fix)."""


def measure(
    model: str | Path | LoadedModel,
    calib: str | Path | CalibSet,
    *,
    progress: ProgressFactory = no_progress,
    runner: Runner | None = None,
    **options: Any,
) -> ScanResult:
    """The scan itself: prepare, evaluate, tables. Writes nothing."""
    started = time.perf_counter()
    opts = ScanOptions(**options).validate()  # the options are parsed here, once, and travel as `opts`
    if not needs_executor(opts):
        return _measure(model, calib, progress, runner, None, opts, started)
    reopenable(calib)
    executor = executor_for(opts)  # started now: process workers import while this process loads
    opts = replace(opts, workers=executor.workers)  # the shard count every pass uses and run.json records
    try:
        return _measure(model, calib, progress, runner, executor, opts, started)
    finally:
        executor.close()


def _measure(
    model: str | Path | LoadedModel,
    calib: str | Path | CalibSet,
    progress: ProgressFactory,
    runner: Runner | None,
    pool: Executor | None,
    opts: ScanOptions,
    started: float,
) -> ScanResult:
    """`measure` with its executor (None: everything in this process, unsharded)."""
    sharded = ShardedCalibration(pool, calib) if pool is not None else None
    ctx, times = prepare_timed(model, calib, progress=progress, runner=runner, calibrate_with=sharded, opts=opts)
    qdq = qgraph.build_qdq_model(ctx.graph.prepared.proto, ctx.graph.sites, ctx.quant.plan)
    t0 = time.perf_counter()
    evaluation = _evaluate(ctx, qdq, calib, pool, progress)
    times["evaluation"] = time.perf_counter() - t0
    ctx.warnings.extend(evaluation.warnings)
    ctx.warnings.extend(decoder_notes(ctx.graph.prepared.proto, ctx.headline_outputs(), ctx.graph.probe.shapes,
                                      ctx.data.eval_set, ctx.opts))
    t0 = time.perf_counter()
    tables = build_tables(ctx.loaded, ctx.graph.prepared, ctx.graph.sites, ctx.quant.plan, ctx.quant.calib_stats,
                          evaluation, ctx.graph.order,
                          ctx.graph.probe)
    board = None
    if ctx.compat is not None and ctx.chip.profile is not None:
        tables.sites = with_profile(tables.sites, ctx, evaluation)
        board = _board(ctx)
        if board is not None:
            tables.sites = with_board_time(tables.sites, board)
    times["tables"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    inputs = measure_inputs(ctx)
    tables.sites = with_input_findings(tables.sites, inputs)
    times["input_sites"] = time.perf_counter() - t0  # scanning/inputs.py: the model inputs measured as sites
    gains_by = ShardedGain(pool) if pool is not None else gains_here
    impact = rank_by_impact(ctx, tables, progress, evaluation.sample_order, gains_by)
    times["impact"] = impact.seconds
    gains = scheme_gains(ctx)
    if gains is not None:
        times["scheme_gain"] = gains.seconds
    head = headline(evaluation)
    head.unmeasured = quantizable_bodies(ctx.graph.prepared.proto)
    info = _checks_and_record(ctx, qdq, head, evaluation, impact, times, inputs)
    if board is not None:
        info.options["board_time"] = board.to_json()
    if ctx.opts.recover_check and head.cosine < RECOVER_CHECK_BELOW:
        check = bias_correction_check(ctx, head.cosine)
        if check is not None:
            info.options["recover_check"] = check.to_json()
            info.times_s["recover_check"] = round(check.seconds, 4)
    info.times_s["total"] = round(time.perf_counter() - started, 4)
    return ScanResult(
        layers=with_scheme_gains(layers_frame(tables.sites), gains),
        tensors=tables.tensors,
        ops=tables.ops,
        channels=tables.channels,
        hist=evaluation.hist,
        output_metrics=evaluation.output_metrics,
        headline=head,
        run_info=info,
        warnings=list(dict.fromkeys(ctx.warnings)),
        sites=ctx.graph.sites,
        site_results=tables.sites,
        qdq_model=qdq,
        model=ctx.loaded,
        compat=ctx.compat,
        profile=ctx.chip.profile,
        no_report=ctx.opts.no_report,
        task=task_table(evaluation.task),
        calib_advice=_calib_advice(ctx) if ctx.opts.calib_advice else None,
    )


def _board(ctx: ScanContext) -> BoardEstimate | None:
    """Board time per site when the scan's profile has a [cost] table (the user's model, probe shapes)."""
    assert ctx.opts.profile is not None
    shapes = probe_input_shapes(ctx.loaded.proto, ctx.graph.probe.input_shapes)
    return board_estimate(ctx.loaded.proto, ctx.opts.profile, shapes)


def _evaluate(
    ctx: ScanContext, qdq: onnx.ModelProto, calib: str | Path | CalibSet, pool: Executor | None,
    progress: ProgressFactory,
) -> Evaluation:
    """Pass 2 over the tensors tensors.csv covers (every float tensor, or `--tensors sites`), here or in
    the workers' shards."""
    probe, opts = ctx.graph.probe, ctx.opts
    compare = [t for t in probe.tensor_order if t in probe.float_tensors]
    if opts.tensors == "sites":
        points = set(ctx.quant.plan.activations) | {s.output for s in ctx.graph.sites} | set(probe.outputs)
        compare = [t for t in compare if t in points]
    if pool is not None:
        return evaluate_in_workers(pool, ctx, calib, qdq, compare, progress)
    sums = accumulate_evaluation(
        ctx.graph.prepared, qdq, ctx.graph.sites, ctx.quant.plan, compare, ctx.data.eval_set, ctx.data.batch_size,
        ctx.runner, progress, probe, opts, segments=ctx.data.memory.segments if ctx.data.memory is not None else 1,
    )
    return finish_evaluation(sums, ctx.graph.sites, ctx.quant.plan, ctx.data.eval_set)


def _checks_and_record(
    ctx: ScanContext, qdq: onnx.ModelProto, head: Headline, evaluation: Evaluation, impact: Impact,
    times: dict[str, float], inputs: Sequence[InputSite] = (),
) -> RunInfo:
    """The deployed-gap check, then run.json's record of the whole scan (the model inputs as sites too)."""
    t0 = time.perf_counter()
    gap_sites = deployed_gap_sites(ctx, qdq, head)
    if gap_sites:
        times["deployed_gap"] = time.perf_counter() - t0
    measured_inputs = {i.name: i.to_json() for i in inputs}
    info = run_info(ctx, qdq, head, evaluation)
    for entry in info.inputs:  # the inputs as sites (scanning/inputs.py), beside their contract
        if entry["name"] in measured_inputs:
            entry["quantization"] = measured_inputs[entry["name"]]
    info.deployed_gap_sites = [g.to_json() for g in gap_sites]
    info.options["gain_candidates"] = ctx.opts.gain_candidates
    info.options["gain_measured"] = len(impact.gains)
    info.options["gain_samples"] = impact.samples
    info.options["gain_sample_indices"] = list(impact.sample_indices)
    if impact.sample_indices:
        info.options["gain_samples_cosine"] = impact.base
    if impact.ort_level:
        info.options["gain_ort_level"] = impact.ort_level
    info.memory = memory_record(ctx)
    info.times_s = {k: round(v, 4) for k, v in times.items()}
    return info


def _calib_advice(ctx: ScanContext) -> CalibAdvice:
    """`scan --calib-advice`: pass 1's per-sample ranges (merged across `--workers`), no extra calibration
    pass; the top deciding samples' leave-one-out cosines take one evaluation pass each."""
    advice = advise_run(ctx.quant.calib_stats.sample_ranges, str(ctx.chip.activations), ctx.data.cset.files,
                        ctx.data.cset.n_samples, str(ctx.opts.calib_method), seed=ctx.opts.seed)
    return with_coverage(ctx, with_decider_cosines(ctx, advice))


def rank_by_impact(
    ctx: ScanContext, tables: ScanTables, progress: ProgressFactory, sample_order: Sequence[int] = (),
    measure: GainMeasure = gains_here,
) -> Impact:
    """Measure the candidates' output gain (on the samples first in `sample_order`: most output error), re-rank
    the sites (and ops' best rank) by it, re-measure rank 1 on the whole evaluation set when asked
    (`gain_whole_set`) and the gains were taken on fewer samples, and let the inherited-error rule name the
    upstream site it measured as the cause; `tables` is updated in place."""
    started = time.perf_counter()
    per_ordering = ctx.opts.candidates_per_ordering(len(ctx.graph.sites))
    impact = measure_impact(ctx, tables.sites, per_ordering, samples=ctx.opts.gain_samples,
                            sample_order=sample_order, progress=progress, measure=measure)
    if impact.gains:
        results = with_gain_stderr(rank_by_gain(tables.sites, impact.gains), impact.replicates)
        if impact.sample_indices and ctx.opts.gain_whole_set:
            results = with_whole_set_gain(ctx, results, progress)
        tables.sites = with_inherited(results, ctx.graph.sites, ctx.quant.plan, ctx.quant.calib_stats,
                                      GraphIndex(ctx.graph.prepared.proto.graph), impact.gains)
        on_chip = [r for r in tables.sites if r.on_chip]
        tables.ops = ops_table(layers_frame(on_chip))  # as build_tables made it: site rows only, best rank updated
    impact.seconds = time.perf_counter() - started
    return impact


def _preprocessing(ctx: ScanContext) -> dict[str, dict[str, Any]]:
    """The calibration set's preprocessing as applied; a separate evaluation set's beside it when the
    two differ (each input's record gains `evaluation` then)."""
    record = {k: dict(v) for k, v in ctx.data.cset.preprocessing.items()}
    if ctx.data.eval_set is not ctx.data.cset:
        for name, applied in ctx.data.eval_set.preprocessing.items():
            record.setdefault(name, {})["evaluation"] = dict(applied)
    return record


def run_info(ctx: ScanContext, qdq: onnx.ModelProto, head: Headline, evaluation: Evaluation) -> RunInfo:
    """run.json: versions, the model and data identities, the options as used, the headline."""
    from quantscan.runner import onnxruntime_version
    from quantscan.version import __version__

    loaded, prepared, opts, runner = ctx.loaded, ctx.graph.prepared, ctx.opts, ctx.runner
    qdq_pairs = sum(1 for n in qdq.graph.node if n.op_type == "QuantizeLinear")
    return RunInfo(
        versions={"quantscan": __version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime_version(),
                  "numpy": np.__version__, "pandas": pd.__version__, "python": platform.python_version()},
        model=ModelInfo(str(loaded.path), loaded.sha256, loaded.opset, len(loaded.proto.graph.node)),
        input_contract={k: list(v) for k, v in ctx.graph.probe.input_shapes.items()},
        preprocessing=_preprocessing(ctx),
        worst_samples=list(evaluation.worst_samples),
        inputs=[{"name": s.name, "dtype": str(s.dtype), "shape": list(s.shape)} for s in loaded.inputs],
        calibration=DataInfo(str(ctx.data.cset.source), ctx.data.cset.n_samples, kind=ctx.data.cset.kind),
        evaluation=DataInfo(str(ctx.data.eval_set.source), ctx.data.eval_set.n_samples,
                            same_as_calibration=ctx.data.eval_set is ctx.data.cset),
        options={"calib_method": opts.calib_method.value, "activations": _value(ctx.chip.activations),
                 "activations_source": ctx.chip.activations_source,
                 "weights": _weights_text(ctx.chip.scheme), "scheme": ctx.chip.scheme.name(),
                 "profile": str(opts.profile) if opts.profile else None,
                 "float16_nodes": sorted(ctx.chip.float16_nodes),
                 "bias": "float" if ctx.chip.scheme.weight_only or ctx.chip.scheme.group_size else "int32 at s_in*s_w",
                 "batch_size": ctx.data.batch_size, "limit": opts.limit,
                 "const": dict(opts.const), "input_shape": {k: list(v) for k, v in opts.input_shape.items()},
                 Col.OUTPUT: list(opts.output),
                 "task": opts.task if isinstance(opts.task, str) else list(opts.task),
                 "workers": opts.workers if opts.executor is not None else worker_count(opts.workers)},
        chip=ctx.chip.to_json(),
        opset_used=prepared.opset_to,
        opset_original=prepared.opset_from,
        preparation=copy.copy(prepared.changes),
        preparation_check_max_abs=ctx.graph.probe.preparation_check,
        ort_level=runner.level_name,
        deployed_ort_level="ORT_ENABLE_ALL",
        threads=opts.threads,
        seed=opts.seed,
        sites=len(ctx.graph.sites),
        qdq_pairs=qdq_pairs,
        runner={"sessions": runner.stats.sessions_created, "runs": runner.stats.runs},
        headline=head,
        output_metrics=evaluation.output_metrics,
        deployed_metrics=evaluation.deployed_metrics,
    )


def memory_record(ctx: ScanContext) -> dict[str, Any]:
    """run.json's `memory`: the plan, with the peak this process actually reached (VmHWM) filled in."""
    if ctx.data.memory is None:
        return {}
    ctx.data.memory.measured_peak_bytes = measured_peak_bytes()
    return ctx.data.memory.to_json()


def _weights_text(scheme: Scheme) -> str:
    """run.json options.weights: "int8 per-channel symmetric" (the spelling before schemes), or e.g.
    "int4 group-128 symmetric"."""
    granularity = f"group-{scheme.group_size}" if scheme.group_size else "per-channel"
    return f"{scheme.weights} {granularity} {'asymmetric' if scheme.weight_zero_point else 'symmetric'}"


def _value(option: Any) -> Any:
    """An enum option as its plain word (run.json keeps the strings users typed)."""
    return getattr(option, "value", option)
