"""Gather each site's facts for the cause rules (quantscan.diagnose) and run them.

Why here and not in the rules: the facts come from the scan's own measurements (calibration ranges,
per-channel ranges, the plan's scales, the figures in the layers row) and from the graph (does the
output reach a Softmax?); the rules stay pure numpy and testable on hand-built facts.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from quantscan import graph as qgraph
from quantscan.columns import Col
from quantscan.diagnose import Cause, CauseFinding, SiteFacts, diagnose, inherited
from quantscan.graph.index import GraphIndex
from quantscan.scanning.calibrate import CalibStats
from quantscan.scanning.site_result import Diagnosis, SiteResult
from quantscan.sites import Site

SOFTMAX_DEPTH = 4
"""How many nodes after a site its output may pass through and still count as feeding a Softmax."""
FIGURES = (Col.ISOLATED_SQNR_DB, Col.ISOLATED_COSINE, Col.CUMULATIVE_SQNR_DB, Col.CUMULATIVE_COSINE)


def feeds_softmax(index: GraphIndex, tensor: str, depth: int = SOFTMAX_DEPTH) -> bool:
    """Whether `tensor` reaches a Softmax/LogSoftmax within `depth` nodes."""
    queue: deque[tuple[str, int]] = deque([(tensor, 0)])
    seen: set[str] = set()
    while queue:
        name, d = queue.popleft()
        if name in seen or d >= depth:
            continue
        seen.add(name)
        for user in index.users(name):
            if user.op_type in ("Softmax", "LogSoftmax"):
                return True
            queue.extend((o, d + 1) for o in user.output if o)
    return False


def _implied_range(plan: qgraph.QuantPlan, tensor: str) -> tuple[float, float] | None:
    """The range a tensor's quantization covers (what calibration settled on)."""
    qp = plan.activations.get(tensor)
    if qp is None:
        return None
    scale, zp = float(np.ravel(qp.scale)[0]), int(np.ravel(qp.zero_point)[0])
    return (qp.qmin - zp) * scale, (qp.qmax - zp) * scale


def no_latency_passes(index: GraphIndex) -> dict[str, tuple[str, ...]]:
    """tensor -> the no-latency rewrites that can rescale its channels (computed once per scan)."""
    from quantscan.rewrites.equalize import equalized_tensors
    from quantscan.rewrites.smooth import smoothable_tensors

    out: dict[str, tuple[str, ...]] = {}
    for name, tensors in (("smooth", smoothable_tensors(index)), ("equalize", equalized_tensors(index))):
        for t in tensors:
            out[t] = (*out.get(t, ()), name)
    return out


def site_facts(
    site: Site, row: Mapping[str, Any], plan: qgraph.QuantPlan, calib: CalibStats, index: GraphIndex,
    passes: Mapping[str, tuple[str, ...]] | None = None,
) -> SiteFacts:
    """One site's facts: measured ranges first, the plan's implied range where none was measured."""
    ch = calib.channel_ranges.get(site.output)
    ch_lo, ch_hi = ch.ranges() if ch is not None else (np.zeros(0), np.zeros(0))
    finite = np.isfinite(ch_lo) & np.isfinite(ch_hi)
    implied = _implied_range(plan, site.output) or (math.nan, math.nan)
    lo, hi = (float(ch_lo[finite].min()), float(ch_hi[finite].max())) if finite.any() else implied
    qp = plan.activations.get(site.output)
    inputs = {}
    for t in site.inputs:
        r = _implied_range(plan, t)
        if r is not None:
            inputs[t] = r
    return SiteFacts(
        node=site.node, op_type=site.op_type, output=site.output, lo=lo, hi=hi,
        scale=float(np.ravel(qp.scale)[0]) if qp is not None else math.nan,
        zero_point=int(np.ravel(qp.zero_point)[0]) if qp is not None else 0,
        qmin=qp.qmin if qp is not None else 0, qmax=qp.qmax if qp is not None else 255,
        ch_lo=np.asarray(ch_lo, dtype=np.float64), ch_hi=np.asarray(ch_hi, dtype=np.float64),
        input_ranges=inputs,
        figures={k: float(row[k]) for k in FIGURES if k in row},
        feeds_softmax=feeds_softmax(index, site.output),
        passes=(passes or {}).get(site.output, ()),
        kernel=site.kernel,
    )


