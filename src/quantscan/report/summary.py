"""summary.md: a scan's findings as Markdown, for a terminal, a pull request or a ticket.

Formatting only: it takes the typed result (anything shaped like `SummarySource`) and returns text;
`SummarySource.save` writes it into the run folder through quantscan.runfolder. The texts that explain
the metrics and the rank live here because summary.md is where users read them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from quantscan.columns import Col
from quantscan.errors import QuantscanError
from quantscan.records import Headline, OutputMetrics, RunInfo, severity_rank
from quantscan.report.markdown import code, text
from quantscan.report.taskverdict import task_verdict
from quantscan.report.verdict import GainSamples, diagnosis_lines, rank_doc_gain
from quantscan.taskmetrics.spec import TaskSpec, task_plan


class _Model(Protocol):
    @property
    def path(self) -> Path: ...


class SummarySource(Protocol):
    """What summary.md is made from: a `quantscan.scanning.SummarySource` (a Protocol, so no import cycle)."""

    @property
    def model(self) -> _Model: ...
    @property
    def run_info(self) -> RunInfo: ...
    @property
    def headline(self) -> Headline: ...
    @property
    def output_metrics(self) -> dict[str, OutputMetrics]: ...
    @property
    def layers(self) -> pd.DataFrame: ...
    @property
    def compat(self) -> Any: ...
    @property
    def profile(self) -> str | None: ...
    @property
    def warnings(self) -> list[str]: ...


METRIC_DOC = """\
Metrics compare the FP32 model (x) with the quantized one (y) on the same inputs, pooled over every
element of every sample: cosine = Σxy/√(Σx²·Σy²) (higher is better, 1 = identical direction);
SQNR_dB = 10·log10(Σx²/Σ(x−y)²) (higher is better; the same number as onnxruntime's
20·log10(‖x‖/‖x−y‖), unlike PPQ's linear noise/signal ratio where lower is better); MSE = mean (x−y)²
and max_abs = max|x−y| (lower is better). `worst_sample_` columns are the minimum over samples.
"""


RANK_DOC_PROFILE = (
    "With a chip profile, `rank` weighs conversion, fallback cost and precision together, in tiers: "
    "(1) kernels with an `error` finding (the converter rejects them: nothing else matters until they are "
    "fixed); (2) sites whose error is intrinsic (within it, non-finite figures and absurd scales first, by "
    "`diagnosis_tier`), and CPU-placed nodes in an island of at most two nodes "
    "(each such island costs two NPU/CPU crossings per inference); (3) everything else. Within a tier, "
    "ascending `isolated_sqnr_db`, then ascending `cumulative_sqnr_db`. CPU-placed nodes stay float in the "
    "simulation, quantized only at the island boundaries, and have no isolated figure."
)

RANK_DOC = (
    "`rank` orders sites by the error each site makes itself: ascending `isolated_sqnr_db` (this site alone "
    "quantized, fed FP32 inputs), ties broken by ascending `act_worst_channel_sqnr_db`, then by ascending "
    "`cumulative_sqnr_db`; sites without a measured isolated figure come last. Rank 1 is the most harmful. "
    "Before all of these, `diagnosis_tier`: sites whose own figures are not finite (0) and sites with an "
    "absurd scale (1) come first, with their cause, since their measured figures cannot be trusted. "
    "The isolated figure is used because cumulative SQNR mostly measures what a site inherits from upstream."
)


def _fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, (float, np.floating)):
        f = float(value)
        if math.isnan(f):
            return "–"
        if math.isinf(f):
            return "inf" if f > 0 else "-inf"
        return f"{f:.{digits}g}"
    return str(value)


def gain_basis(options: Mapping[str, Any], evaluation: int) -> GainSamples | None:
    """The samples the output gain was measured on, when fewer than the evaluation set (run.json options)."""
    count, cosine = int(options.get("gain_samples") or 0), options.get("gain_samples_cosine")
    if not 0 < count < evaluation or cosine is None:
        return None
    return GainSamples(count, evaluation, float(cosine))


def _weight_granularity(chip: Mapping[str, Any]) -> str:
    """How the weight scales were simulated: per output channel, or one per tensor when the profile's
    chip has no per-channel scales (run.json chip.per_channel_weights)."""
    if chip.get("per_channel_weights", True):
        return "per output channel"
    return f"per tensor (profile {chip.get('profile')}: no per-channel weight scales)"


def _scheme_text(options: Mapping[str, Any], chip: Mapping[str, Any]) -> str:
    """The simulated scheme in words (run.json chip.scheme; a run folder from before schemes: w8a8):
    scheme name, activations, weights and their granularity, and where the bias stays float."""
    scheme = chip.get("scheme") or {}
    acts = options["activations"]
    source = options.get("activations_source", "default")
    act_text = ("activations float (weight-only)" if acts == "float"
                else f"activations {acts} per tensor ({source})")
    group = scheme.get("group_size")
    weights = scheme.get("weights", "int8")
    if group:
        granularity = f"in groups of {group} along the input axis"
    else:
        granularity = _weight_granularity(chip)
    symmetry = "with a zero point" if scheme.get("weight_zero_point") else "symmetric"
    bias = "bias float" if acts == "float" or group else "bias int32"
    name = f"scheme {code(scheme['name'])}: " if scheme.get("name") else ""
    return f"{name}{act_text}, weights {weights} {granularity} ({symmetry}), {bias}"


def _scheme_short(chip: Mapping[str, Any]) -> str:
    """"int8" for the default scheme (the heading's spelling before schemes), else the scheme's name."""
    name = (chip.get("scheme") or {}).get("name")
    return "int8" if name in (None, "w8a8") else f"at {name}"


def summary_markdown(result: SummarySource, plan: Mapping[str, Any] | None = None) -> str:
    """summary.md's text: the diagnosis (with `plan`, a bisect plan.json's content, when one is in the
    run folder), setup, output metrics, headline, top sites, causes, the profile, the docs."""
    info = result.run_info
    head = result.headline
    lines = [
        f"# quantscan: {result.model.path.name}",
        "",
        *diagnosis_lines(head, result.output_metrics, result.layers, plan, info.deployed_gap_sites,
                         gain_basis(info.options, info.evaluation.samples),
                         [i["quantization"] for i in info.inputs if "quantization" in i],
                         info.options.get("board_time"), info.options.get("recover_check")),
        f"- model sha256 {code(info.model.sha256)}, opset {info.opset_original} (analysed at "
        f"{info.opset_used}), {info.sites} quantization sites, {info.qdq_pairs} QDQ pairs",
        f"- calibration: {info.calibration.samples} samples from {code(info.calibration.path)}, "
        f"method {info.options['calib_method']}; {_scheme_text(info.options, info.chip)}",
        *_float16_lines(info.options),
        *_preprocessing_lines(info.preprocessing),
        "- evaluation set: " + ("the calibration set (no `--eval` given)" if info.evaluation.same_as_calibration
                                else f"{code(info.evaluation.path)} ({info.evaluation.samples} samples)"),
        f"- analysis sessions: onnxruntime {info.ort_level} (QDQ kept as float fake-quant)",
        *_output_section(result),
        *_task_section(result.output_metrics, info.options.get("task")),
        *_coverage_section(result.layers, info.worst_samples, bool(info.evaluation.same_as_calibration)),
        "## Top sites",
        "",
        "| rank | node | kernel | isolated SQNR dB | cumulative SQNR dB | worst channel dB | cause | why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += _sites_sections(result.layers)
    lines += _profile_section(result)
    rank_doc = RANK_DOC_PROFILE if result.compat is not None else RANK_DOC
    measured = int(info.options.get("gain_measured") or 0)
    if measured:
        per_ordering = info.options.get("gain_candidates")
        candidates = info.sites if per_ordering == "all" else int(per_ordering or 0)
        rank_doc = rank_doc_gain(measured, info.sites, candidates,
                                 int(info.options.get("gain_samples") or 0), info.evaluation.samples,
                                 list(info.options.get("gain_sample_indices") or []))
    lines += ["", "## How `rank` is computed", "", rank_doc, "", "## Metrics", "", METRIC_DOC]
    if result.warnings:
        lines += ["## Warnings", ""] + [f"- {w}" for w in result.warnings]
    return "\n".join(lines) + "\n"


def _output_section(result: SummarySource) -> list[str]:
    """The model output table (fake-quant and deployed figures per output) and the headline paragraph."""
    info, head = result.run_info, result.headline
    lines = [
        "",
        f"## Model output (all sites {_scheme_short(info.chip)})",
        "",
        "| output | cosine | SQNR dB | worst-sample cosine | top-1 agreement | deployed cosine (ORT_ENABLE_ALL"
        + (f", first {head.deployed_samples} samples" if head.deployed_basis is not None else "") + ") |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in result.output_metrics.items():
        dep = info.deployed_metrics.get(name)
        top1 = m.top1_agreement if m.top1_agreement is not None else math.nan
        lines.append(
            f"| {code(name)} | {_fmt(m.cosine, 5)} | {_fmt(m.sqnr_db)} | {_fmt(m.worst_sample_cosine, 5)} | "
            f"{_fmt(top1)} | {_fmt(dep.cosine if dep is not None else math.nan, 5)} |"
        )
    return lines + [
        "",
        f"Headline: {code(head.output)} (worst output) cosine {_fmt(head.cosine, 5)}, "
        f"SQNR {_fmt(head.sqnr_db)} dB. "
        + ("" if head.measured else f"**Not measured on the int8 model:** the quantizable nodes inside "
           f"{', '.join(head.unmeasured)} stayed float (the deployed check runs the same model); fold an If "
           "first (`quantscan check` names the rewrite flags; no flag folds a Loop or Scan). ")
        + ("Every float output that is not a recurrent state counts and the worst heads: `--output NAME` "
           "measures the one the application reads (a detector's scores, not a side feature map; "
           "`--task heatmap` then says where a score map's peaks land). "
           if len(head.outputs) > 1 and not info.options.get(Col.OUTPUT) else "")
        + "The deployed figure runs the saved QDQ model with onnxruntime's integer kernels; it is reported beside "
        "the fake-quant figure, never mixed into it"
        + (f" (on the first {head.deployed_samples} samples, where fake-quant gives cosine "
           f"{_fmt(head.deployed_basis.cosine, 5)}; `--deployed-samples all` runs it on every sample)."
           if head.deployed_basis is not None else "."),
        "",
    ]


def _sites_sections(layers: pd.DataFrame) -> list[str]:
    """The top-sites table's rows, the diagnosis list, and the intrinsic/inherited split."""
    lines = []
    for r in layers.head(10).to_dict("records"):
        lines.append(
            f"| {r[Col.RANK]} | {code(r[Col.NODE])} | {text(r[Col.KERNEL])} | {_fmt(r[Col.ISOLATED_SQNR_DB])} | "
            f"{_fmt(r[Col.CUMULATIVE_SQNR_DB])} | {_fmt(r[Col.ACT_WORST_CHANNEL_SQNR_DB])} | {r[Col.CAUSE]} | "
            f"{text(r[Col.REASON])} |"
        )
    lines += _diagnosis_section(layers)
    intrinsic = layers[layers[Col.CAUSE] == "intrinsic"]
    inherited = layers[layers[Col.CAUSE] == "inherited"]
    lines += ["", "## Cause or symptom", ""]
    lines.append(
        f"- **Intrinsic** ({len(intrinsic)} sites): the site's own quantization loses precision (low isolated "
        "SQNR, or a per-tensor scale that starves some channels). Fix these: keep them in float/int16, "
        "rescale channels, or change the calibration method."
    )
    for r in intrinsic.head(15).to_dict("records"):
        lines.append(f"  - {code(r[Col.NODE])} ({text(r[Col.KERNEL])}): {text(r[Col.REASON])}")
    lines.append(
        f"- **Inherited** ({len(inherited)} sites): low cumulative SQNR but a fine isolated figure: the error "
        "comes from upstream. Fixing these sites would not help."
    )
    for r in inherited.head(15).to_dict("records"):
        lines.append(f"  - {code(r[Col.NODE])} ({text(r[Col.KERNEL])}): {text(r[Col.REASON])}")
    return lines


DIAGNOSIS_LIMIT = 15


def _diagnosis_section(layers: pd.DataFrame) -> list[str]:
    """Root causes the cause rules named (quantscan.diagnose), in rank order, each with its fix."""
    if Col.DIAGNOSIS not in layers.columns:
        return []
    found = layers[layers[Col.DIAGNOSIS].fillna("").astype(str) != ""]
    lines = ["", "## Root causes and fixes", ""]
    if found.empty:
        return lines + ["No cause rule fired (absurd scales, outlier channels, mismatched join inputs, "
                        "wasted codes, dead or clipped channels, non-finite figures)."]
    lines.append(f"{len(found)} site(s) with a named cause; the first of each site, in rank order:")
    for r in found.head(DIAGNOSIS_LIMIT).to_dict("records"):
        lines.append(f"- rank {r[Col.RANK]} {code(r[Col.NODE])} ({text(r[Col.KERNEL])}): {text(r[Col.DIAGNOSIS])}")
    return lines


CLIP_FLAG = 0.001
"""A site clipping more than this fraction of its evaluation values is flagged: the calibration range
does not cover what the model meets. 0.1% is five times the tail a 99.99-percentile calibration cuts on
its own data (0.01% per side); ddddocr_common_det calibrated on document scans clips up to 0.45% of a
site's values on photographs."""


def _coverage_section(layers: pd.DataFrame, worst: list[dict[str, Any]], same: bool) -> list[str]:
    """Calibration vs evaluation: sites whose evaluation values fall outside the calibrated range, and the
    evaluation samples with the largest output error (run.json `worst_samples`, for `extract --worst`)."""
    lines = ["## Calibration vs evaluation", ""]
    clip = layers[Col.EVAL_CLIP_FRACTION] if Col.EVAL_CLIP_FRACTION in layers.columns else pd.Series(dtype=float)
    flagged = layers[clip > CLIP_FLAG].sort_values(Col.EVAL_CLIP_FRACTION, ascending=False) if len(clip) else clip
    if len(flagged):
        top = flagged.iloc[0]
        lines.append(
            f"- **flag**: {len(flagged)} site(s) clip more than {CLIP_FLAG:.1%} of their evaluation values "
            f"(worst {code(top[Col.NODE])}: {top[Col.EVAL_CLIP_FRACTION]:.2%}); "
            + ("the evaluation set is the calibration set, so the calibration method itself cuts this much."
               if same else "the calibration set does not cover the evaluation data: calibrate on data like it.")
        )
    elif len(clip):
        lines.append(f"- evaluation values outside the calibrated range: at most {_fmt(float(clip.max()))} of a "
                     f"site's values (no site above {CLIP_FLAG:.1%}); column `eval_clip_fraction` in layers.csv")
    if worst:
        by_task = any("task_metric" in w for w in worst)
        order = "their task metric (what the application reads)" if by_task else "their share of the output error"
        lines += ["", f"Worst evaluation samples by {order}, with their output cosine "
                  "(saved in run.json `worst_samples`, "
                  "`quantscan extract --worst RUN_DIR` feeds them to the minimal model):", ""]
        for w in worst:
            where = f"{code(w['file'])}" if w.get("file") else f"sample {w['index']}"
            task = (f"{code(w['task_output'])} {w['task_metric']} {_fmt(float(w['task_value']), 4)}; "
                    if "task_metric" in w else "")
            lines.append(f"- {where} (index {w['index']}): {task}{code(w[Col.OUTPUT])} cosine "
                         f"{_fmt(float(w['cosine']), 5)}")
    return [*lines, ""]


def _preprocessing_lines(record: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per input saying how the calibration numbers were made, so the deployment can be
    checked against it (run.json `preprocessing` holds the full record)."""
    lines = []
    for name, entry in record.items():
        line = f"- preprocessing of {code(name)}: {preprocessing_text(entry)}"
        evaluation = entry.get("evaluation")
        if isinstance(evaluation, Mapping):
            line += f"; evaluation set: {preprocessing_text(evaluation)}"
        lines.append(line)
    return lines


def preprocessing_text(entry: Mapping[str, Any]) -> str:
    """A preprocessing record (calib: contract_record and the tensor/const records) in one phrase."""
    kind = entry.get("kind")
    if kind == "const":
        return f"a constant (`--const`) of shape {entry.get('value_shape')}"
    if kind != "images":
        return f"arrays fed as stored ({entry.get('dtype')}, sample shape {entry.get('sample_shape')})"
    size = entry.get("size") or {}
    text = (f"{entry.get('channel_order')} images, resize {code(entry.get('resize'))} ({entry.get('interpolation')}) "
            f"to {size.get('height')}×{size.get('width')}, ×{_fmt(entry.get('scale'))} − mean "
            f"{_numbers(entry.get('mean'))} ÷ std {_numbers(entry.get('std'))}, {entry.get('layout')} "
            f"{entry.get('dtype')}")
    change = float(entry.get("max_aspect_change") or 1.0)
    if change > 1.0:
        text += (f"; {entry.get('distinct_source_sizes')} source size(s), aspect ratio changed up to "
                 f"{_fmt(change, 3)}×")
    return text


def _numbers(values: Any) -> str:
    return "[" + ", ".join(_fmt(float(v)) for v in (values or [])) + "]"


def _task_section(metrics: dict[str, OutputMetrics], task: Any = None) -> list[str]:
    """Task metrics (FP32 vs int8 decode/argmax/mask), a verdict line in the task's terms and the figures
    per output that has any (task.csv has them too); an output a spec reads beside another (an anchor
    head's scores) says where its figures are."""
    rows = [(name, m.task) for name, m in metrics.items() if m.task]
    if not rows:
        return []
    lines = ["## Task metrics (FP32 vs int8, evaluation set)", ""]
    for name, figures in rows:
        verdict = task_verdict(figures)
        if verdict is not None:
            lines.append(f"- **{code(name)}**: {verdict}.")
        lines.append(f"- {code(name)}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in figures.items()))
    for spec in _bound_specs(task):
        for other in spec.outputs()[1:]:
            if other in metrics and not metrics[other].task:
                lines.append(f"- {code(other)}: measured with {code(spec.outputs()[0])} (task {spec.kind}, above)")
    return [*lines, ""]


def _bound_specs(task: Any) -> tuple[TaskSpec, ...]:
    """The `--task` specs run.json recorded (none for a run folder written before they existed)."""
    if not task:
        return ()
    try:
        return task_plan(task).bound
    except QuantscanError:
        return ()


def _float16_lines(options: dict[str, Any]) -> list[str]:
    """Nodes the profile's toolkit runs in float16: kept float in the simulation, not int8 sites."""
    nodes = list(options.get("float16_nodes") or [])
    if not nodes:
        return []
    shown = ", ".join(f"{code(n)}" for n in nodes[:8]) + (f" and {len(nodes) - 8} more" if len(nodes) > 8 else "")
    return [f"- float16 on the chip (profile {options.get('profile')}): {shown} kept float, not int8 sites"]


def _profile_section(result: SummarySource) -> list[str]:
    if result.compat is None:
        return ["", "_No chip profile given: run with `--profile NAME` (see `quantscan profiles`) to rank "
                "conversion problems and CPU fallback together with precision._"]
    summary = result.compat.summary()
    lines = ["", f"## Chip profile {code(result.profile)}", ""]
    if not summary.empty and result.profile in summary.columns:
        col = summary[result.profile]
        lines.append(
            f"Worst finding: **{col.get('worst')}**; {col.get('errors')} errors, {col.get('warnings')} warnings; "
            f"{col.get('npu_nodes')} NPU / {col.get('cpu_nodes')} CPU nodes in {col.get('islands')} islands, "
            f"{col.get('bytes_crossing')} bytes crossing NPU/CPU per inference."
        )
    lines += ["", "| node | op | rule | value | limit | severity | placement | fix |",
              "|---|---|---|---|---|---|---|---|"]
    findings = result.compat.findings
    findings = findings[findings["profile"] == result.profile]
    findings = findings.assign(_o=[-severity_rank(v) for v in findings["severity"]]).sort_values(
        "_o", kind="mergesort"
    )
    for r in findings.head(20).to_dict("records"):
        lines.append(f"| {code(r[Col.NODE])} | {text(r[Col.OP_TYPE])} | {text(r['rule'])} | {text(r['value'])} | "
                     f"{text(r['limit'])} | {r['severity']} | {r[Col.PLACEMENT]} | {text(r['fix'])} |")
    if len(findings) > 20:
        lines.append(f"| … {len(findings) - 20} more in compat.csv | | | | | | | |")
    return lines + _handoff_table(result, findings)


def _handoff_table(result: SummarySource, findings: pd.DataFrame) -> list[str]:
    """The table engineers hand to their team: nodes, limit, strategy, numeric check, latency note.

    One row per distinct cause (same rule, op, value, limit and fix), errors first, then in the order of
    the findings, with the count and the nodes it covers (a transformer's hundred Softmax/Div rows are a
    few lines), plus the five worst intrinsic sites. The numeric check is the scan's own figure (the worst
    of the group's nodes); latency is left for the user to fill from the board.
    """
    layers = result.layers.set_index(Col.NODE) if Col.NODE in result.layers.columns else result.layers
    rows: list[str] = []
    seen: set[str] = set()
    groups: dict[tuple[str, ...], list[str]] = {}
    for r in findings[findings["severity"].isin(["error", "warn"])].to_dict("records"):
        node = str(r[Col.NODE])
        if not node or node in seen:
            continue
        seen.add(node)
        key = tuple(str(r[k]) for k in ("severity", "rule", Col.OP_TYPE, "value", "limit", "fix"))
        groups.setdefault(key, []).append(node)
    for (severity, rule, _op, value, limit, fix), nodes in groups.items():
        rows.append(f"| {_nodes_text(nodes)} | {severity} {rule}: {value} vs {limit} | {fix} | "
                    f"{_group_check_text(layers, nodes)} | {_latency_text(layers, nodes, result.profile)} |")
    intrinsic = result.layers[result.layers[Col.CAUSE] == "intrinsic"].head(5)
    for r in intrinsic.to_dict("records"):
        if r[Col.NODE] in seen:
            continue
        rows.append(f"| {code(r[Col.NODE])} | precision: {text(r[Col.REASON])} | keep float/int16 "
                    f"(`quantscan bisect`) or rescale channels | {_check_text(layers, r[Col.NODE])} | "
                    f"{_latency_text(layers, [r[Col.NODE]], result.profile)} |")
    if not rows:
        return []
    head = ["", "### Hand-off: nodes — limit — strategy — numeric check — latency", "",
            "| nodes | limit | strategy | numeric check | latency note |", "|---|---|---|---|---|"]
    return head + rows


HANDOFF_NODES_SHOWN = 3


def _latency_text(layers: pd.DataFrame, nodes: list[str], profile: str | None) -> str:
    """The group's board time as layers.csv's `est_ms` gives it (estimated by quantscan.cost from the
    profile's [cost] table), and what keeping its sites float would add; empty when nothing is priced."""
    if Col.EST_MS not in layers.columns:
        return ""
    rows = layers.loc[[n for n in nodes if n in layers.index]]
    est = pd.to_numeric(rows[Col.EST_MS], errors="coerce").dropna() if not rows.empty else pd.Series(dtype=float)
    if est.empty:
        return ""
    extra = pd.to_numeric(rows.get(Col.FALLBACK_EXTRA_MS), errors="coerce").fillna(0.0)
    kept = f", {extra.sum():+.3g} ms kept float" if (extra > 0).any() else ""
    return f"{est.sum():.3g} ms{kept} (estimated, quantscan.cost {profile or ''})".replace(" )", ")")


def _nodes_text(nodes: list[str]) -> str:
    """`A` alone, or `A`, `B`, `C` … (N nodes) for a group."""
    shown = ", ".join(f"{code(n)}" for n in nodes[:HANDOFF_NODES_SHOWN])
    if len(nodes) == 1:
        return shown
    more = " …" if len(nodes) > HANDOFF_NODES_SHOWN else ""
    return f"{shown}{more} ({len(nodes)} nodes)"


def _group_check_text(layers: pd.DataFrame, nodes: list[str]) -> str:
    """The check text of the group's node with the lowest isolated SQNR (the one to look at first)."""
    sites = [n for n in nodes if n in layers.index]
    if not sites:
        return "not a quantization site"

    def sqnr(node: str) -> float:
        row = layers.loc[node]
        value = row.iloc[0][Col.ISOLATED_SQNR_DB] if isinstance(row, pd.DataFrame) else row.get(Col.ISOLATED_SQNR_DB)
        try:
            return float(value)
        except (TypeError, ValueError):
            return float("inf")

    worst = min(sites, key=sqnr)
    text = _check_text(layers, worst)
    return text if len(nodes) == 1 else f"worst {code(worst)}: {text}"


def _check_text(layers: pd.DataFrame, node: str) -> str:
    if node not in layers.index:
        return "not a quantization site"
    row = layers.loc[node]
    if isinstance(row, pd.DataFrame):
        row = row.iloc[0]
    if str(row.get(Col.PLACEMENT, "npu")) == "cpu":
        return f"float on CPU; cumulative SQNR {_fmt(row.get(Col.CUMULATIVE_SQNR_DB))} dB"
    return f"isolated {_fmt(row.get(Col.ISOLATED_SQNR_DB))} dB, cumulative {_fmt(row.get(Col.CUMULATIVE_SQNR_DB))} dB"
