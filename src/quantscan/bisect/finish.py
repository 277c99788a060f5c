"""The plan from a finished search: its claims (the judge's), the objective's re-choice, the toolchain's
check, the "cannot be int8" verdict, and the files.

The claims come from the search's judge (bisect/judges.py): held-out figures under quantscan's roundings, or
none when a toolchain measured the search (its own figures on the search's samples are the plan's). The
objective (bisect/objective.py) re-chooses among measured sets by those same claims: each set is judged
held out once, whichever asks first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx
import pandas as pd

from quantscan.bisect.alternatives import measure_alternatives
from quantscan.bisect.external import verify as verify_plan
from quantscan.bisect.objective import MISSED_WITHIN_BUDGET, Choice, Objective, rechoose, with_objective
from quantscan.bisect.plan import SummaryBlock, board_shapes, build_plan, held_out_warning, write_plan
from quantscan.bisect.realise import Claims
from quantscan.bisect.search import Search, steps_of
from quantscan.bisect.session import BisectSession
from quantscan.bisect.speculate import SpeculativeFeed
from quantscan.bisect.state import BUDGET, METRICS, Bisector, Outcome, Step
from quantscan.bisect.targets import gain_key
from quantscan.bisect.verdict import Verdict, cannot_be_int8, cause_text
from quantscan.columns import Col
from quantscan.records import Plan
from quantscan.runfolder import save_model
from quantscan.scanning.prepare import ScanContext


@dataclass
class BisectResult:
    """What `run_bisect` found. `reached` False means exit code 1 for the CLI (no plan meets the target)."""

    plan: Plan
    gains: pd.DataFrame
    steps: list[Step]
    outcome: Outcome
    session_path: Path | None
    qdq_model: onnx.ModelProto | None
    files: dict[str, Path]
    warnings: list[str]

    @property
    def reached(self) -> bool:
        """The plan's verdict (bisect/verdict.py): met on the held-out samples, not only the searched ones."""
        return self.plan.reached


def finish(search: Search, session: BisectSession, path: Path | None, feed: SpeculativeFeed, seconds: float,
           summary_block: SummaryBlock | None) -> BisectResult:
    """The plan of the finished search (module docstring), written when the request names `out`."""
    ctx, builder, machine, target, request = search.ctx, search.builder, feed.machine, search.target, search.request
    outcome = machine.outcome
    assert outcome is not None
    chosen = set(outcome.sites) if outcome.status in ("reached", "already_met", BUDGET) else set()
    chosen |= machine.keep_float if outcome.status == "already_met" else set()
    picked, objective_record = _objective_choice(search, machine, session, chosen)
    chosen = set(picked.sites) if picked is not None else chosen
    prec = builder.precisions(chosen)
    ceiling = [n for n in machine.order if n not in machine.force_quant]
    claims = search.judge.claims([(), ceiling, tuple(chosen), *(p.sites for p in machine.pareto())])
    plan = build_plan(ctx, builder, machine, session, target, prec, steps_of(machine), seconds, claims,
                      achieved_sites=picked.sites if picked is not None else None)
    if feed.width > 1 and feed.counts is not None:
        plan = replace(plan, speculation=feed.counts.as_dict(len(feed.spare)))
    chain = search.chain
    if chain is not None and request.verify:
        plan = verify_plan(plan, ctx, builder.precisions, chain, search.pool)
    vendor_names = {chain.export: chain.names_for(plan.sites)} if chain is not None else None  # its own export only
    plan = with_int8_verdict(plan, search, claims, session.gain)
    plan = with_objective(plan, objective_record)
    warning = held_out_warning(plan) if plan.status != MISSED_WITHIN_BUDGET else None  # said by the verdict
    qdq = builder.model(prec)
    files: dict[str, Path] = {}
    if request.save_qdq is not None:
        files["qdq"] = save_model(qdq, request.save_qdq, protect=[ctx.loaded.path], flag="--save-qdq",
                                  force=ctx.opts.force)
    if request.out is not None:
        files.update(write_plan(plan, session, request.out, request.exports, ctx.loaded.proto, summary_block,
                                vendor_names))
    warnings = [*ctx.warnings, *([warning] if warning else [])]
    return BisectResult(plan, pd.DataFrame(session.gain), steps_of(machine), outcome, path, qdq, files, warnings)