def diagnosis_of(findings: list[CauseFinding]) -> Diagnosis:
    """One site's diagnosis cells: the first (most urgent) finding, the others counted."""
    if not findings:
        return Diagnosis()
    first = findings[0]
    others = ", ".join(f.cause.value for f in findings[1:])
    more = f" (+{len(findings) - 1} more: {others})" if others else ""
    return Diagnosis(first.text() + more, first.cause.value, _fix_label(first), first.tier)


def _fix_label(finding: CauseFinding) -> str:
    """`rewrite clamp-mask`, `calibration percentile`, `int16` (the kind alone when it says it all)."""
    kind, value = finding.fix.kind.value, finding.fix.value
    return kind if kind == value else f"{kind} {value}"


def run_cause_rules(
    site: Site, row: Mapping[str, Any], plan: qgraph.QuantPlan, calib: CalibStats, index: GraphIndex,
    passes: Mapping[str, tuple[str, ...]] | None = None,
) -> list[CauseFinding]:
    """Every cause rule's finding for one site, most urgent first."""
    return diagnose(site_facts(site, row, plan, calib, index, passes))


def upstream_sites(
    index: GraphIndex, site: Site, site_of: Mapping[str, str], input_of: Mapping[str, str] | None = None
) -> set[str]:
    """Sites (by their `node`) whose output reaches this site's inputs, through any path; `input_of`
    (tensor -> a model input's site, sites.input_sites) names the inputs it starts from."""
    found: set[str] = set()
    seen: set[str] = set()
    todo = list(site.inputs)
    while todo:
        tensor = todo.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        if input_of and tensor in input_of and input_of[tensor] != site.node:
            found.add(input_of[tensor])
        producer = index.producer_node(tensor)
        if producer is None:
            continue
        owner = site_of.get(producer.name)
        if owner is not None and owner != site.node:
            found.add(owner)
        todo.extend(i for i in producer.input if i)
    return found


def with_inherited(
    results: Sequence[SiteResult],
    sites: Sequence[Site],
    plan: qgraph.QuantPlan,
    calib: CalibStats,
    index: GraphIndex,
    gains: Mapping[str, float],
) -> list[SiteResult]:
    """Rerun the cause rules, now with measured gains, on sites whose error looks inherited, so the
    inherited-error rule can name the upstream site responsible (diagnose.inherited)."""
    by_node = {s.node: s for s in sites}
    site_of = {n: s.node for s in sites for n in s.nodes}
    input_of = {t: s.node for s in sites if s.is_input for t in (s.output, *s.shares)}
    out = []
    for result in results:
        site = by_node.get(result.node)
        iso = result.isolated.sqnr_db if result.isolated is not None else math.nan
        if site is None or not inherited.looks_inherited(iso, result.cumulative.sqnr_db):
            out.append(result)
            continue
        ups = {u: gains[u] for u in upstream_sites(index, site, site_of, input_of) if u in gains}
        facts = site_facts(site, result.figures(), plan, calib, index)
        own = {Col.GAIN_IF_FLOAT: float(gains[site.node])} if site.node in gains else {}
        findings = diagnose(replace(facts, upstream_gains=ups, figures={**facts.figures, **own}))
        named = [f for f in findings if f.cause is Cause.INHERITED]
        if named:
            reason = named[0].reason if result.cause == "inherited" else result.reason
            result = replace(result, diagnosis=diagnosis_of(findings), reason=reason)
        out.append(result)
    return out
