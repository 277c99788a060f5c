"""`--workers N`: calibration (pass 1) and evaluation (pass 2) over disjoint sample shards in N local
processes: this one, which runs the first shard itself, and N-1 spawned ones.

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

import multiprocessing
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import onnx

from quantscan import graph as qgraph
from quantscan.calib import CalibSet, load_calibration
from quantscan.calib.recurrent import state_consts
from quantscan.errors import UsageError
from quantscan.model import PreparedModel
from quantscan.records import ActivationScheme, CalibMethod
from quantscan.runner import Runner
from quantscan.scanning.calibrate import CalibStats, calibrate, merge_calib_stats
from quantscan.scanning.evaluate import EvalSums, Evaluation, accumulate_evaluation, finish_evaluation
from quantscan.scanning.impact import MeasuredGains, gains_here
from quantscan.scanning.options import ProgressFactory, ScanOptions, n_batches, no_progress
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
class EvalShard:
    """One worker's share of pass 2: everything `accumulate_evaluation` needs, in picklable form."""

    prepared: PreparedModel
    qdq: bytes
    sites: list[Site]
    plan: qgraph.QuantPlan
    compare: list[str]
    probe: Probe
    opts: ScanOptions
    batch_size: int
    segments: int
    threads: int
    opt_level: str
    source: SampleSource
    start: int
    stop: int


@dataclass
class ShardResult:
    """A shard's sums and the onnxruntime work it did (added to the parent's runner counters)."""

    sums: EvalSums
    sessions: int = 0
    runs: int = 0
    samples: int = 0


def threads_per_worker(total: int | None, workers: int, cpus: int | None = None) -> int:
    """onnxruntime threads each worker's sessions get: the run's thread total split evenly."""
    return max(1, (total or cpus or os.cpu_count() or 1) // workers)


def shard_bounds(n_samples: int, batch_size: int, workers: int) -> list[tuple[int, int]]:
    """[start, stop) sample ranges of whole batches, as even as the batch count allows; no empty shard."""
    batches = n_batches(n_samples, batch_size)
    base, extra = divmod(batches, workers)
    bounds: list[tuple[int, int]] = []
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
                        state_consts(opts.state, opts.const), opts.limit)


def process_pool(workers: int) -> ProcessPoolExecutor:
    """The `workers - 1` spawned processes beside this one (fork would copy onnxruntime's threads and
    locks mid-use), started at once: each imports quantscan and onnxruntime while this process loads
    and probes the model."""
    children = max(1, workers - 1)
    pool = ProcessPoolExecutor(max_workers=children, mp_context=multiprocessing.get_context("spawn"))
    for _ in range(children):
        pool.submit(_started)
    return pool


Job = TypeVar("Job")
Result = TypeVar("Result")


def run_sharded(pool: Executor, jobs: Sequence[Job], remote: Callable[[Job], Result],
                local: Callable[[Job], Result]) -> list[Result]:
    """`jobs[1:]` in the pool (submitted first, so they start at once), `jobs[0]` in this process meanwhile;
    the results in job order. A failure here cancels the shards not yet started."""
    futures = [pool.submit(remote, job) for job in jobs[1:]]
    try:
        first = local(jobs[0])
    except BaseException:
        for future in futures:
            future.cancel()
        raise
    return [first, *(future.result() for future in futures)]


def _started() -> None:
    """A warm-up task: unpickling it imports this module (onnxruntime, numpy, onnx) in the worker; the
    pause lets the next warm-up task reach the other process."""
    time.sleep(0.3)


@dataclass
class CalibShard:
    """One worker's share of pass 1 (min/max calibration)."""

    prepared: PreparedModel
    sites: list[Site]
    origins: dict[str, str]
    batch_size: int
    method: CalibMethod
    scheme: ActivationScheme
    shapes: dict[str, tuple[int, ...]]
    input_shapes: dict[str, tuple[int, ...]]
    threads: int
    opt_level: str
    source: SampleSource
    start: int
    stop: int


class ShardedCalibration:
    """Pass 1 over sample shards in the pool, for the calibration methods whose ranges merge exactly
    (minmax); `None` from a call means "calibrate in this process" (histogram methods)."""

    def __init__(self, pool: Executor, workers: int, calib: str | Path | CalibSet) -> None:
        self.pool, self.workers, self.calib = pool, workers, calib

    def __call__(self, prepared: PreparedModel, sites: Sequence[Site], origins: Mapping[str, str], cset: CalibSet,
                 batch_size: int, runner: Runner, opts: ScanOptions, scheme: ActivationScheme, probe: Probe,
                 inputs: Sequence[InputSpec]) -> CalibStats | None:
        if opts.calib_method != CalibMethod.MINMAX:
            return None
        source = sample_source(reopenable(self.calib), inputs, opts)
        bounds = shard_bounds(cset.n_samples, batch_size, self.workers)
        threads = threads_per_worker(opts.threads, len(bounds))
        jobs = [CalibShard(prepared, list(sites), dict(origins), batch_size, opts.calib_method, scheme,
                           dict(probe.shapes), dict(probe.input_shapes), threads, runner.opt_level, source, a, b)
                for a, b in bounds]
        results = run_sharded(self.pool, jobs, run_calib_shard, lambda job: run_calib_shard(job, cset))
        for _, sessions, runs in results:
            runner.stats.sessions_created += sessions
            runner.stats.runs += runs
        return merge_calib_stats([stats for stats, _, _ in results])