def _objective_choice(search: Search, machine: Bisector, session: BisectSession,
                      chosen: set[str]) -> tuple[Choice | None, dict[str, Any] | None]:
    """`--objective latency` / `--max-extra-ms`: the measured set the objective picks by the judge's claims
    (bisect/objective.py), and plan.json's `objective` record; (None, record) otherwise (a toolchain-judged
    search has no held-out claims to re-choose by)."""
    objective = Objective.stored(session.options) or Objective()
    probe = search.judge.claims([]) if objective.needs_cost else None  # judges nothing: None without claims
    if probe is None:
        return None, objective.as_dict() if "objective" in session.options else None
    from quantscan.compat.profiles import load_profile
    from quantscan.cost import Pricer

    ctx, out = search.ctx, search.request.out
    pricer = Pricer.of(ctx.loaded.proto, load_profile(str(ctx.chip.profile)),
                       board_shapes(session, out) if out is not None else None)
    key = METRICS[search.target.metric]

    def held_out_of(sets: Sequence[Sequence[str]]) -> Callable[[Sequence[str]], float]:
        claims = search.judge.claims(sets)
        assert claims is not None
        return lambda sites: float((claims.metrics(sites) or {}).get(key, math.nan))

    every_site = [n for n in machine.order if n not in machine.force_quant]  # the search's all-float set
    return rechoose(objective, pricer, search.builder.fallback, machine.known.values(), sorted(chosen), held_out_of,
                    search.target.value, every_site)


def with_int8_verdict(plan: Plan, search: Search, claims: Claims | None, gains: Sequence[Mapping[str, Any]]) -> Plan:
    """A plan keeping more than half the sites above int8 gets the "cannot be int8" verdict: its cause
    (the output head or a chain, from the output gains) and the measured alternatives (bisect/alternatives.py,
    a calibration pass each: only for such plans, and only with held-out `claims`, whose samples and roundings
    they are measured on; a toolchain-judged plan gets the verdict and its cause, its figures being the
    toolchain's)."""
    if plan.verdict is None:  # a toolchain measured the search: no held-out claims to judge
        text = f"{plan.status}: measured by the toolchain on the search's samples (no held-out split)"
        plan = replace(plan, verdict=Verdict(plan.status, plan.reached, text, plan.status, len(plan.sites),
                                             plan.site_count).to_json())
    assert plan.verdict is not None
    if not cannot_be_int8(len(plan.sites), plan.site_count):
        return plan
    ctx, target = search.ctx, search.target
    key = gain_key(target)
    heads = set(ctx.headline_outputs())
    head = next((s.node for s in ctx.graph.sites if s.output in heads), None)
    head_range = _calibrated_range(ctx, next(s.output for s in ctx.graph.sites if s.node == head)) if head else None
    cause = cause_text(gains, head, head_range, float((plan.all_int8 or {}).get(key, math.nan)),
                       float((plan.all_float or {}).get(key, math.nan)), Col.GAIN_IF_FLOAT)
    alternatives = (measure_alternatives(ctx, claims.split, search.builder, target, claims.rounding, plan)
                    if claims is not None else ())
    verdict = Verdict(**{**{k: v for k, v in plan.verdict.items() if k in _VERDICT_KEYS},
                         "cannot_be_int8": True, "why": cause, "alternatives": alternatives})
    return replace(plan, verdict=verdict.to_json())


_VERDICT_KEYS = ("kind", "reached", "text", "search_status", "float_sites", "site_count", "undecided")


def _calibrated_range(ctx: ScanContext, tensor: str) -> tuple[float, float] | None:
    """The calibrated [min, max] of a tensor, None when no observer saw it."""
    observer = ctx.quant.calib_stats.observers.get(ctx.graph.origins.get(tensor, tensor))
    if observer is None:
        return None
    low, high = observer.range()
    return float(low), float(high)

