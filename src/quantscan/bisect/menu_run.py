"""`bisect --menu`: the mixed-bit-width front (bisect/menu.py) measured on a prepared scan, and its files.

Measures with the bisection's own machinery (graph/mixed.py builds each assignment, bisect/targets.py's
evaluator runs it on the searched samples, realise.split_context holds samples out); the front's points
are re-judged on the held-out samples, which are the figures menu.json claims. With a [cost] table in the
profile each point also gets its estimated board time (quantscan.cost; its table has no int4 rate, so an
int4 site is priced as int8: the time axis does not see weight bits).
Writes menu.json, menu.csv and, for the cheapest front point that meets the target (searched), the weight
exports of weight_exports.py (`--export qdq-blocked matmulnbits`) as menu_weights_qdq.onnx /
menu_matmulnbits.onnx.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx
import pandas as pd

from quantscan.bisect import weight_exports as we
from quantscan.bisect.alternatives import int16_allowed
from quantscan.bisect.menu import Menu, MenuPoint, menu_search, pareto_front, site_menu, weight_bytes
from quantscan.bisect.menu import builder_precisions as labels_of
from quantscan.bisect.realise import split_context
from quantscan.bisect.robust import Rounding
from quantscan.bisect.state import Target
from quantscan.bisect.targets import make_evaluator
from quantscan.columns import Col
from quantscan.compat.profiles import load_profile
from quantscan.errors import UsageError
from quantscan.graph.mixed import MixedBuilder
from quantscan.runfolder import atomic_write_text, csv_text, save_model, write_json
from quantscan.scanning.gain import mixed_builder
from quantscan.scanning.prepare import ScanContext
from quantscan.schemes import ChipSchemes

MENU_EXPORTS = {"qdq-blocked": "menu_weights_qdq.onnx", "matmulnbits": "menu_matmulnbits.onnx"}


@dataclass(frozen=True)
class MenuResult:
    """What `run_menu` found: the menu, every measured point, the front (held-out figures), the pick: the
    cheapest front point meeting the target on the searched samples (picking on the held-out figures
    would make them a second search set); `reached` when its held-out figure meets it too."""

    menu: Menu
    scheme: str
    target: Target
    points: tuple[MenuPoint, ...]
    front: tuple[MenuPoint, ...]
    chosen: MenuPoint | None
    sites: tuple[str, ...]
    gains: Mapping[str, Mapping[str, float]]
    seconds: float
    split: Mapping[str, Any]

    @property
    def reached(self) -> bool:
        return self.chosen is not None and self.chosen.held_value is not None and self.target.met(
            self.chosen.held_value)

    def to_json(self) -> dict[str, Any]:
        precisions = self.menu.precisions
        return {
            "scheme": self.scheme, "menu": self.menu.to_json(), "target": self.target.as_dict(),
            "weighted_sites": list(self.sites), "evaluations": len(self.points), "seconds": self.seconds,
            "held_out": dict(self.split),
            "front": [p.to_json(precisions) for p in self.front],
            "chosen": None if self.chosen is None else self.chosen.to_json(precisions), "reached": self.reached,
            "gains": {k: dict(v) for k, v in self.gains.items()},
            "points": [{k: v for k, v in p.to_json(precisions).items() if k != "sites"} for p in self.points],
        }

    def table(self) -> pd.DataFrame:
        """menu.csv: one row per front point, cheapest first."""
        rows = [{"weight_bytes": p.bytes, **{f"sites_{k}": v for k, v in p.counts(self.menu.precisions).items()},
                 "search_value": p.value, "held_out_value": p.held_value, Col.EST_MS: p.est_ms,
                 "chosen": p is self.chosen} for p in self.front]
        return pd.DataFrame(rows)


def menu_of(ctx: ScanContext) -> Menu:
    """The menu of the scan's profile (bisect/menu.py `site_menu`)."""
    profile = load_profile(ctx.chip.profile) if ctx.chip.profile else None
    chip: ChipSchemes | None = None
    if profile is not None:
        chip = profile.chip_schemes()
    return site_menu(ctx.chip.scheme, chip, int16_ok=int16_allowed(ctx))


def weighted(builder: MixedBuilder) -> list[tuple[str, list[tuple[str, int]]]]:
    """Each site with quantized constant weights: (node, [(weight, output axis)])."""
    out = []
    for s in builder.sites:
        ws = [(w, a) for w, a in [(s.weight, s.weight_axis), *s.extra_weights]
              if w and w in builder.base_plan.weights and a is not None]
        if ws:
            out.append((s.node, ws))
    return out


