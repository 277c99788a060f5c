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
import onnx

from quantscan import graph as qgraph
from quantscan.columns import Col
from quantscan.diagnose import Cause, CauseFinding, SiteFacts, diagnose, inherited
from quantscan.diagnose.base import PairFacts
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


PAIR_WEIGHT_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
"""Ops that end the walk back from a consumer to its producer layer."""
PAIR_TRANSPARENT = frozenset({"Relu", "LeakyRelu", "PRelu", "Identity", "Dropout", "MaxPool", "AveragePool",
                              "GlobalMaxPool", "GlobalAveragePool"})
"""Ops equalization passes on Conv activations (rewrites/equalize.py HOMOGENEOUS and CHANNELWISE_POOLS)."""
PAIR_DEPTH = 6
"""Nodes walked back from a consumer's input before giving up on finding its producer layer."""


def pair_facts(site: Site, index: GraphIndex, calib: CalibStats, site_of: Mapping[str, str],
               node: onnx.NodeProto | None) -> PairFacts | None:
    """A Conv site read as the consumer of the weight layer whose channels it reads: per input channel, the
    calibrated max |x| and max |W|, and the first op between them equalization cannot pass (with a Clip's
    cap and the largest value it wrote). None for other sites or when no producer layer is near."""
    if node is None or node.op_type != "Conv" or site.weight is None or not site.inputs:
        return None
    weight = index.constant(site.weight)
    if weight is None or weight.ndim < 3:
        return None
    group = int(next((a.i for a in node.attribute if a.name == "group"), 1))
    depthwise = group > 1 and weight.shape[1] == 1 and weight.shape[0] == group
    if not (depthwise or group == 1):
        return None
    w = np.abs(weight.astype(np.float64))
    per_input = w if depthwise else np.moveaxis(w, 1, 0)  # a depthwise conv's output channel c reads input c
    w_ranges = per_input.reshape(per_input.shape[0], -1).max(axis=1)
    walked = _walk_to_producer(site.inputs[0], index, calib)
    if walked is None:
        return None
    producer, act, path = walked
    blocker = next((n for n in path if n.op_type not in PAIR_TRANSPARENT), None)
    cap, top = (_clip_cap(blocker, index), _written_max(blocker.output[0], calib)) if blocker is not None else (
        math.nan, math.nan)
    return PairFacts(site_of.get(producer.name, producer.name), act, w_ranges, depthwise,
                     blocker.op_type if blocker is not None else "", cap, top)


def _walk_to_producer(
    tensor: str, index: GraphIndex, calib: CalibStats
) -> tuple[onnx.NodeProto, np.ndarray, list[onnx.NodeProto]] | None:
    """From a consumer's data input back to the weight layer that wrote it: the layer, the per-channel
    max |x| of the first tensor on the way with calibrated channel ranges, and the nodes passed."""
    path: list[onnx.NodeProto] = []
    act: np.ndarray | None = None
    for _ in range(PAIR_DEPTH):
        if act is None and tensor in calib.channel_ranges:
            lo, hi = calib.channel_ranges[tensor].ranges()
            act = np.maximum(np.abs(lo), np.abs(hi)).astype(np.float64)
        producer = index.producer_node(tensor)
        if producer is None or not producer.input:
            return None
        if producer.op_type in PAIR_WEIGHT_OPS:
            return (producer, act, path) if act is not None else None
        path.append(producer)
        tensor = producer.input[0]
    return None


def _clip_cap(node: onnx.NodeProto, index: GraphIndex) -> float:
    """A Clip's upper bound (input 2, or the `max` attribute before opset 11); NaN for other ops."""
    if node.op_type != "Clip":
        return math.nan
    if len(node.input) > 2 and node.input[2]:
        value = index.constant(node.input[2])
        return float(np.ravel(value)[0]) if value is not None and value.size else math.nan
    return float(next((a.f for a in node.attribute if a.name == "max"), math.nan))


def _written_max(tensor: str, calib: CalibStats) -> float:
    """The largest value `tensor` took on the calibration data (its channel ranges, else its observer)."""
    if tensor in calib.channel_ranges:
        return float(np.nanmax(calib.channel_ranges[tensor].ranges()[1]))
    observer = calib.observers.get(tensor)
    return float(observer.range()[1]) if observer is not None else math.nan


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
    passes: Mapping[str, tuple[str, ...]] | None = None, pair: PairFacts | None = None,
) -> list[CauseFinding]:
    """Every cause rule's finding for one site, most urgent first (`pair`: the site as a layer pair's consumer)."""
    return diagnose(replace(site_facts(site, row, plan, calib, index, passes), pair=pair))


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
