"""A round of quantscan's simulation measured at once through the executor seam (bisect/speculate.py
decides which candidates; a toolchain's rounds are builds: bisect/external.py).

`SimulationRound`: each candidate is a shard of `executors.map_shards`. The mixed builder holds a callable
that does not cross a process boundary, so a worker rebuilds the builder and the realised evaluator from
the picklable search context (its samples held in memory, as the gain ranking's are) on the search's own
graph strategy, and judges its candidate there; the shard run here uses the evaluator this process already
has. A candidate's figures are the same computation wherever it runs. Without an executor, `judge_here`
measures one candidate after another in this process.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from quantscan.bisect.realise import Judged, RealisedEvaluator
from quantscan.bisect.robust import Rounding
from quantscan.bisect.speculate import Spare
from quantscan.bisect.state import Candidate, Target
from quantscan.executors import Executor
from quantscan.graph.mixed import MixedBuilder
from quantscan.runner import Runner
from quantscan.scanning.gain import mixed_builder
from quantscan.scanning.prepare import ScanContext


def spare_of(judged: Judged, seconds: float) -> Spare:
    """A judged candidate as the search records it (value compared with the target, metrics, time)."""
    return Spare(judged.value, judged.metrics(), seconds)


class Judges(Protocol):
    def judge(self, prec: Sequence[str]) -> Judged: ...


def judge_here(evaluator: Judges, builder: MixedBuilder, sites: Sequence[str]) -> Spare:
    t0 = time.perf_counter()
    judged = evaluator.judge(builder.precisions(sites))
    return spare_of(judged, time.perf_counter() - t0)


@dataclass(frozen=True)
class SearchJob:
    """What a worker needs to judge candidates as this process does (picklable)."""

    ctx: ScanContext
    fallback: str
    target: Target
    rounding: Rounding
    graph: str | None
    """The search's graph strategy (bisect/targets.graph_strategy): a worker runs the parent's."""


def judge_shard(job: SearchJob, sites: tuple[str, ...], threads: int | None) -> Spare:
    """One candidate judged in a worker: its own runner, builder and realised evaluator."""
    ctx = replace(job.ctx, runner=Runner(threads=threads, opt_level=job.ctx.runner.opt_level))
    builder = mixed_builder(ctx, job.fallback)
    evaluator = RealisedEvaluator(ctx, builder, job.target, job.rounding, job.graph, stop_early=True)  # as the parent's
    return judge_here(evaluator, builder, sites)


class SimulationRound:
    """A round's candidates as shards of the executor (module docstring)."""

    def __init__(self, executor: Executor, ctx: ScanContext, fallback: str, target: Target, rounding: Rounding,
                 here: RealisedEvaluator, builder: MixedBuilder) -> None:
        held = ctx.data.eval_set.held()
        self.job = SearchJob(replace(ctx, data=replace(ctx.data, cset=held, eval_set=held)), fallback, target,
                             rounding, here.strategy)
        self.executor, self.here, self.builder = executor, here, builder

    def __call__(self, cands: Sequence[Candidate]) -> list[Spare | BaseException]:
        job = replace(self.job, graph=self.here.strategy)  # as measured here: a refused switchable graph is not retried
        return list(self.executor.map_shards(
            judge_shard, job, [c.sites for c in cands],
            local=lambda _job, sites, _threads: judge_here(self.here, self.builder, sites)))
