"""Mixed bit widths per site (`bisect --menu`): the chip's precision menu, weight bytes, the Pareto front.

Bisect's search answers "which sites must leave the scheme" with one fallback. A chip that runs several
schemes (a profile's `[schemes]`: rk3588-llm w4a16-gN and w8a8, qnn-htp w8a8/w8a16/w4a16-g64) lets every
weighted site take any of them: {int4, int8, int16, float}. The question is then a trade-off, so the
answer is a front: for each measured assignment its output figure, the bytes its weights take, and (with
a [cost] table) the estimated board time; the points no other point beats on all of them.

The menu. A precision is offered when the profile's chip runs a scheme with those weights (int4, int8),
16-bit activations (int16), and always float; without a profile all four. What a precision means at a
site, beside the run's scheme (the `int8` label of graph/mixed.py is the scheme's own precision):
int4 = symmetric int4 weights in the chip's int4 group size; int8 = int8 weights per output channel;
int16 = int16 weights and activations (graph/mixed.py's int16: an approximation of w8a16 that errs on the
careful side for activations); float = float. The site's activations stay the scheme's except at int16 and
float. Only weighted sites (Conv/Gemm/MatMul with a constant weight) get a menu: the others hold no
weight bytes, and their precision is bisect's question, not this one.

The search (pure: `menu_search` takes callables). Measure the uniform assignments (all sites at each
precision: the ends of the front), then each site alone at each wider precision over the all-cheapest
one (its gain there). Then the multiple-choice knapsack greedy: from all-cheapest, repeatedly move the
(site, precision) with the most gain per extra weight byte, measuring the cumulative assignment after
each move (every move up to 32, else at doubling counts and every 1/16 of the moves). Evaluations:
levels + (levels - 1) x sites + the measured moves, each one model on the searched samples. The front's
points are then judged on the held-out samples (bisect/realise.py's split), the figures the file claims.

Weight bytes: int4 n/2 + 4 bytes per group scale, int8 n + 4 per output channel, int16 2n + 4 per
channel, float 2n (fp16, what NPUs keep float weights in; the ONNX file's float32 is 4n).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from quantscan.columns import Col
from quantscan.graph.mixed import W4, W8
from quantscan.schemes import ChipSchemes, Scheme

PRECISIONS = ("int4", "int8", "int16", "float")
"""The menu, cheapest weights first."""
SCALE_BYTES = 4
FLOAT_BYTES = 2
EVERY_STEP_UP_TO = 32


@dataclass(frozen=True)
class Menu:
    """The precisions a weighted site may take, cheapest first, and the builder label of each."""

    precisions: tuple[str, ...]
    labels: Mapping[str, str]
    int4_group: int | None
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"precisions": list(self.precisions), "int4_group_size": self.int4_group, "source": self.source}


def site_menu(scheme: Scheme, chip: ChipSchemes | None, int16_ok: bool = True) -> Menu:
    """The menu under the run's `scheme` and the profile's chip (None: no profile, every precision)."""
    runs = chip.schemes() if chip is not None else []
    int4_schemes = [s for s in runs if s.weights == "int4"]
    offered = {
        "int4": chip is None or bool(int4_schemes) or scheme.weights == "int4",
        "int8": chip is None or any(s.weights == "int8" for s in runs) or scheme.weights == "int8",
        "int16": int16_ok and (chip is None or any(s.activations == "int16" for s in runs)),
        "float": True,
    }
    group = scheme.group_size if scheme.weights == "int4" else next(
        (s.group_size for s in int4_schemes), scheme.group_size)
    labels = {"int4": "int8" if scheme.weights == "int4" else W4,
              "int8": W8 if scheme.weights == "int4" else "int8", "int16": "int16", "float": "float"}
    source = f"profile schemes {', '.join(chip.names)}" if chip is not None else "no --profile: every precision"
    return Menu(tuple(p for p in PRECISIONS if offered[p]), labels, group, source)


def weight_bytes(shape: Sequence[int], output_axis: int, precision: str, group: int | None) -> int:
    """Bytes one weight of `shape` takes at `precision` (module docstring)."""
    n = math.prod(shape)
    channels = shape[output_axis] if shape else 1
    if precision == "int4":
        if group:
            input_axis = 1 if output_axis == 0 else 0
            scales = n // shape[input_axis] * -(-shape[input_axis] // group)
        else:
            scales = channels
        return -(-n // 2) + SCALE_BYTES * scales
    if precision == "int8":
        return n + SCALE_BYTES * channels
    if precision == "int16":
        return 2 * n + SCALE_BYTES * channels
    return FLOAT_BYTES * n


Assignment = Mapping[str, str]
"""Weighted site node -> precision (a member of PRECISIONS)."""


@dataclass(frozen=True)
class MenuPoint:
    """One measured assignment: its figure on the searched samples, weight bytes, estimated ms."""

    assignment: Mapping[str, str]
    value: float
    bytes: int
    est_ms: float | None = None
    how: str = ""
    held_value: float | None = None

    def counts(self, precisions: Sequence[str]) -> dict[str, int]:
        return {p: sum(1 for v in self.assignment.values() if v == p) for p in precisions}

    def to_json(self, precisions: Sequence[str]) -> dict[str, Any]:
        return {"value": self.value, "held_out_value": self.held_value, "weight_bytes": self.bytes,
                Col.EST_MS: self.est_ms, "counts": self.counts(precisions), "how": self.how,
                "sites": {n: p for n, p in self.assignment.items()}}


def dominates(a: MenuPoint, b: MenuPoint) -> bool:
    """a is at least as good on every axis (figure up, bytes and ms down) and better on one."""
    ms_a, ms_b = a.est_ms, b.est_ms
    no_worse = a.value >= b.value and a.bytes <= b.bytes and (ms_a is None or ms_b is None or ms_a <= ms_b)
    better = a.value > b.value or a.bytes < b.bytes or (ms_a is not None and ms_b is not None and ms_a < ms_b)
    return no_worse and better


def pareto_front(points: Sequence[MenuPoint]) -> list[MenuPoint]:
    """The points no other point dominates (duplicate assignments once), cheapest first."""
    unique: dict[tuple[tuple[str, str], ...], MenuPoint] = {}
    for p in points:
        if not math.isnan(p.value):
            unique.setdefault(tuple(sorted(p.assignment.items())), p)
    kept = [p for p in unique.values() if not any(dominates(q, p) for q in unique.values() if q is not p)]
    return sorted(kept, key=lambda p: (p.bytes, -p.value))


@dataclass
class MenuSearch:
    """`menu_search`'s record: every measured point, each site's gain per level, evaluations, seconds."""

    points: list[MenuPoint] = field(default_factory=list)
    gains: dict[str, dict[str, float]] = field(default_factory=dict)
    """level (the wider precision, e.g. "int8") -> site -> figure gained by that site alone widening."""
    seconds: float = 0.0


def menu_search(
    sites: Sequence[str], menu: Sequence[str], bytes_of: Callable[[str, str], int],
    evaluate: Callable[[Assignment], float], ms_of: Callable[[Assignment], float] | None = None,
) -> MenuSearch:
    """The greedy walk of the module docstring over `sites` and the `menu` (cheapest first)."""
    started = time.perf_counter()
    record = MenuSearch()

    def measure(assignment: Mapping[str, str], how: str) -> MenuPoint:
        point = MenuPoint(dict(assignment), float(evaluate(assignment)),
                          sum(bytes_of(s, p) for s, p in assignment.items()),
                          None if ms_of is None else float(ms_of(assignment)), how)
        record.points.append(point)
        return point

    base = {s: menu[0] for s in sites}
    uniform = {p: measure({s: p for s in sites}, f"all {p}") for p in menu}
    floor = uniform[menu[0]].value
    for p in menu[1:]:
        record.gains[p] = {s: measure({**base, s: p}, f"{s} {p} alone").value - floor for s in sites}
    gain = {(s, p): record.gains[p][s] if p != menu[0] else 0.0 for s in sites for p in menu}
    current = dict(base)
    steps = _greedy_steps(sites, menu, gain, bytes_of)
    marks = _marks(len(steps))
    for k, (s, p) in enumerate(steps, start=1):
        current[s] = p
        if k in marks:
            measure(current, f"step {k} of {len(steps)}: {s} to {p}")
    record.seconds = round(time.perf_counter() - started, 3)
    return record


def _greedy_steps(sites: Sequence[str], menu: Sequence[str], gain: Mapping[tuple[str, str], float],
                  bytes_of: Callable[[str, str], int]) -> list[tuple[str, str]]:
    """The multiple-choice knapsack greedy: repeatedly the (site, wider precision) with the most gain per
    extra byte over the site's current precision (a site may skip a level that buys nothing), on to every
    site at the widest. Gains are each site's alone over the all-cheapest assignment (an additive
    estimate); moves no single gain supports come last, still measured: where the error comes from sites
    together (mtcnn_onet), stopping at the last positive gain left the front empty up to all-float."""
    level = {s: menu[0] for s in sites}
    steps: list[tuple[str, str]] = []
    while True:
        best: tuple[float, str, str] | None = None
        for s in sites:
            here = menu.index(level[s])
            for p in menu[here + 1:]:
                more = gain[s, p] - gain[s, level[s]]
                cost = max(bytes_of(s, p) - bytes_of(s, level[s]), 1)
                if best is None or more / cost > best[0]:
                    best = (more / cost, s, p)
        if best is None:
            return steps
        _, s, p = best
        level[s] = p
        steps.append((s, p))


def _marks(n: int) -> set[int]:
    """After which cumulative move the walk measures: every one up to EVERY_STEP_UP_TO moves, else 1, 2, 4,
    ... (the first moves buy the most) and every ceil(n / 16)-th, and n (about 16 + log2 n points: on
    MiniLM's 52 moves doubling alone left 16 -> 52 unmeasured, the stretch where the target was)."""
    if n <= EVERY_STEP_UP_TO:
        return set(range(1, n + 1))
    stride = -(-n // 16)
    marks, k = {n, *range(stride, n, stride)}, 1
    while k < n:
        marks.add(k)
        k *= 2
    return marks


def builder_precisions(site_order: Sequence[str], assignment: Assignment, menu: Menu) -> list[str]:
    """graph/mixed.py's per-site labels for an assignment (sites it does not name: the scheme's own)."""
    return [menu.labels[assignment[s]] if s in assignment else "int8" for s in site_order]
