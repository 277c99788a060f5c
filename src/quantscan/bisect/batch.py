"""A round of candidates measured at once through the executor seam (bisect/speculate.py decides which).

Two ways, one per evaluator:
- quantscan's simulation (`SimulationRound`): each candidate is a shard of `executors.map_shards`. The
  mixed builder holds a callable that does not cross a process boundary, so a worker rebuilds the
  builder and the realised evaluator from the picklable search context (its samples held in memory, as
  the gain ranking's are) and judges its candidate there; the shard run here uses the evaluator this
  process already has. A candidate's figures are the same computation wherever it runs.
- a toolchain (`ToolchainRound`): each candidate is one build, run by `external.BuildPool` (threads here,
  or Ray tasks on a node with the toolchain).
- neither (`HereRound`, one worker): one candidate after another in this process, as before issue 29.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from quantscan.bisect.external import ToolchainEvaluator
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


def judge_here(evaluator: RealisedEvaluator | ToolchainEvaluator, builder: MixedBuilder, sites: Sequence[str]) -> Spare:
    t0 = time.perf_counter()
    judged = evaluator.judge(builder.precisions(sites))
    return spare_of(judged, time.perf_counter() - t0)


@dataclass
class HereRound:
    """Every candidate here, in order (one worker: a round is one candidate)."""

    evaluator: RealisedEvaluator | ToolchainEvaluator
    builder: MixedBuilder

    def __call__(self, cands: Sequence[Candidate]) -> list[Spare | BaseException]:
        return [judge_here(self.evaluator, self.builder, c.sites) for c in cands]


@dataclass
class ToolchainRound:
    """A round's candidates as builds side by side (`ToolchainEvaluator.judge_many`)."""

    evaluator: ToolchainEvaluator
    builder: MixedBuilder

    def __call__(self, cands: Sequence[Candidate]) -> list[Spare | BaseException]:
        judged = self.evaluator.judge_many([self.builder.precisions(c.sites) for c in cands])
        return [got if isinstance(got, BaseException) else spare_of(got, seconds) for got, seconds in judged]


@dataclass(frozen=True)
class SearchJob:
    """What a worker needs to judge candidates as this process does (picklable)."""

    ctx: ScanContext
    fallback: str
    target: Target
    rounding: Rounding


def judge_shard(job: SearchJob, sites: tuple[str, ...], threads: int | None) -> Spare:
    """One candidate judged in a worker: its own runner, builder and realised evaluator."""
    ctx = replace(job.ctx, runner=Runner(threads=threads, opt_level=job.ctx.runner.opt_level))
    builder = mixed_builder(ctx, job.fallback)
    evaluator = RealisedEvaluator(ctx, builder, job.target, job.rounding, settle=True)  # as the parent's
    # one candidate per call: a switchable session would be built for a handful of evaluations, which costs
    # more than it saves (bisect/switched.py); the evaluator here in the parent keeps its own
    evaluator.use_switchable("never")
    return judge_here(evaluator, builder, sites)


class SimulationRound:
    """A round's candidates as shards of the executor (module docstring)."""

    def __init__(self, executor: Executor, ctx: ScanContext, fallback: str, target: Target, rounding: Rounding,
                 here: RealisedEvaluator, builder: MixedBuilder) -> None:
        held = ctx.data.eval_set.held()
        self.job = SearchJob(replace(ctx, data=replace(ctx.data, cset=held, eval_set=held)), fallback, target,
                             rounding)
        self.executor, self.here, self.builder = executor, here, builder

    def __call__(self, cands: Sequence[Candidate]) -> list[Spare | BaseException]:
        return list(self.executor.map_shards(
            judge_shard, self.job, [c.sites for c in cands],
            local=lambda _job, sites, _threads: judge_here(self.here, self.builder, sites)))
