"""The `Judge` protocol of a bisection and what a judge is made from (the registry: bisect/judges.py).

Its own module so that the judges (bisect/simulated.py, bisect/external.py) and the registry that makes
them import it, and not each other: no import cycle, lazy or not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from quantscan.bisect.external import BuildPool
    from quantscan.bisect.realise import Claims, Judged, SampleSplit
    from quantscan.bisect.robust import Rounding
    from quantscan.bisect.speculate import Spare
    from quantscan.bisect.state import Candidate, Target
    from quantscan.executors import Executor
    from quantscan.graph.mixed import MixedBuilder


@dataclass(frozen=True)
class JudgeSetup:
    """What a judge is made from: the samples (searched and held out), the mixed-precision builder, the
    target and the roundings, and where rounds run (`executor`, `workers`; `pool`: the toolchain's builds)."""

    split: SampleSplit
    builder: MixedBuilder
    target: Target
    rounding: Rounding
    fallback: str
    graph: str | None
    """The simulation's graph strategy a resumed session recorded (None: the judge chooses, once)."""
    pool: BuildPool | None
    executor: Executor | None
    workers: int


class Judge(Protocol):
    """Measures the candidates of one search (bisect/judges.py says what each method answers)."""

    @property
    def width(self) -> int:
        """How many candidates a round measures at once."""
        ...

    def judge(self, prec: Sequence[str]) -> Judged:
        """One candidate as the search compares it with the target."""
        ...

    def round(self, cands: Sequence[Candidate]) -> list[Spare | BaseException]:
        """A round's candidates, each measured or the error its measurement raised, in order."""
        ...

    def claims(self, sets: Iterable[Iterable[str]]) -> Claims | None:
        """The held-out figures of `sets` (each distinct set judged once per search), or None when the
        search's own figures are the claims."""
        ...

    def note(self) -> dict[str, Any]:
        """What session.json's options record about how this judge measured."""
        ...

    def release(self) -> None:
        """Free what only evaluations need (they are rebuilt on the next evaluation)."""
        ...
