"""What a bisection optimises once the search is done (`bisect --objective`, `--max-extra-ms`).

The search finds the fewest-sites set that meets the target (`--objective sites`, the default). Fewest
sites is not fastest on a board: one float Conv in the middle of an int8 chain costs two conversions, a
float head costs none. With a [cost] table in the scan's profile (quantscan.cost), this module re-chooses
among the sets the search MEASURED:

- `latency`: the one with the least estimated board time that meets the target on the held-out samples
  (the search judge's claims, bisect/finish.py: the same judgment the plan's claim reads, each set once);
- `--max-extra-ms X`: the best held-out figure among those whose estimated extra time over all-int8 is at
  most X ms (the target may then be missed: the plan's status and `objective.target_met` say so).

Under `latency` two sets the search need not have measured are candidates too (`Candidate.origin`):
every site at the fallback (no converters, the float model's accuracy) and the fewest-sites plan grown to
close the int8 islands that cost it converters (quantscan.cost.islands). Each is judged held out like a
measured set, and only when it is estimated cheaper than the fewest-sites plan.

Nothing new is measured on the searched samples; only the few candidates are judged on the held-out ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from quantscan.errors import UsageError

OBJECTIVES = ("sites", "latency")
MAX_CANDIDATES = 8
"""Held-out judgments spent on re-choosing: the cheapest (latency) or best-searched (budget) measured sets."""


@dataclass(frozen=True)
class Objective:
    """`name` sites|latency; `max_extra_ms` the estimated-time budget over all-int8 (None: no budget)."""

    name: str = "sites"
    max_extra_ms: float | None = None

    @property
    def needs_cost(self) -> bool:
        """Whether the plan is chosen by estimated time (the profile must have a [cost] table)."""
        return self.name == "latency" or self.max_extra_ms is not None

    def as_dict(self) -> dict[str, Any]:
        return {"objective": self.name, "max_extra_ms": self.max_extra_ms}

    @classmethod
    def parse(cls, name: str | None, max_extra_ms: float | None) -> Objective:
        """UsageError for an unknown objective or a negative/non-finite budget."""
        name = name or "sites"
        if name not in OBJECTIVES:
            raise UsageError(f"--objective: expected one of {', '.join(OBJECTIVES)}, found {name!r}")
        if max_extra_ms is not None and not (math.isfinite(max_extra_ms) and max_extra_ms >= 0):
            raise UsageError(f"--max-extra-ms: expected a finite number of ms >= 0, found {max_extra_ms}")
        return cls(name, None if max_extra_ms is None else float(max_extra_ms))

    @classmethod
    def stored(cls, options: Mapping[str, Any]) -> Objective | None:
        """The objective a session recorded (None in sessions older than --objective)."""
        if "objective" not in options:
            return None
        budget = options.get("max_extra_ms")
        return cls(str(options["objective"]), None if budget is None else float(budget))


@dataclass(frozen=True)
class Candidate:
    """A measured set, its search figure and its estimated extra board time over all-int8."""

    sites: tuple[str, ...]
    search_value: float
    passed: bool
    extra_ms: float
    origin: str = "measured"
    """measured (a set the search measured), every_site or closed_islands (ORIGINS)."""


ORIGINS = {
    "measured": "a set the search measured that met the target on the searched samples",
    "every_site": "every site at the fallback: no converters, the float model's accuracy",
    "closed_islands": "the fewest-sites plan grown to close the int8 islands between its float sites",
}
"""Why a candidate was judged, as plan.json's `objective.chosen.why` says it."""


@dataclass(frozen=True)
class Choice:
    """The re-chosen set and the record plan.json keeps under `objective`."""

    sites: tuple[str, ...]
    record: dict[str, Any]