def run_calib_shard(job: CalibShard, opened: CalibSet | None = None) -> tuple[CalibStats, int, int]:
    """This shard's ranges, from this process' own FP32 session; `opened`: the whole set, already open
    in this process (else the worker reopens it from `job.source`)."""
    cset = (opened if opened is not None else job.source.open()).shard(job.start, job.stop)
    runner = Runner(threads=job.threads, opt_level=job.opt_level)
    stats = calibrate(job.prepared, job.sites, job.origins, cset, job.batch_size, runner, job.method, job.scheme,
                      no_progress, job.shapes, job.input_shapes)
    return stats, runner.stats.sessions_created, runner.stats.runs


def evaluate_in_workers(
    pool: Executor,
    ctx: ScanContext,
    calib: str | Path | CalibSet,
    qdq: onnx.ModelProto,
    compare: Sequence[str],
    workers: int,
    progress: ProgressFactory = no_progress,
) -> Evaluation:
    """Pass 2 over `workers` shards, the first in this process and the rest in the pool, merged in shard
    order; the runner counters gain every shard's sessions and runs."""
    source = sample_source(ctx.opts.eval if ctx.opts.eval is not None else reopenable(calib), ctx.loaded.inputs,
                           ctx.opts)
    bounds = shard_bounds(ctx.data.eval_set.n_samples, ctx.data.batch_size, workers)
    threads = threads_per_worker(ctx.opts.threads, len(bounds))
    segments = ctx.data.memory.segments if ctx.data.memory is not None else 1
    qdq_bytes = qdq.SerializeToString()
    jobs = [
        EvalShard(ctx.graph.prepared, qdq_bytes, list(ctx.graph.sites), ctx.quant.plan, list(compare),
                  ctx.graph.probe, ctx.opts,
                  ctx.data.batch_size, segments, threads, ctx.runner.opt_level, source, start, stop)
        for start, stop in bounds
    ]
    bar = progress("measuring", len(jobs))
    try:
        results = run_sharded(pool, jobs, run_eval_shard, lambda job: run_eval_shard(job, ctx.data.eval_set))
        bar.update(len(jobs))
    finally:
        bar.close()
    merged = results[0].sums
    for result in results[1:]:
        merged.merge(result.sums)
    for result in results:
        ctx.runner.stats.sessions_created += result.sessions
        ctx.runner.stats.runs += result.runs
        ctx.runner.stats.samples += result.samples
    return finish_evaluation(merged, ctx.graph.sites, ctx.quant.plan, ctx.data.eval_set)


def run_eval_shard(job: EvalShard, opened: CalibSet | None = None) -> ShardResult:
    """Build this process' own sessions and sum the shard; `opened`: the whole evaluation set, already
    open in this process (else the worker reopens it from `job.source`)."""
    eval_set = (opened if opened is not None else job.source.open()).shard(job.start, job.stop)
    runner = Runner(threads=job.threads, opt_level=job.opt_level)
    sums = accumulate_evaluation(
        job.prepared, onnx.load_from_string(job.qdq), job.sites, job.plan, job.compare, eval_set, job.batch_size,
        runner, no_progress, job.probe, job.opts, segments=job.segments, offset=job.start,
    )
    stats = runner.stats
    return ShardResult(sums, stats.sessions_created, stats.runs, stats.samples)



@dataclass
class GainShard:
    """One worker's share of the gain ranking: its candidates, with the scan's context whose sample sets
    are the gain's few samples, held in memory (`CalibSet.held`)."""

    ctx: ScanContext
    candidates: list[str]
    threads: int


class ShardedGain:
    """`impact.GainMeasure` over the pool: candidates dealt out in graph order (a branch from an early
    site re-runs most of the network, one near the output almost nothing, so each part gets both)."""

    def __init__(self, pool: Executor, workers: int) -> None:
        self.pool, self.workers = pool, workers

    def __call__(self, ctx: ScanContext, candidates: Sequence[str], samples: CalibSet,
                 progress: ProgressFactory = no_progress) -> MeasuredGains:
        parts = deal_in_graph_order(candidates, [s.node for s in ctx.graph.sites], self.workers)
        threads = threads_per_worker(ctx.opts.threads, len(parts))
        held = samples.held() if len(parts) > 1 else samples
        remote = replace(ctx, data=replace(ctx.data, cset=held, eval_set=held))
        jobs = [GainShard(remote, part, threads) for part in parts]
        results = run_sharded(self.pool, jobs, run_gain_shard,
                              lambda job: run_gain_shard(GainShard(ctx, job.candidates, threads), samples, progress))
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


def run_gain_shard(job: GainShard, samples: CalibSet | None = None,
                   progress: ProgressFactory = no_progress) -> tuple[MeasuredGains, int, int]:
    """This part's gains and the all-int8 figure, from this process' own gain session over `samples`
    (default: the job's), and the sessions and runs it took."""
    runner = Runner(threads=job.threads, opt_level=job.ctx.runner.opt_level)
    measured = gains_here(job.ctx, job.candidates, samples if samples is not None else job.ctx.data.eval_set,
                          progress, runner)
    return measured, runner.stats.sessions_created, runner.stats.runs
