"""Shared helpers of the bisect tests: a synthetic metric driver for the state machine.

Not a test module (no `test_` prefix): test files import from here, never from each other.
The chain model the driver, gain and export tests run lives in `tests/builders.py`.
"""

from __future__ import annotations

from collections.abc import Callable

from quantscan.bisect import Bisector, Step

SITES = [f"s{i}" for i in range(16)]


def run(machine: Bisector, value: Callable[[frozenset[str]], float]) -> list[Step]:
    """Drive the machine to the end with a synthetic metric of the float set."""
    steps = []
    while (cand := machine.next()) is not None:
        steps.append(machine.record(value(frozenset(cand.sites))))
    return steps


def additive(weights: dict[str, float], base: float = 0.9) -> Callable[[frozenset[str]], float]:
    return lambda s: base + sum(weights.get(n, 0.0) for n in s)


