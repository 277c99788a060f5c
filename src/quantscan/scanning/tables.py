"""The scan's tables (layers, tensors, ops, channels): rows from the accumulators, each site's cause, the rank.

`classify` says whether a site's error is its own (intrinsic), inherited from upstream, or small;
the rank orders sites by the error each makes itself (see report.summary's RANK_DOC); with a chip
profile, `with_profile` merges the compat findings and CPU placement into the layers table and
ranks in tiers. DataFrames, because they are what the CSV files hold.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx
import pandas as pd

from quantscan import graph as qgraph
from quantscan import metrics as qm
from quantscan import quant
from quantscan.columns import Col
from quantscan.diagnose import Cause, human
from quantscan.diagnose.absurd_scale import BOUNDED
from quantscan.graph.index import GraphIndex
from quantscan.model import LoadedModel, PreparedModel
from quantscan.patterns import softmax
from quantscan.records import Placement, Severity, severity_rank
from quantscan.scanning.calibrate import CalibStats
from quantscan.scanning.causes import diagnosis_of, no_latency_passes, pair_facts, run_cause_rules
from quantscan.scanning.evaluate import Evaluation
from quantscan.scanning.prepare import ScanContext
from quantscan.scanning.probe import Probe
from quantscan.scanning.site_result import (
    ActivationFigures,
    ChipPlacement,
    CumulativeFigures,
    IsolatedFigures,
    IsolatedSplit,
    SiteResult,
    WeightFigures,
    layers_frame,
    ranked,
    sort_value,
)
from quantscan.sites import Site

INTRINSIC_SQNR_DB = 25.0
"""Below this isolated SQNR (≈ 4 effective bits lost from int8's ~48 dB) a site's error is its own."""
WORST_CHANNEL_SQNR_DB = 12.0
"""Below this per-channel SQNR some channel keeps fewer than ~2 useful bits under a per-tensor scale."""
WEIGHT_WORST_CHANNEL_SQNR_DB = 20.0
"""Below this a weight channel holds outliers that a symmetric per-channel int8 scale cannot serve."""


def _weight_stats(prepared: PreparedModel, site: Site, plan: qgraph.QuantPlan) -> WeightFigures:
    if not site.weight or site.weight not in plan.weights:
        return WeightFigures()
    w_init = next(t for t in prepared.proto.graph.initializer if t.name == site.weight)
    w = onnx.numpy_helper.to_array(w_init).astype(np.float32)
    wq = plan.weights[site.weight]
    fq = quant.dequantize(wq.values, wq.qparams)
    axis = wq.qparams.axis if wq.qparams.axis is not None else 0
    if wq.qparams.block_size:  # blocked along the input axis: channel figures still per output channel
        axis = site.weight_axis if site.weight_axis is not None else 0
    if w.ndim <= axis:  # a scalar weight (quantize_static quantizes an Add's epsilon): one channel
        w, fq, axis = w.reshape(1, -1), np.asarray(fq, np.float32).reshape(1, -1), 0
    acc = qm.ErrorAccumulator()
    acc.update(w[None], fq[None])
    ch = qm.ChannelErrorAccumulator(axis)
    ch.update(w, fq)
    others = tuple(i for i in range(w.ndim) if i != axis)
    absmax = np.abs(w).max(axis=others)
    nonzero = absmax[absmax > 0].astype(np.float64)
    spread = float(nonzero.max() / nonzero.min()) if nonzero.size >= 2 else 1.0
    return WeightFigures(acc.sqnr_db, ch.worst_channel_sqnr_db, spread)


@dataclass
class ScanTables:
    """What pass 2's accumulators become: one `SiteResult` per site (rank order), tensors.csv,
    channels.csv, and ops.csv (the sites grouped by op type)."""

    sites: list[SiteResult]
    tensors: pd.DataFrame
    ops: pd.DataFrame
    channels: pd.DataFrame


def build_tables(
    loaded: LoadedModel,
    prepared: PreparedModel,
    sites: Sequence[Site],
    plan: qgraph.QuantPlan,
    calib_stats: CalibStats,
    ev: Evaluation,
    order: Mapping[str, int],
    probe: Probe,
) -> ScanTables:
    """The site records (classified, diagnosed, ranked) and the tensors, ops and channels tables."""
    original_tensors = {o for n in loaded.proto.graph.node for o in n.output} | set(loaded.outputs)
    producers = {o: n for n in prepared.proto.graph.node for o in n.output}
    index = GraphIndex(prepared.proto.graph)
    passes: dict[str, tuple[str, ...]] | None = None
    by_name = {n.name: n for n in prepared.proto.graph.node}
    site_of = {n: s.node for s in sites for n in s.nodes}
    results = []
    for k, site in enumerate(sites):
        result = measured_site(site, k, prepared, plan, calib_stats, ev, order, producers)
        pair = pair_facts(site, index, calib_stats, site_of, by_name.get(site.nodes[0]) if site.nodes else None)
        findings = run_cause_rules(site, result.figures(), plan, calib_stats, index, pair=pair)
        if any(f.cause is Cause.OUTLIER_CHANNELS for f in findings):  # name a no-latency rewrite if one applies
            passes = no_latency_passes(index) if passes is None else passes
            findings = run_cause_rules(site, result.figures(), plan, calib_stats, index, passes, pair)
        result = replace(result, diagnosis=diagnosis_of(findings))
        if findings and findings[0].tier < 2:  # figures meaningless or scale absurd: the site's own fault
            result = replace(result, cause="intrinsic", reason=findings[0].reason)
        results.append(result)
    results = rank_sites(results)
    tensors = tensor_table(prepared, ev, original_tensors, probe, producers)
    return ScanTables(results, tensors, ops_table(layers_frame(results)), channel_table(sites, plan, calib_stats, ev))


def measured_site(
    site: Site, k: int, prepared: PreparedModel, plan: qgraph.QuantPlan, calib_stats: CalibStats, ev: Evaluation,
    order: Mapping[str, int], producers: Mapping[str, onnx.NodeProto],
) -> SiteResult:
    """Site `k`'s figures from the accumulators, classified (`cause`, `reason`); not yet diagnosed or ranked."""
    cum = ev.cumulative.get(site.output)
    iso = ev.isolated.get(k)
    act = ev.act_channel.get(k)
    ch_range = calib_stats.channel_ranges.get(site.output)
    qp = plan.activations.get(site.output)
    result = SiteResult(
        node=site.node, op_type=site.op_type, kernel=site.kernel, order=order.get(site.node, -1),
        output=site.output, inputs=tuple(site.inputs),
        isolated=IsolatedFigures(iso.cosine, iso.sqnr_db, iso.max_abs) if iso else IsolatedFigures(),
        cumulative=_cumulative(cum),
        input_sqnr_db=_input_sqnr(site, ev, producers),
        eval_clip_fraction=ev.clip_fraction.get(site.output, math.nan),
        activation=ActivationFigures(
            worst_channel_sqnr_db=act.worst_channel_sqnr_db if act else math.nan,
            channel_range_spread=ch_range.spread() if ch_range else math.nan,
            dead_channels=ch_range.dead() if ch_range else 0,
            scale=float(qp.scale) if qp is not None else math.nan,
            zero_point=int(qp.zero_point) if qp is not None else 0,
        ),
        weight=_weight_stats(prepared, site, plan),
        sensitive_op=site.sensitive,
        split=_split(ev, k),
    )
    cause, reason = classify(result.figures())
    return replace(result, cause=cause, reason=reason)


def _split(ev: Evaluation, k: int) -> IsolatedSplit | None:
    """Site k's weight-only and activation-only isolated figures, when pass 2 measured them."""
    w, a = ev.isolated_split.get((k, qgraph.WEIGHT_ONLY)), ev.isolated_split.get((k, qgraph.ACT_ONLY))
    if w is None or a is None:
        return None
    return IsolatedSplit(IsolatedFigures(w.cosine, w.sqnr_db, w.max_abs),
                         IsolatedFigures(a.cosine, a.sqnr_db, a.max_abs))


def _cumulative(cum: Any) -> CumulativeFigures:
    """A tensor's cumulative accumulator as figures (all NaN when pass 2 did not compare it)."""
    if cum is None:
        return CumulativeFigures()
    return CumulativeFigures(cum.cosine, cum.sqnr_db, cum.mse, cum.max_abs, cum.worst_sample_cosine)


def channel_table(
    sites: Sequence[Site], plan: qgraph.QuantPlan, calib_stats: CalibStats, ev: Evaluation
) -> pd.DataFrame:
    """channels.csv: per site, each activation channel's range and SQNR, each weight channel's absmax."""
    channel_rows = []
    for k, site in enumerate(sites):
        ch_range = calib_stats.channel_ranges.get(site.output)
        act = ev.act_channel.get(k)
        if ch_range is not None:
            lo, hi = ch_range.ranges()
            ranges = ch_range.widths()
            sq = act.per_channel_sqnr_db() if act else np.full(len(ranges), math.nan)
            for c in range(len(ranges)):
                channel_rows.append({Col.NODE: site.node, Col.OUTPUT: site.output, "channel": c,
                                     "act_min": lo[c], "act_max": hi[c], "act_range": ranges[c],
                                     "act_sqnr_db": sq[c] if c < len(sq) else math.nan})
        wq = plan.weights.get(site.weight or "")
        if wq is not None:
            for c, s in enumerate(quant.channel_absmax(wq.qparams, site.weight_axis)):
                channel_rows.append({Col.NODE: site.node, Col.OUTPUT: site.output, "channel": c,
                                     "weight_absmax": float(s)})
    channels = pd.DataFrame(channel_rows)
    if not channels.empty:
        channels = channels.groupby([Col.NODE, Col.OUTPUT, "channel"], as_index=False, sort=False).first()
    return channels


def _worst_findings(ctx: ScanContext) -> dict[str, dict[str, Any]]:
    """node -> its most severe finding for the scan's profile."""
    findings = ctx.compat.findings
    rows = findings[findings["profile"] == ctx.chip.profile] if not findings.empty else findings
    worst: dict[str, dict[str, Any]] = {}
    for r in rows.to_dict("records"):
        node = r.get(Col.NODE) or ""
        if not node:
            continue
        if node not in worst or severity_rank(r["severity"]) > severity_rank(worst[node]["severity"]):
            worst[node] = r
    return worst


def _island_sizes(ctx: ScanContext) -> dict[str, int]:
    parts = ctx.compat.partitions
    sizes: dict[str, int] = {}
    if parts.empty:
        return sizes
    for r in parts[parts["profile"] == ctx.chip.profile].to_dict("records"):
        for node in str(r.get("nodes") or "").split(";"):
            if node:
                sizes[node] = int(r["n_nodes"])
    return sizes


def with_profile(results: Sequence[SiteResult], ctx: ScanContext, ev: Evaluation) -> list[SiteResult]:
    """Each site's placement and most severe compat finding, a row per CPU-placed node, the tiered rank."""
    worst = _worst_findings(ctx)
    site_nodes = {s.node: s.nodes for s in ctx.graph.sites}
    placed = []
    for r in results:
        found = [worst[n] for n in site_nodes.get(r.node, [r.node]) if n in worst]
        found.sort(key=lambda f: -severity_rank(f["severity"]))
        first = found[0] if found else {}
        placed.append(replace(r, chip=ChipPlacement(Placement.NPU.value, first.get("rule", ""), first.get("fix", ""),
                                                    first.get("severity", ""))))
    sizes = _island_sizes(ctx)
    placed.extend(_cpu_rows(ctx, ev, worst, sizes))

    def tiered(r: SiteResult) -> tuple[float, ...]:
        assert r.chip is not None
        if r.chip.severity == Severity.ERROR:
            tier = 0
        elif r.cause == "intrinsic" or (r.chip.placement == Placement.CPU and sizes.get(r.node, 1) <= 2):
            tier = 1
        else:
            tier = 2
        iso = r.isolated.sqnr_db if r.isolated is not None else None
        return (tier, r.diagnosis.tier, sort_value(iso), sort_value(r.cumulative.sqnr_db))

    return ranked(placed, tiered)


def _cpu_rows(
    ctx: ScanContext, ev: Evaluation, worst: Mapping[str, Mapping[str, Any]], sizes: Mapping[str, int],
) -> list[SiteResult]:
    """A row per node the profile runs on the CPU in float: no quantization, only its cumulative figures."""
    prepared_nodes = {n.name: n for n in ctx.graph.prepared.proto.graph.node}
    rows = []
    for name in sorted(ctx.chip.cpu_nodes, key=lambda n: ctx.graph.order.get(n, -1)):
        node = prepared_nodes.get(name)
        if node is None or not node.output or node.output[0] not in ctx.graph.probe.float_tensors:
            continue
        finding = worst.get(name, {})
        rows.append(SiteResult(
            node=name, op_type=node.op_type, kernel=node.op_type, order=ctx.graph.order.get(name, -1),
            output=node.output[0], inputs=None, isolated=None,
            cumulative=_cumulative(ev.cumulative.get(node.output[0])),
            input_sqnr_db=None, eval_clip_fraction=None, activation=None, weight=None, sensitive_op=False,
            cause="cpu-fallback",
            reason=f"runs on the CPU in float ({finding.get('rule', 'profile')}); "
                   f"island of {sizes.get(name, 1)} node(s)",
            chip=ChipPlacement(Placement.CPU.value, finding.get("rule", ""), finding.get("fix", ""),
                               finding.get("severity", "")),
        ))
    return rows


def _input_sqnr(site: Site, ev: Evaluation, producers: Mapping[str, onnx.NodeProto]) -> float:
    """Worst cumulative SQNR among the site's inputs: the error it inherits."""
    values = [ev.cumulative[i].sqnr_db for i in site.inputs if i in ev.cumulative]
    return min(values) if values else math.inf


def classify(row: Mapping[str, Any]) -> tuple[str, str]:
    """(cause, reason): is the site's error its own, inherited, or small? One line, for summary.md.

    Only measurements make a site intrinsic: `sensitive_op` (an op type that is often fragile in int8)
    names the op in the reason of a site the figures already condemn, never condemns one by itself. A
    Softmax at 64 dB isolated SQNR is fine, and labelling it intrinsic put it (tier 1 with a profile)
    above a 27 dB Gemm that actually loses precision.
    """
    iso = row[Col.ISOLATED_SQNR_DB]
    worst_ch = row[Col.ACT_WORST_CHANNEL_SQNR_DB]
    spread = row[Col.ACT_CHANNEL_RANGE_SPREAD]
    wworst = row[Col.WEIGHT_WORST_CHANNEL_SQNR_DB]
    cum = row[Col.CUMULATIVE_SQNR_DB]
    inherited = row[Col.CUMULATIVE_INPUT_SQNR_DB]
    reasons = []
    if _lt(worst_ch, WORST_CHANNEL_SQNR_DB) and _gt(spread, 10) and not _bounded(row):
        reasons.append(
            f"activation channel ranges span {human(spread)}x: "
            f"per-tensor int8 leaves {worst_ch:.1f} dB on the worst channel"
        )
    if _lt(wworst, WEIGHT_WORST_CHANNEL_SQNR_DB):
        reasons.append(f"weight worst channel {wworst:.1f} dB (outlier weights within a channel)")
    if _lt(iso, INTRINSIC_SQNR_DB):
        reasons.insert(0, f"isolated SQNR {iso:.1f} dB: this kernel alone loses precision")
    if reasons and row.get(Col.SENSITIVE_OP):  # a measured problem at an op type known to be fragile
        reasons.append("int8-sensitive op")
    if reasons:
        return "intrinsic", "; ".join(reasons)
    if _lt(cum, INTRINSIC_SQNR_DB) and not _lt(iso, INTRINSIC_SQNR_DB):
        return "inherited", (
            f"isolated {iso:.1f} dB is fine; cumulative {cum:.1f} dB comes from upstream (inputs at {inherited:.1f} dB)"
        )
    return "ok", f"isolated {iso:.1f} dB, cumulative {cum:.1f} dB"


def _bounded(row: Mapping[str, Any]) -> bool:
    """A Softmax/Sigmoid-like output: its range is the op's own ([0, 1]), so channels of near-zero
    probabilities are small by design, not starved by an outlier channel's scale (see
    diagnose.absurd_scale.BOUNDED)."""
    return row.get(Col.OP_TYPE) in BOUNDED or str(row.get(Col.KERNEL, "")).startswith(f"{softmax.KERNEL}[")


def _lt(value: Any, limit: float) -> bool:
    return _is_number(value) and value < limit


def _gt(value: Any, limit: float) -> bool:
    return _is_number(value) and value > limit


def _is_number(value: Any) -> bool:
    """A measured figure (Python or numpy number, not NaN): rows are classified before any DataFrame."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not math.isnan(value)


def rank_sites(results: Sequence[SiteResult]) -> list[SiteResult]:
    """`rank` (summary.md's RANK_DOC), rank 1 first; the results arrive classified and diagnosed."""

    def key(r: SiteResult) -> tuple[float, ...]:
        iso = r.isolated.sqnr_db if r.isolated is not None else None
        worst = r.activation.worst_channel_sqnr_db if r.activation is not None else None
        return (r.diagnosis.tier, sort_value(iso), sort_value(worst), sort_value(r.cumulative.sqnr_db))

    return ranked(results, key)


def tensor_table(
    prepared: PreparedModel,
    ev: Evaluation,
    original_tensors: set[str],
    probe: Probe,
    producers: Mapping[str, onnx.NodeProto],
) -> pd.DataFrame:
    rows = []
    outputs = set(probe.outputs)
    for name, acc in ev.cumulative.items():
        if name not in original_tensors:
            continue
        node = producers.get(name)
        rows.append({
            "tensor": name,
            "producer": node.name if node is not None else "",
            Col.OP_TYPE: node.op_type if node is not None else "",
            "is_output": name in outputs,
            Col.CUMULATIVE_COSINE: acc.cosine,
            Col.CUMULATIVE_SQNR_DB: acc.sqnr_db,
            Col.CUMULATIVE_MSE: acc.mse,
            Col.CUMULATIVE_MAX_ABS: acc.max_abs,
            Col.CUMULATIVE_WORST_SAMPLE_COSINE: acc.worst_sample_cosine,
            "nonfinite_fp32": acc.nonfinite_ref,
            "nonfinite_int8": acc.nonfinite_test,
            Col.EVAL_CLIP_FRACTION: ev.clip_fraction.get(name, math.nan),
        })
    return pd.DataFrame(rows)


def ops_table(layers: pd.DataFrame) -> pd.DataFrame:
    grouped = layers.groupby(Col.OP_TYPE)
    ops = grouped.agg(
        sites=(Col.NODE, "count"),
        min_isolated_sqnr_db=(Col.ISOLATED_SQNR_DB, "min"),
        median_isolated_sqnr_db=(Col.ISOLATED_SQNR_DB, "median"),
        min_cumulative_cosine=(Col.CUMULATIVE_COSINE, "min"),
        min_act_worst_channel_sqnr_db=(Col.ACT_WORST_CHANNEL_SQNR_DB, "min"),
        sensitive=(Col.SENSITIVE_OP, "sum"),
        best_rank=(Col.RANK, "min"),
    ).reset_index()
    return ops.sort_values("best_rank").reset_index(drop=True)