def run_menu(ctx: ScanContext, target: Target, rounding: Rounding | None = None) -> MenuResult:
    """The front over the weighted sites of `ctx` under its profile's menu (module docstring)."""
    menu = menu_of(ctx)
    if len(menu.precisions) < 2:
        raise UsageError(f"--menu: expected a profile whose chip runs more than one weight precision, found "
                         f"{menu.source}")
    split = split_context(ctx, rounding or Rounding(), bool(ctx.opts.eval))
    builder = mixed_builder(split.search, "int16" if "int16" in menu.precisions else "float")
    builder.int4_group = menu.int4_group
    sites = weighted(builder)
    if not sites:
        raise UsageError("--menu: expected a model with weighted sites (Conv, Gemm, MatMul with constant "
                         "weights), found none")
    shapes = {t.name: list(t.dims) for t in builder.proto.graph.initializer}
    ws = dict(sites)
    order = [s.node for s in builder.sites]

    def bytes_of(site: str, precision: str) -> int:
        return sum(weight_bytes(shapes[w], axis, precision, menu.int4_group) for w, axis in ws[site])

    search = _judge(split.search, builder, target, order, menu)
    record = menu_search([n for n, _ in sites], menu.precisions, bytes_of, search, _pricer(ctx))
    held = _judge(split.held, builder, target, order, menu)
    front = tuple(replace(p, held_value=held(p.assignment)) for p in pareto_front(record.points))
    passing = [p for p in front if target.met(p.value)]  # chosen on the searched samples, claimed held out
    chosen = min(passing, key=lambda p: (p.bytes, -p.value)) if passing else None
    return MenuResult(menu, ctx.chip.scheme.name(), target, tuple(record.points), front, chosen,
                      tuple(n for n, _ in sites), record.gains, record.seconds, split.as_dict())


def _judge(ctx: ScanContext, builder: MixedBuilder, target: Target, order: Sequence[str], menu: Menu
           ) -> Callable[[Mapping[str, str]], float]:
    """assignment -> the target's metric on `ctx`'s evaluation set (realisation 0). The switchable graph
    holds no int4-by-site variant, so every assignment is its own model."""
    evaluator, _ = make_evaluator(ctx, builder, target, "cached_reference")  # its own QDQ model per assignment

    def value(assignment: Mapping[str, str]) -> float:
        measured = evaluator.evaluate(labels_of(order, assignment, menu))
        return float(measured.worst.get(target.key, math.nan))

    return value


def _pricer(ctx: ScanContext) -> Callable[[Mapping[str, str]], float] | None:
    """assignment -> estimated total board ms, when the profile has a [cost] table; else None."""
    if not ctx.chip.profile:
        return None
    profile = load_profile(ctx.chip.profile)
    if not profile.cost:
        return None
    from quantscan.cost import Pricer

    pricer = Pricer.of(ctx.loaded.proto, profile)
    as_cost = {"int4": "int8", "int8": "int8", "int16": "int16", "float": "float"}

    def ms(assignment: Mapping[str, str]) -> float:
        return round(pricer.price({n: as_cost[p] for n, p in assignment.items()}).total_ms, 4)

    return ms


def menu_choices(result: MenuResult, point: MenuPoint, builder_weights: Mapping[str, Sequence[str]],
                 model: onnx.ModelProto, scheme_choice: we.WeightChoice) -> dict[str, we.WeightChoice | None]:
    """Weight name -> how `point` stores it, for the weight exports: a menu site's weights by its
    precision, every other weight at the scheme's own."""
    by_precision = {"int4": we.WeightChoice(4, result.menu.int4_group), "int8": we.WeightChoice(8),
                    "int16": we.WeightChoice(16), "float": None}
    chosen: dict[str, we.WeightChoice | None] = {u.weight: scheme_choice for u in we.weight_uses(model)}
    for site, precision in point.assignment.items():
        for weight in builder_weights.get(site, ()):
            if weight in chosen:
                chosen[weight] = by_precision[precision]
    return chosen


def write_menu(result: MenuResult, ctx: ScanContext, out: Path, exports: Sequence[str] = ()) -> dict[str, Path]:
    """menu.json, menu.csv and the chosen point's weight exports (those of MENU_EXPORTS asked for)."""
    out.mkdir(parents=True, exist_ok=True)
    files = {"menu.json": out / "menu.json", "menu.csv": out / "menu.csv"}
    write_json(files["menu.json"], result.to_json())
    atomic_write_text(files["menu.csv"], csv_text(result.table()))
    wanted = [e for e in exports if e in MENU_EXPORTS]
    if result.chosen is None or not wanted:
        return files
    model = we.prepared_copy(ctx.loaded.proto)
    weights = {s.node: [w for w in [s.weight, *(n for n, _ in s.extra_weights)] if w] for s in ctx.graph.sites}
    choices = menu_choices(result, result.chosen, weights, model, we.scheme_choice(ctx.chip.scheme))
    note = (f"bisect --menu: the cheapest front point meeting {result.target.metric} >= {result.target.value} "
            f"on the searched samples ({result.chosen.held_value} held out)")
    for name in wanted:
        build = we.blocked_qdq_model if name == "qdq-blocked" else we.matmulnbits_model
        files[MENU_EXPORTS[name]] = save_model(build(model, choices, note), out / MENU_EXPORTS[name])
    return files
