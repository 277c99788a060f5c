"""`--workers N`: calibration (pass 1), evaluation (pass 2) and the gain ranking over N disjoint shards,
run where the executor seam (quantscan/executors.py: serial, process or ray) puts them and merged in
shard order, so every backend gives the same bytes.

Why processes: the analysis session spends much of each batch outside onnxruntime's thread pool
(Python folding of the in-graph sums, the deployed check, task metrics), so one process does not fill
two cores. Every pass-2 figure is a sum, a count, a min or a max (`evaluate.EvalSums`), so the shards'
sums merge into what one process would have summed, up to float64 rounding of the additions' order.

Why this process takes a shard: it has onnxruntime imported and the samples open already, while a
spawned process pays ~2 s importing onnxruntime and reopens the samples; on 2 cores one spawned
process imports while this one loads and probes the model, where a second would take turns with both.
Min/max ranges merge exactly too (min of minima), so pass 1 is sharded the same way. The gain
ranking's candidates are shared out instead of its few samples: each process builds a gain graph with
its part of the branches only (session creation is most of that phase), and every branch is compared
with the all-int8 model inside its own session, so each gain is the single-process figure. What stays
here alone: loading, the probe, the plan (it sets the scales every shard must share), tables and writing.
Shards are whole batches of the single-process run, so each batch, its sums and the hist.npz window
(the first samples) are the same ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx

from quantscan import graph as qgraph
from quantscan.calib import CalibSet, load_calibration
from quantscan.calib.recurrent import state_consts
from quantscan.errors import UsageError
from quantscan.executors import Executor, make_executor
from quantscan.model import PreparedModel
from quantscan.records import ActivationScheme, CalibMethod
from quantscan.runner import Runner
from quantscan.scanning.calibrate import CalibStats, calibrate, merge_calib_stats
from quantscan.scanning.evaluate import EvalSums, Evaluation, accumulate_evaluation, finish_evaluation
from quantscan.scanning.impact import MeasuredGains, gains_here
from quantscan.scanning.options import ProgressFactory, ScanOptions, n_batches, no_progress, worker_count
from quantscan.scanning.prepare import ScanContext
from quantscan.scanning.probe import Probe
from quantscan.sites import Site
from quantscan.specs import InputSpec


@dataclass(frozen=True)
class SampleSource:
    """How a worker reopens the evaluation set: the folder and the options it was loaded with
    (a `CalibSet` streams through closures, which do not cross a process boundary)."""

    path: Path
    inputs: list[InputSpec]
    preprocess: str | Path | None
    overrides: Mapping[str, Any]
    consts: Mapping[str, float]
    limit: int | None

    def open(self) -> CalibSet:
        return load_calibration(self.path, self.inputs, preprocess=self.preprocess, overrides=self.overrides,
                                consts=self.consts, limit=self.limit)


@dataclass
class EvalJob:
    """What every pass-2 shard shares, in picklable form (the object store holds it once under Ray)."""

    prepared: PreparedModel
    qdq: bytes
    sites: list[Site]
    plan: qgraph.QuantPlan
    compare: list[str]
    probe: Probe
    opts: ScanOptions
    batch_size: int
    segments: int
    opt_level: str
    source: SampleSource


Bounds = tuple[int, int]
"""A shard: the [start, stop) sample range of the whole set it covers."""


@dataclass
class ShardResult:
    """A shard's sums and the onnxruntime work it did (added to the parent's runner counters)."""

    sums: EvalSums
    sessions: int = 0
    runs: int = 0
    samples: int = 0


def needs_executor(opts: ScanOptions, *, builds: bool = False) -> bool:
    """Whether the run starts an executor at all: not with one worker and no `--executor` (everything
    runs here, one step after another). Toolchain `builds` wait on subprocesses, so more of them than
    CPUs still run at once; measurements do not."""
    workers = opts.workers if builds else worker_count(opts.workers)
    return opts.executor is not None or workers > 1


def executor_for(opts: ScanOptions, *, builds: bool = False, tool: str | None = None) -> Executor:
    """The one executor policy, for the scan's passes and the bisect's rounds alike: the executor
    `--executor`/`--workers`/`--ray-address` ask for. Local processes: at most one per CPU here (more would
    take turns on the cores); `serial` runs exactly `--workers` shards (the reference for any other
    backend's shard count); Ray caps its actors by the cluster's CPUs. `builds`: the work is toolchain
    builds, which wait on subprocesses, so locally they need no process pool and a serial executor runs
    them in threads. `tool`: the toolchain a local Ray started here offers as a resource (its Python was
    found on this machine); a cluster's nodes offer what they were started with."""
    name = "serial" if builds and opts.executor != "ray" else opts.executor
    processes = name == "process" or (name is None and opts.workers > 1)
    workers = worker_count(opts.workers) if processes else opts.workers
    resources = {f"toolchain:{tool}": float(opts.workers)} if tool is not None else None
    return make_executor(name, workers, threads=opts.threads, ray_address=opts.ray_address, resources=resources)


def shard_bounds(n_samples: int, batch_size: int, workers: int) -> list[Bounds]:
    """[start, stop) sample ranges of whole batches, as even as the batch count allows; no empty shard."""
    batches = n_batches(n_samples, batch_size)
    base, extra = divmod(batches, workers)
    bounds: list[Bounds] = []
    batch = 0
    for w in range(workers):
        count = base + (1 if w < extra else 0)
        start, stop = min(batch * batch_size, n_samples), min((batch + count) * batch_size, n_samples)
        if stop > start:
            bounds.append((start, stop))
        batch += count
    return bounds


def reopenable(calib: str | Path | CalibSet) -> str | Path:
    """The calibration argument as workers can reopen it: a path; a set passed in as an object streams
    through closures, which do not cross a process boundary."""
    if isinstance(calib, CalibSet):
        raise UsageError("--workers: expected a calibration folder path (workers reopen it), "
                         "found a CalibSet object; pass the folder or use workers=1")
    return calib


def sample_source(path: str | Path, inputs: Sequence[InputSpec], opts: ScanOptions) -> SampleSource:
    """A sample set as a worker can reopen it."""
    return SampleSource(Path(path), list(inputs), opts.preprocess, dict(opts.preprocess_overrides),
                        state_consts(opts.state, opts.const, path), opts.limit)


@dataclass
class CalibJob:
    """What every pass-1 (min/max calibration) shard shares."""

    prepared: PreparedModel
    sites: list[Site]
    origins: dict[str, str]
    batch_size: int
    method: CalibMethod
    scheme: ActivationScheme
    shapes: dict[str, tuple[int, ...]]
    input_shapes: dict[str, tuple[int, ...]]
    opt_level: str
    source: SampleSource


class ShardedCalibration:
    """Pass 1 over sample shards through the executor, for the calibration methods whose ranges merge
    exactly (minmax); `None` from a call means "calibrate in this process" (histogram methods)."""

    def __init__(self, executor: Executor, calib: str | Path | CalibSet) -> None:
        self.executor, self.calib = executor, calib

    def __call__(self, prepared: PreparedModel, sites: Sequence[Site], origins: Mapping[str, str], cset: CalibSet,
                 batch_size: int, runner: Runner, opts: ScanOptions, scheme: ActivationScheme, probe: Probe,
                 inputs: Sequence[InputSpec]) -> CalibStats | None:
        if opts.calib_method != CalibMethod.MINMAX:
            return None
        source = sample_source(reopenable(self.calib), inputs, opts)
        bounds = shard_bounds(cset.n_samples, batch_size, self.executor.workers)
        job = CalibJob(prepared, list(sites), dict(origins), batch_size, opts.calib_method, scheme,
                       dict(probe.shapes), dict(probe.input_shapes), runner.opt_level, source)
        results = self.executor.map_shards(run_calib_shard, job, bounds,
                                           local=lambda j, b, t: run_calib_shard(j, b, t, cset))
        done = [r for r in results if r is not None]
        for _, sessions, runs in done:
            runner.stats.sessions_created += sessions
            runner.stats.runs += runs
        return merge_calib_stats([stats for stats, _, _ in done])


def run_calib_shard(job: CalibJob, bounds: Bounds, threads: int | None,
                    opened: CalibSet | None = None) -> tuple[CalibStats, int, int] | None:
    """This shard's ranges, from this process' own FP32 session (None for an empty shard); `opened`: the
    whole set, already open in this process (else the worker reopens it from `job.source`)."""
    start, stop = bounds
    if stop <= start:
        return None
    cset = (opened if opened is not None else job.source.open()).shard(start, stop)
    runner = Runner(threads=threads, opt_level=job.opt_level)
    stats = calibrate(job.prepared, job.sites, job.origins, cset, job.batch_size, runner, job.method, job.scheme,
                      no_progress, job.shapes, job.input_shapes)
    return stats, runner.stats.sessions_created, runner.stats.runs


def evaluate_in_workers(
    executor: Executor,
    ctx: ScanContext,
    calib: str | Path | CalibSet,
    qdq: onnx.ModelProto,
    compare: Sequence[str],
    progress: ProgressFactory = no_progress,
    bounds: Sequence[Bounds] | None = None,
) -> Evaluation:
    """Pass 2 over the executor's shards (`bounds`: these sample ranges instead, empty ones allowed),
    merged in shard order; the runner counters gain every shard's sessions and runs."""
    source = sample_source(ctx.opts.eval if ctx.opts.eval is not None else reopenable(calib), ctx.loaded.inputs,
                           ctx.opts)
    if bounds is None:
        bounds = shard_bounds(ctx.data.eval_set.n_samples, ctx.data.batch_size, executor.workers)
    segments = ctx.data.memory.segments if ctx.data.memory is not None else 1
    job = EvalJob(ctx.graph.prepared, qdq.SerializeToString(), list(ctx.graph.sites), ctx.quant.plan,
                  list(compare), ctx.graph.probe,
                  ctx.opts, ctx.data.batch_size, segments, ctx.runner.opt_level, source)
    bar = progress("measuring", len(bounds))
    try:
        results = executor.map_shards(run_eval_shard, job, list(bounds),
                                      local=lambda j, b, t: run_eval_shard(j, b, t, ctx.data.eval_set))
        bar.update(len(bounds))
    finally:
        bar.close()
    done = [r for r in results if r is not None]
    merged = done[0].sums
    for result in done[1:]:
        merged.merge(result.sums)
    for result in done:
        ctx.runner.stats.sessions_created += result.sessions
        ctx.runner.stats.runs += result.runs
        ctx.runner.stats.samples += result.samples
    return finish_evaluation(merged, ctx.graph.sites, ctx.quant.plan, ctx.data.eval_set)


def run_eval_shard(job: EvalJob, bounds: Bounds, threads: int | None,
                   opened: CalibSet | None = None) -> ShardResult | None:
    """Build this process' own sessions and sum the shard (None for an empty one); `opened`: the whole
    evaluation set, already open in this process (else the worker reopens it from `job.source`)."""
    start, stop = bounds
    if stop <= start:
        return None
    eval_set = (opened if opened is not None else job.source.open()).shard(start, stop)
    runner = Runner(threads=threads, opt_level=job.opt_level)
    sums = accumulate_evaluation(
        job.prepared, onnx.load_from_string(job.qdq), job.sites, job.plan, job.compare, eval_set, job.batch_size,
        runner, no_progress, job.probe, job.opts, segments=job.segments, offset=start,
    )
    stats = runner.stats
    return ShardResult(sums, stats.sessions_created, stats.runs, stats.samples)


class ShardedGain:
    """`impact.GainMeasure` through the executor: candidates dealt out in graph order (a branch from an
    early site re-runs most of the network, one near the output almost nothing, so each part gets both).
    The shards are candidate lists; the context (with the gain's few samples held) is shared."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    def __call__(self, ctx: ScanContext, candidates: Sequence[str], samples: CalibSet,
                 progress: ProgressFactory = no_progress) -> MeasuredGains:
        parts = deal_in_graph_order(candidates, [s.node for s in ctx.graph.sites], self.executor.workers)
        held = samples.held() if len(parts) > 1 else samples
        remote = replace(ctx, data=replace(ctx.data, cset=held, eval_set=held))
        results = self.executor.map_shards(
            run_gain_shard, remote, parts,
            local=lambda _, part, threads: run_gain_shard(ctx, part, threads, samples, progress))
        merged = MeasuredGains({}, results[0][0].base)  # every part ran the same all-int8 model on the same samples
        for part, sessions, runs in results:
            merged.merge(part)
            ctx.runner.stats.sessions_created += sessions
            ctx.runner.stats.runs += runs
        return merged


def deal_in_graph_order(candidates: Sequence[str], order: Sequence[str], parts: int) -> list[list[str]]:
    """The candidates sorted by graph position and dealt round-robin into at most `parts` non-empty lists."""
    position = {node: k for k, node in enumerate(order)}
    ranked = sorted(candidates, key=lambda node: position.get(node, len(position)))
    return [ranked[k::parts] for k in range(min(parts, len(ranked)))]


def run_gain_shard(ctx: ScanContext, candidates: list[str], threads: int | None, samples: CalibSet | None = None,
                   progress: ProgressFactory = no_progress) -> tuple[MeasuredGains, int, int]:
    """This part's gains and the all-int8 figure, from this process' own gain session over `samples`
    (default: the context's evaluation set), and the sessions and runs it took."""
    runner = Runner(threads=threads, opt_level=ctx.runner.opt_level)
    measured = gains_here(ctx, candidates, samples if samples is not None else ctx.data.eval_set, progress, runner)
    return measured, runner.stats.sessions_created, runner.stats.runs