def require_cost(objective: Objective, has_cost_table: bool, profile: str | None) -> None:
    """A cost objective needs estimated times: UsageError (exit 2) before any search time is spent."""
    if objective.needs_cost and not has_cost_table:
        flag = "--max-extra-ms" if objective.name == "sites" else f"--objective {objective.name}"
        raise UsageError(f"{flag}: expected a --profile with a [cost] table (e.g. rk3588), found "
                         f"{profile or 'no --profile'}{' without one' if profile else ''}")


def candidates(measured: Iterable[tuple[Sequence[str], float, bool]], extra_ms: Callable[[Sequence[str]], float],
               objective: Objective, sites_plan: Sequence[str]) -> list[Candidate]:
    """The measured sets worth a held-out judgment, best first by the objective's own order.

    latency: sets that passed on the searched samples and are estimated cheaper than the fewest-sites plan,
    cheapest first (never a dearer plan: where the fewest-sites plan misses held out, its verdict says so).
    Budget: sets within `max_extra_ms`, best searched figure first (ties: cheaper first)."""
    rows = [Candidate(tuple(sorted(s)), float(v), bool(p), float(extra_ms(s))) for s, v, p in measured
            if not math.isnan(v)]
    if objective.max_extra_ms is not None:
        within = [c for c in rows if c.extra_ms <= objective.max_extra_ms + 1e-9]
        return sorted(within, key=lambda c: (-c.search_value, c.extra_ms, len(c.sites)))[:MAX_CANDIDATES]
    ceiling = extra_ms(sites_plan)
    cheaper = [c for c in rows if c.passed and c.extra_ms < ceiling - 1e-9]
    return sorted(cheaper, key=lambda c: (c.extra_ms, len(c.sites)))[:MAX_CANDIDATES]


def choose(objective: Objective, pool: Sequence[Candidate], held_out: Callable[[Sequence[str]], float],
           target: float, sites_plan: Sequence[str], sites_extra_ms: float) -> Choice | None:
    """The set the objective picks from `pool` by its held-out figure, with plan.json's `objective` record;
    None when the fewest-sites plan stays (no candidate beats it under the objective)."""
    base: dict[str, Any] = {"objective": objective.name, "max_extra_ms": objective.max_extra_ms,
            "sites_plan": {"float_sites": len(sites_plan), "extra_ms": round(sites_extra_ms, 6)},
            "candidates_judged": len(pool)}
    judged = [(c, held_out(c.sites)) for c in pool]
    base["judged"] = [{"origin": c.origin, "float_sites": len(c.sites), "extra_ms": round(c.extra_ms, 6),
                       "held_out_value": v} for c, v in judged]  # why the winner won: the others' figures
    if objective.max_extra_ms is not None:
        sites_fit = sites_extra_ms <= objective.max_extra_ms + 1e-9
        if sites_fit:  # the fewest-sites plan fits the budget: it stays unless a set in budget is better held out
            judged.append((Candidate(tuple(sorted(sites_plan)), math.nan, True, sites_extra_ms),
                           held_out(sites_plan)))
        best = max((j for j in judged if not math.isnan(j[1])), key=lambda j: (j[1], -j[0].extra_ms), default=None)
        if best is None:
            return None
        record = {**base, "chosen": _chosen(best[0], best[1]), "target_met": bool(best[1] >= target)}
        return Choice(best[0].sites, record)
    met = [(c, v) for c, v in judged if v >= target]
    if not met:
        return None
    cheapest = min(met, key=lambda j: (j[0].extra_ms, len(j[0].sites)))
    return Choice(cheapest[0].sites, {**base, "chosen": _chosen(*cheapest), "target_met": True})


def _chosen(c: Candidate, held: float) -> dict[str, Any]:
    return {"float_sites": len(c.sites), "extra_ms": round(c.extra_ms, 6), "held_out_value": held,
            "origin": c.origin, "why": ORIGINS.get(c.origin, c.origin), "sites": list(c.sites)}


