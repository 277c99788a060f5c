"""Candidates measured under several rounding realisations, on the searched or the held-out samples.

bisect/robust.py says why and holds the arithmetic; this module runs the models: one evaluator per
realisation (the FP32 reference outputs computed once and shared), the sample split of the scan's
evaluation set, and the held-out claims of a finished search (the plan, all-int8, all-float and every
Pareto point), which are the only figures plan.json claims.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from quantscan.bisect.robust import Rounding, Spread, judging_order, scale_factors, spread_of, spread_of_values
from quantscan.bisect.state import Target
from quantscan.bisect.switched import SwitchedSession
from quantscan.bisect.targets import make_evaluator
from quantscan.calib import CalibSet
from quantscan.graph.mixed import MixedBuilder
from quantscan.heldout import split_indices
from quantscan.records import Metrics
from quantscan.scanning.gain import Evaluator, Measured, realised_builder
from quantscan.scanning.prepare import ScanContext

ROUNDING_MODEL = "activation scale x exp(spread * N(0,1)) per tensor, realisation 0 = quantscan's rounding"


@dataclass(frozen=True)
class Judged:
    """One candidate over the realisations: realisation 0's figures (or, for a candidate settled before
    realisation 0 was measured, those of the realisation that failed it), the spread, and the value the
    search compares with the target (the spread's lower bound; the nominal figure with one realisation)."""

    nominal: Measured
    spread: Spread
    value: float
    realisations: tuple[Measured, ...] = ()
    """The figures of every realisation measured, in realisation order, realisation 0 first when it was measured
    (benchmarks/plan_holdout.py compares their per-sample spread with a chip's)."""
    of: int = 0
    """How many realisations the rounding has (0: as many as measured); more than measured when the search's
    judge settled the candidate early (`RealisedEvaluator.stop_early`)."""
    shown: int = 0
    """Which realisation `nominal` is: 0, or the one that settled the candidate when realisation 0 was not
    measured (robust.judging_order measures it last)."""

    def metrics(self) -> Metrics:
        """The step's stored metrics: the nominal figures, plus the interval (and, when the candidate was settled
        before its last realisation, how many were measured: its bound is theirs; when the figures are not
        realisation 0's, `figures_realisation` says whose they are)."""
        figures = {k: v for k, v in self.nominal.worst.items() if isinstance(v, float)}
        settled = {"realisations_measured": float(len(self.realisations))} if self.settled else {}
        whose = {"figures_realisation": float(self.shown)} if self.shown else {}
        return {**figures, "lower_bound": self.spread.low, "upper_bound": self.spread.high, **settled, **whose}

    @property
    def settled(self) -> bool:
        """True when fewer realisations were measured than the rounding has: the candidate missed early."""
        return 0 < len(self.realisations) < self.of


@dataclass(frozen=True)
class SampleSplit:
    """The scan context the search measures on, and the one the claims come from."""

    search: ScanContext
    held: ScanContext
    note: str

    def as_dict(self) -> dict[str, object]:
        return {"search_samples": self.search.data.eval_set.n_samples,
                "held_out_samples": self.held.data.eval_set.n_samples, "split": self.note}


HOLD_SHARE = 8
"""The searched and the held-out samples are kept decoded when each set takes at most 1/HOLD_SHARE of the memory
budget (as the cached FP32 outputs, bisect/reference.py)."""


def _evaluated_on(ctx: ScanContext, samples: CalibSet) -> ScanContext:
    """The same scan evaluated on other samples (calibration, and so the plan, unchanged), decoded once when they
    fit their share of the memory budget.

    Why: every evaluation of a search sweeps its samples once per rounding realisation, and a selected set
    (`CalibSet.select`) decodes every file up to its last sample: PP-OCRv4 rec's 8 searched images were 15
    decodes and resizes per realisation, about 5% of an evaluation (cProfile, RESULTS.md). The arrays are
    the same ones, so the figures are too."""
    memory = ctx.data.memory
    size = sum(int(np.prod(shape, dtype=np.int64)) for shape in samples.sample_shapes().values()) * 4
    if memory is not None and size * samples.n_samples <= memory.budget_bytes // HOLD_SHARE:
        samples = samples.held()
    return replace(ctx, data=replace(ctx.data, eval_set=samples))


def split_context(ctx: ScanContext, rounding: Rounding, explicit_eval: bool) -> SampleSplit:
    """`--eval DIR`: search on the calibration set, claim on DIR. Otherwise the evaluation set is split,
    interleaved (heldout.split_indices). `--holdout none` and streaming models (`--state`: a sample's
    state comes from the one before it) keep one set for both."""
    if rounding.holdout == "none":
        return SampleSplit(ctx, ctx, "none: the search's samples are also the claimed ones")
    if ctx.opts.state:
        return SampleSplit(ctx, ctx, "none: --state models read their samples in order, they cannot be split")
    if explicit_eval and ctx.data.eval_set is not ctx.data.cset:
        return SampleSplit(_evaluated_on(ctx, ctx.data.cset), ctx, "--eval: searched on --calib, claimed on --eval")
    searched, held = split_indices(ctx.data.eval_set.n_samples)
    return SampleSplit(_evaluated_on(ctx, ctx.data.eval_set.select(searched)),
                       _evaluated_on(ctx, ctx.data.eval_set.select(held)),
                       "interleave: even samples searched, odd samples held out")


class RealisedEvaluator:
    """Measures a precision assignment under every realisation of `rounding` on `ctx`'s evaluation set,
    on the graph `strategy` names (bisect/targets.GRAPH_STRATEGIES; the figures are the same on each)."""

    def __init__(self, ctx: ScanContext, builder: MixedBuilder, target: Target, rounding: Rounding,
                 strategy: str | None = None, stop_early: bool = False) -> None:
        self.rounding = rounding
        self.target = target
        self.stop_early = stop_early
        """Stop a candidate at the first realisation that already puts its lower bound under the target (the
        search's judge; held-out claims measure every realisation). Why: the bound is a minimum over the
        realisations, so once it misses, the others cannot make it pass; the verdict is the full one's,
        the recorded bound that of the realisations measured (`Judged.metrics` says how many). Most of a
        search's candidates fail (the prefix search's lower half, nearly every prune try): 1 to 3 of 4
        evaluations each instead of 4, measured in robust.judging_order (the perturbed realisations first,
        the ones that fail a candidate most often)."""
        base, self.reference = make_evaluator(ctx, builder, target, strategy)
        self.key = base.key
        tensors = list(builder.base_plan.activations)
        self.evaluators: list[Evaluator] = [base]
        for r in range(1, rounding.realisations):
            realised = realised_builder(builder, scale_factors(tensors, r, rounding.seed, rounding.spread))
            self.evaluators.append(self.reference.for_builder(realised) if self.reference is not None
                                   else Evaluator(ctx, realised, base.key, tasks=base.tasks))

    def _switch(self) -> SwitchedSession | None:
        """The switchable session the evaluators share (None: FP32 in the graph, gain.Evaluator)."""
        return self.reference.switch if self.reference is not None else None

    def use_switchable(self, policy: str) -> None:
        """Which graph evaluations run on (bisect/switched.py): `measured`, `always` or `never`."""
        if (switch := self._switch()) is not None:
            switch.policy = policy

    @property
    def strategy(self) -> str | None:
        """The graph strategy the evaluations run on (bisect/targets.GRAPH_STRATEGIES), None while it is
        still being measured (a switchable graph that cannot be built, or FP32 outputs over their memory
        share, show at first use)."""
        if self.reference is None or (self.reference.tried and not self.reference.cached):
            return "fp32_in_graph"
        switch = self.reference.switch
        if not switch.decided:
            return None
        return "switchable" if switch.usable else "cached_reference"

    def settle(self, prec: Sequence[str]) -> None:
        """Evaluate `prec` (realisation 0, figures dropped) until the graph strategy is decided: before a
        round's candidates go to workers, which run the strategy this process measured."""
        for _ in range(3):
            if self.strategy is not None:
                return
            self.evaluators[0].evaluate(prec)

    def graph_note(self) -> str:
        """Which graph the evaluations ran on, and why (session.json `options.evaluation_graph`)."""
        if self.reference is None:
            return "per evaluation: a task-metric target reads whole outputs (gain.Evaluator)"
        if self.reference.tried and not self.reference.cached:
            return "per evaluation: the FP32 outputs do not fit their share of the memory budget"
        return self.reference.switch.note

    def release(self) -> None:
        """Free the switchable session (bisect/switched.py) and the last candidate's session once no more
        candidates come."""
        if (switch := self._switch()) is not None:
            switch.close()
        if self.reference is not None:
            self.reference.candidate.close()

    def graph_timing(self) -> dict[str, float]:
        """Evaluations on each path and their median seconds."""
        switch = self._switch()
        return switch.timings.summary() if switch is not None else {}

    def judge(self, prec: Sequence[str]) -> Judged:
        order = judging_order(len(self.evaluators)) if self.stop_early else range(len(self.evaluators))
        measured: dict[int, Measured] = {}
        for r in order:
            measured[r] = self.evaluators[r].evaluate(prec)
            more = len(measured) < len(self.evaluators)
            if self.stop_early and more and not self.target.met(self._spread(_in_order(measured)).low):
                break  # the bound only falls with more realisations (`stop_early`)
        shown = 0 if 0 in measured else r  # realisation 0's figures, or those of the realisation that failed
        spread = self._spread(_in_order(measured))
        spread = replace(spread, nominal=spread.values[sorted(measured).index(shown)])
        value = spread.low if self.rounding.realisations > 1 else float(measured[shown].worst[self.key])
        return Judged(measured[shown], spread, value, _in_order(measured), len(self.evaluators), shown)

    def _spread(self, measured: Sequence[Measured]) -> Spread:
        """The figure over the realisations measured: pooled cosines and their standard errors, or the range."""
        if self.key == "cosine" and all(m.output in m.sums and m.sums[m.output][0].size for m in measured):
            return spread_of([m.sums[m.output] for m in measured], self.rounding.z)
        return spread_of_values([float(m.worst[self.key]) for m in measured])


def _in_order(measured: Mapping[int, Measured]) -> tuple[Measured, ...]:
    """The realisations measured, in realisation order whatever order they were measured in: the spread of a
    candidate measured in full is the one the natural order gives, bit for bit."""
    return tuple(measured[r] for r in sorted(measured))


@dataclass(frozen=True)
class Claims:
    """Held-out figures of the sets a finished search reports: site tuple -> judged."""

    judged: Mapping[tuple[str, ...], Judged]
    split: SampleSplit
    rounding: Rounding

    def metrics(self, sites: Iterable[str]) -> Metrics | None:
        j = self.judged.get(tuple(sorted(sites)))
        return j.metrics() if j is not None else None

    def spread(self, sites: Iterable[str]) -> Spread | None:
        j = self.judged.get(tuple(sorted(sites)))
        return j.spread if j is not None else None

    def record(self) -> dict[str, object]:
        """plan.json's `held_out`: how the claims were measured."""
        return {**self.split.as_dict(), **self.rounding.as_dict(), "rounding_model": ROUNDING_MODEL}


class HeldOut:
    """The held-out judgments of one search: each distinct set measured once on the held-out samples under
    every realisation, however many times the plan, its Pareto points and the objective ask for it."""

    def __init__(self, split: SampleSplit, builder: MixedBuilder, target: Target, rounding: Rounding,
                 strategy: str | None) -> None:
        self.split, self.builder, self.rounding = split, builder, rounding
        self._target, self._strategy = target, strategy
        self._evaluator: RealisedEvaluator | None = None
        self.judged: dict[tuple[str, ...], Judged] = {}

    def claims(self, sets: Iterable[Iterable[str]]) -> Claims:
        """`sets` judged (those not judged before), with every set judged so far."""
        for sites in sets:
            key = tuple(sorted(sites))
            if key not in self.judged:
                if self._evaluator is None:
                    self._evaluator = RealisedEvaluator(self.split.held, self.builder, self._target, self.rounding,
                                                        self._strategy)
                self.judged[key] = self._evaluator.judge(self.builder.precisions(key))
        return Claims(dict(self.judged), self.split, self.rounding)

    def release(self) -> None:
        if self._evaluator is not None:
            self._evaluator.release()

