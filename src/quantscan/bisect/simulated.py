"""quantscan's simulation as a bisection judge (bisect/judges.py): the default `--evaluator quantscan`.

The search's candidates are measured on the searched samples under every rounding realisation
(bisect/realise.py), one round at a time here or through the executor (bisect/batch.py); the plan's claims
are the held-out samples' (`HeldOut`: each distinct set judged once, whether the plan, a Pareto point or the
objective's re-choice asks for it). The judge owns its graph strategy (bisect/targets.graph_strategy):
chosen once per search (measured on its first evaluations, bisect/switched.py), the same in a worker as
here, and recorded in the session, which gives it back on resume; only the time an evaluation takes
depends on it, never a figure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from quantscan.bisect.batch import SimulationRound, judge_here
from quantscan.bisect.judge import JudgeSetup
from quantscan.bisect.realise import Claims, HeldOut, Judged, RealisedEvaluator
from quantscan.bisect.speculate import Spare
from quantscan.bisect.state import Candidate
from quantscan.bisect.targets import graph_strategy


class SimulatedJudge:
    """quantscan's realised roundings on the searched samples; held-out claims (module docstring)."""

    def __init__(self, setup: JudgeSetup) -> None:
        self.setup = setup
        self.search = RealisedEvaluator(setup.split.search, setup.builder, setup.target, setup.rounding,
                                        graph_strategy(setup.target, setup.graph), stop_early=True)  # realise.py
        self._held: HeldOut | None = None
        self._round = (SimulationRound(setup.executor, setup.split.search, setup.fallback, setup.target,
                                       setup.rounding, self.search, setup.builder)
                       if setup.executor is not None else None)

    @property
    def width(self) -> int:
        """The executor's workers (capped by the CPUs or the cluster), one without an executor."""
        return max(1, self.setup.executor.workers) if self.setup.executor is not None else 1

    def judge(self, prec: Sequence[str]) -> Judged:
        return self.search.judge(prec)

    def round(self, cands: Sequence[Candidate]) -> list[Spare | BaseException]:
        if self._round is None:
            return [judge_here(self.search, self.setup.builder, c.sites) for c in cands]
        if cands:
            self.search.settle(self.setup.builder.precisions(cands[0].sites))  # workers run the strategy decided here
        return self._round(cands)

    def claims(self, sets: Iterable[Iterable[str]]) -> Claims:
        """The held-out samples' figures under every realisation, on the search's graph strategy."""
        if self._held is None:
            s = self.setup
            self._held = HeldOut(s.split, s.builder, s.target, s.rounding, self.search.strategy)
        return self._held.claims(sets)

    def note(self) -> dict[str, Any]:
        """session.json: the graph strategy (given back on resume), what ran, and how often at what speed."""
        return {"graph_strategy": self.search.strategy, "evaluation_graph": self.search.graph_note(),
                "evaluation_graph_timing": self.search.graph_timing()}

    def release(self) -> None:
        self.search.release()
        if self._held is not None:
            self._held.release()