def unmeasured(pricer: Any, extra_ms: Callable[[Sequence[str]], float], sites_plan: Sequence[str],
               every_site: Sequence[str], pool: Sequence[Candidate]) -> list[Candidate]:
    """`latency`'s candidates beyond the measured sets (module docstring), those estimated cheaper than the
    fewest-sites plan and not already in `pool`; a measured set equal to one is relabelled by the caller."""
    from quantscan.cost.islands import close_islands

    ceiling = extra_ms(sites_plan)
    grown = close_islands(extra_ms, pricer.site_neighbours(), sites_plan, every_site)
    found: dict[tuple[str, ...], Candidate] = {}
    for origin, sites in (("every_site", tuple(sorted(every_site))), ("closed_islands", grown)):
        cost = extra_ms(sites)
        if sites and sites != tuple(sorted(sites_plan)) and cost < ceiling - 1e-9:
            found.setdefault(sites, Candidate(sites, math.nan, True, cost, origin))
    return list(found.values())


def _with_unmeasured(pool: list[Candidate], extra: Sequence[Candidate]) -> list[Candidate]:
    """The pool with the unmeasured candidates: a measured set equal to one keeps its searched figure and
    takes its origin (it is the same set, and why it is a candidate is the clearer story)."""
    by_sites = {c.sites: c for c in extra}
    merged = [replace(c, origin=by_sites[c.sites].origin) if c.sites in by_sites else c for c in pool]
    known = {c.sites for c in merged}
    merged += [c for c in extra if c.sites not in known]
    return sorted(merged, key=lambda c: (c.extra_ms, len(c.sites)))


MISSED_WITHIN_BUDGET = "missed_within_budget"
"""Plan status under --max-extra-ms when no measured set within the budget meets the target held out."""


def rechoose(objective: Objective, pricer: Any, fallback: str, known: Iterable[Any], sites_plan: Sequence[str],
             held_out_of: Callable[[Sequence[Sequence[str]]], Callable[[Sequence[str]], float]],
             target: float, every_site: Sequence[str] | None = None) -> tuple[Choice | None, dict[str, Any]]:
    """The objective's set among the search's measured steps (`known`: Step-likes with sites/value/passed)
    and, under `latency`, every site (`every_site`: the search's all-float set; default the pricer's sites)
    and the plan with its islands closed; priced with `pricer` (quantscan.cost.Pricer) at `fallback`;
    `held_out_of(sets)` judges those sets on the held-out samples and returns their figure. Also the record
    plan.json keeps when the plan stays."""
    base_ms = pricer.price({}).total_ms
    nodes = set(pricer.site_nodes)

    def extra_ms(sites: Sequence[str]) -> float:
        return float(pricer.price({s: fallback for s in sites if s in nodes}).total_ms - base_ms)

    pool = candidates(((s.sites, s.value, s.passed) for s in known), extra_ms, objective, sites_plan)
    if objective.name == "latency" and objective.max_extra_ms is None and sites_plan:
        every = [s for s in (pricer.site_nodes if every_site is None else every_site) if s in nodes]
        pool = _with_unmeasured(pool, unmeasured(pricer, extra_ms, sites_plan, every, pool))
    held = held_out_of([c.sites for c in pool] + [tuple(sites_plan)])
    sites_extra = extra_ms(sites_plan)
    choice = choose(objective, pool, held, target, sites_plan, sites_extra)
    stays = {"objective": objective.name, "max_extra_ms": objective.max_extra_ms,
             "sites_plan": {"float_sites": len(sites_plan), "extra_ms": round(sites_extra, 6)},
             "candidates_judged": len(pool), "chosen": None,
             "judged": [{"origin": c.origin, "float_sites": len(c.sites), "extra_ms": round(c.extra_ms, 6),
                         "held_out_value": held(c.sites)} for c in pool],
             "target_met": bool(held(sites_plan) >= target)}
    if objective.name == "latency" and sites_plan:
        stays["split"] = {**plan_split(pricer, {s: fallback for s in sites_plan if s in nodes}),
                          "whole_model_extra_ms": round(extra_ms(sorted(nodes)), 6)}
    if choice is None:
        return None, stays
    record = dict(choice.record)
    if objective.name == "latency":
        record["split"] = stays.get("split")
        record["chosen"] = {**record["chosen"],
                            "split": plan_split(pricer, {s: fallback for s in choice.sites if s in nodes})}
    return Choice(choice.sites, record), record


