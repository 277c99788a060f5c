"""How far a bisection has got, for the CLI's step lines: evaluations done, the best set, what is left."""

from __future__ import annotations

import math
from dataclasses import dataclass

from quantscan.bisect.state import Bisector


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
