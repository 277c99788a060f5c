"""A mixed-precision plan (plan.json) priced: its time and what it adds over all-int8, per Pareto point too.

The plan's `sites` keep their precision (`float` runs at the profile's fallback precision, `int16` at
int16); a Pareto point keeps its `sites` at the plan's fallback. Conversions at the new precision
boundaries are included (`Pricer.price`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from quantscan.columns import Col
from quantscan.cost.estimate import Pricer
from quantscan.errors import UsageError


def plan_precisions(plan: Mapping[str, Any], known: Sequence[str] = ()) -> dict[str, str]:
    """site node -> precision of a plan.json; UsageError naming a node the model does not have."""
    sites = plan.get("sites")
    if not isinstance(sites, list):
        raise UsageError(f"--plan: expected a plan.json with a 'sites' list, found {type(sites).__name__}")
    out: dict[str, str] = {}
    for site in sites:
        if not isinstance(site, Mapping) or Col.NODE not in site:
            raise UsageError(f"--plan: expected each site as {{node, precision}}, found {site!r}")
        out[str(site[Col.NODE])] = str(site.get("precision", plan.get("fallback", "float")))
    _check_known(out, known)
    return out


def _check_known(precisions: Mapping[str, str], known: Sequence[str]) -> None:
    if not known:
        return
    missing = [n for n in precisions if n not in set(known)]
    if missing:
        raise UsageError(f"--plan: expected site nodes of this model, found {len(missing)} it does not have "
                         f"(first: {missing[0]!r}); was the plan made for another model?")


def priced_plan(pricer: Pricer, plan: Mapping[str, Any], *, strict: bool = True) -> dict[str, Any]:
    """{estimated_ms, extra_ms, int8_ms, pareto: [{float_sites, sites, estimated_ms, extra_ms}]} of a plan.
    `strict`: a plan site the model does not have is an error (--plan); otherwise it is not priced. A model
    input kept float is priced as its wider read and a converter (`Pricer._input_cost`)."""
    base = pricer.price({}).total_ms
    precisions = plan_precisions(plan, pricer.site_nodes if strict else ())
    known = set(pricer.site_nodes)
    precisions = {n: p for n, p in precisions.items() if n in known}
    total = pricer.price(precisions).total_ms
    fallback = str(plan.get("fallback", "float"))
    points = []
    for point in plan.get("pareto", []) or []:
        if not isinstance(point, Mapping):
            continue
        sites = [str(s) for s in point.get("sites", []) if str(s) in set(pricer.site_nodes)]
        ms = pricer.price({s: fallback for s in sites}).total_ms
        points.append({"float_sites": point.get("float_sites", len(sites)), "sites": sites,
                       "estimated_ms": round(ms, 6), "extra_ms": round(ms - base, 6)})
    return {"int8_ms": round(base, 6), "estimated_ms": round(total, 6), "extra_ms": round(total - base, 6),
            "precisions": precisions, "pareto": points}