def plan_split(pricer: Any, plan: Mapping[str, str]) -> dict[str, Any]:
    """Where a plan's extra time goes: its kernels at the fallback, and the converters/crossings it adds."""
    base, priced = pricer.price({}), pricer.price(plan)
    return {"kernels_ms": round(priced.kernels_ms - base.kernels_ms, 6),
            "boundaries_ms": round(priced.boundaries_ms - base.boundaries_ms, 6),
            "boundaries": len(priced.boundaries) - len(base.boundaries)}


def with_objective(plan: Any, record: Mapping[str, Any] | None) -> Any:
    """The plan (records.Plan) with its `objective` record; under --max-extra-ms a chosen set that misses
    the target held out makes the status `missed_within_budget` (not reached: exit 1)."""
    if record is None:
        return plan
    plan = replace(plan, objective=dict(record))
    if record.get("max_extra_ms") is not None and not record.get("target_met", True) and plan.mode == "search":
        # the verdict's held-out wording ("met the target only on the searched samples") is of the search's
        # plan; the budget's pick is said as what it is
        text = f"not reached within the budget: {objective_line(record)}"
        verdict = {**(plan.verdict or {}), "kind": MISSED_WITHIN_BUDGET, "reached": False, "text": text}
        held = {**plan.held_out, "meets_target": False} if plan.held_out is not None else None
        plan = replace(plan, status=MISSED_WITHIN_BUDGET, reached=False, verdict=verdict, held_out=held)
    return plan


def _split_clause(split: Mapping[str, Any] | None) -> str:
    """Why the plan costs what it costs (converters against kernels), and what the whole model at the
    fallback would cost: no converters, the float model's accuracy, so a mixed plan dearer than that is not
    worth its converters (under `latency` that set is a candidate itself, judged held out)."""
    if not split:
        return ""
    line = (f"; of that, +{float(split['boundaries_ms']):.3f} ms are its {split['boundaries']} converter(s) or "
            f"crossing(s) and +{float(split['kernels_ms']):.3f} ms its kernels at the fallback")
    whole = split.get("whole_model_extra_ms")
    if whole is not None:
        line += f"; the whole model at the fallback (no converters) is estimated at +{float(whole):.3f} ms"
    return line


def objective_line(record: Mapping[str, Any] | None) -> str | None:
    """What the objective did, for the CLI: the chosen set's estimated extra ms against the fewest-sites
    plan's, or why the fewest-sites plan stayed. None under the default objective."""
    if not record or (record.get("objective") == "sites" and record.get("max_extra_ms") is None):
        return None
    what = (f"--max-extra-ms {record['max_extra_ms']:g}" if record.get("max_extra_ms") is not None
            else f"--objective {record['objective']}")
    plan = record.get("sites_plan") or {}
    fewest_ms = float(plan.get("extra_ms", math.nan))
    fewest = f"the fewest-sites plan ({plan.get('float_sites')} sites) is +{fewest_ms:.3f} ms"
    chosen = record.get("chosen")
    if not chosen:
        line = (f"{what}: {fewest}; no measured set of the {record.get('candidates_judged', 0)} judged held out "
                "beats it, so it stays")
        return line + _split_clause(record.get("split"))
    met = "" if record.get("target_met", True) else " (below the target)"
    why = f" ({chosen['why']})" if chosen.get("origin", "measured") != "measured" else ""
    return (f"{what}: chose {chosen['float_sites']} site(s){why} at +{float(chosen['extra_ms']):.3f} ms "
            f"estimated, held out {float(chosen['held_out_value']):.5f}{met}; {fewest}"
            + _split_clause(record.get("split")))
