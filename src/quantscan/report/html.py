"""report.html: one self-contained page built from a run folder's files only.

Why from the files and not from the in-memory result: `quantscan report RUN_DIR` must rebuild the
page long after the scan (and after `check`/`bisect` added compat.csv, partitions.csv, plan.json to the
same folder), so the page can only show what the folder holds. This module formats; it never runs a
model, never prints, and leaves out a section (with a line saying how to get it) when its file is
absent.

The folder is read through quantscan.runfolder (`load_run`); the figures come from plots.py
(matplotlib, inline SVG: no JavaScript, no fonts or scripts fetched from anywhere, text stays
text), cell formatting from cells.py, the stylesheet and script from assets/. The page carries a
Content-Security-Policy of `default-src 'none'` with inline style/script and data: images allowed,
so any network request would be blocked and show up as a console error.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from quantscan.columns import Col
from quantscan.report.cells import col, esc, fmt, is_missing, metric_value, num, truthy
from quantscan.report.device import device_body
from quantscan.report.plots import (
    PlotCounter,
    cost_pareto_figure,
    depth_figure,
    layer_figure,
    pareto_figure,
    spread_figure,
    svg,
)
from quantscan.report.summary import preprocessing_text
from quantscan.runfolder import RunFiles, atomic_write_text, load_run

TOP_LAYERS = 8
CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


# ------------------------------------------------------------------------------------------ public


def render_report(run_dir: Path) -> str:
    """The whole page as one HTML string, from the files in `run_dir` only."""
    files = load_run(Path(run_dir))
    plots = PlotCounter()
    layers = _ranked(files.layers)
    body = [
        _header(files),
        _headline(files),
        _depth_section(files, layers, plots),
        _layer_table_section(layers),
        _top_layers_section(files, layers, plots),
        _ops_section(files),
        _compat_section(files),
        _bisect_section(files, plots),
        _section("device", "Device dumps", device_body(files.device, plots)) if files.device is not None else "",
        _calib_advice_section(files, plots),
        _about_section(files),
    ]
    return _page(_model_name(files), "\n".join(body))


def write_report(run_dir: Path) -> Path:
    """Write run_dir/report.html atomically (temp file + os.replace): an old report is only ever
    replaced by a complete one."""
    run_dir = Path(run_dir)
    text = render_report(run_dir)
    path = run_dir / "report.html"
    atomic_write_text(path, text)
    return path


# ----------------------------------------------------------------------------------- small helpers


def _ranked(layers: pd.DataFrame) -> pd.DataFrame:
    if Col.RANK in layers:
        order = pd.to_numeric(layers[Col.RANK], errors="coerce")
        return layers.assign(_r=order).sort_values("_r", kind="stable").drop(columns="_r").reset_index(drop=True)
    return layers.reset_index(drop=True)


def _model_name(files: RunFiles) -> str:
    path = files.run.get("model", {}).get("path") if isinstance(files.run.get("model"), dict) else None
    return Path(str(path)).name if path else files.path.name


def _hint(text: str) -> str:
    return f'<p class="hint">{text}</p>'


def _section(anchor: str, title: str, content: str) -> str:
    return f'<section id="{anchor}"><h2>{esc(title)}</h2>\n{content}\n</section>'


def _kv_table(rows: Iterable[tuple[str, str]]) -> str:
    """Label/value pairs; values are already HTML."""
    cells = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="kv">{cells}</table>'


# ---------------------------------------------------------------------------------------- header


def _header(files: RunFiles) -> str:
    run = files.run
    model = run.get("model", {}) if isinstance(run.get("model"), dict) else {}
    rows: list[tuple[str, str]] = [
        ("model", f"<code>{esc(model.get('path', '–'))}</code>"),
        ("sha256", f"<code>{esc(model.get('sha256', '–'))}</code>"),
        ("graph", esc(_graph_line(run, model))),
        ("input contract", _input_contract(run)),
        ("quantization", esc(_quant_line(run))),
        ("calibration", esc(_calib_line(run))),
        ("evaluation", esc(_eval_line(run))),
        ("profiles", esc(", ".join(_profiles(files)) or "none (no --profile given)")),
        ("versions", esc(", ".join(f"{k} {v}" for k, v in (run.get("versions") or {}).items()))),
        ("time taken", esc(_times_line(run))),
        ("run folder", f"<code>{esc(files.path)}</code>"),
    ]
    preprocessing = run.get("preprocessing")
    if isinstance(preprocessing, dict) and preprocessing:
        text = "; ".join(f"{name}: {preprocessing_text(entry)}" for name, entry in preprocessing.items())
        rows.insert([key for key, _ in rows].index("calibration") + 1, ("preprocessing", esc(text)))
    prep = run.get("preparation")
    if isinstance(prep, list) and prep:
        rows.insert(3, ("preparation", esc("; ".join(map(str, prep)))))
    warnings = run.get("warnings") or []
    warn_html = ""
    if warnings:
        items = "".join(f"<li>{esc(w)}</li>" for w in warnings)
        warn_html = f'<div class="warn"><b>{len(warnings)} warning(s)</b><ul>{items}</ul></div>'
    nav = "".join(
        f'<a href="#{a}">{t}</a>'
        for a, t in (
            ("headline", "Headline"),
            ("depth", "Error along depth"),
            ("layers", "Layers"),
            ("top", "Top layers"),
            ("ops", "Op types"),
            ("compat", "Chip compatibility"),
            ("bisect", "Bisection"),
            ("about", "About"),
        )
    )
    return (
        f'<header><h1>quantscan <span class="model">{esc(_model_name(files))}</span></h1>'
        f"<nav>{nav}</nav>{_kv_table(rows)}{warn_html}</header>"
    )


def _graph_line(run: Mapping[str, Any], model: Mapping[str, Any]) -> str:
    parts = []
    if "nodes" in model:
        parts.append(f"{model['nodes']} nodes")
    if "opset_original" in run or "opset_used" in run:
        parts.append(f"opset {run.get('opset_original', '?')} (analysed at {run.get('opset_used', '?')})")
    if "sites" in run:
        parts.append(f"{run['sites']} quantization sites")
    if "qdq_pairs" in run:
        parts.append(f"{run['qdq_pairs']} QDQ pairs")
    if "ort_level" in run:
        parts.append(f"analysis onnxruntime {run['ort_level']}")
    return ", ".join(parts) or "–"


def _input_contract(run: Mapping[str, Any]) -> str:
    contract = run.get("input_contract") or {}
    dtypes = {i.get("name"): i.get("dtype") for i in run.get("inputs") or [] if isinstance(i, dict)}
    if not isinstance(contract, dict) or not contract:
        return "–"
    items = []
    for name, shape in contract.items():
        dims = "×".join(str(d) for d in shape) if isinstance(shape, list) else str(shape)
        dtype = f" {dtypes[name]}" if dtypes.get(name) else ""
        items.append(f"<code>{esc(name)}</code> {esc(dims)}{esc(dtype)}")
    return "; ".join(items)


def _quant_line(run: Mapping[str, Any]) -> str:
    opts = run.get("options") or {}
    acts = opts.get("activations", "?")
    parts = [f"scheme {opts['scheme']}"] if opts.get("scheme") else []
    parts.append("activations float (weight-only)" if acts == "float"
                 else f"activations {acts} per tensor ({opts.get('calib_method', '?')} calibration)")
    for key in ("weights", "bias"):
        if opts.get(key):
            parts.append(f"{key} {opts[key]}")
    for key in ("limit", Col.OUTPUT, "const", "input_shape"):
        if opts.get(key):
            parts.append(f"{key} {opts[key]}")
    return "; ".join(parts)


def _calib_line(run: Mapping[str, Any]) -> str:
    cal = run.get("calibration") or {}
    return f"{cal.get('samples', '?')} samples ({cal.get('kind', '?')}) from {cal.get('path', '?')}"


def _eval_line(run: Mapping[str, Any]) -> str:
    ev = run.get("evaluation") or {}
    if ev.get("same_as_calibration"):
        return "the calibration set (no --eval given)"
    return f"{ev.get('samples', '?')} samples from {ev.get('path', '?')}" if ev else "–"


def _times_line(run: Mapping[str, Any]) -> str:
    times = run.get("times_s") or {}
    if not isinstance(times, dict) or not times:
        return "–"
    total = times.get("total")
    steps = ", ".join(f"{k} {fmt(v, '.3g')} s" for k, v in times.items() if k != "total")
    return f"{fmt(total, '.3g')} s ({steps})" if total is not None else steps


def _profiles(files: RunFiles) -> list[str]:
    found: list[str] = []
    for key in ("profile", "profiles"):
        value = files.run.get(key) or (files.run.get("options") or {}).get(key)
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list):
            found.extend(str(v) for v in value)
    for frame in (files.compat, files.partitions):
        if frame is not None and "profile" in frame:
            found.extend(str(p) for p in frame["profile"].dropna().unique())
    return list(dict.fromkeys(found))


# -------------------------------------------------------------------------------------- headline


def _headline(files: RunFiles) -> str:
    run = files.run
    outputs: dict[str, Any] = run.get("output_metrics") or {}
    deployed: dict[str, Any] = run.get("deployed_metrics") or {}
    head: dict[str, Any] = run.get("headline") or {}
    parts = []
    if head:
        dep: Mapping[str, Any] = deployed.get(str(head.get(Col.OUTPUT))) or head.get("deployed") or {}
        parts.append(_headline_cards(head, dep))
    if outputs:
        parts.append(_outputs_table(outputs, deployed))
    if files.plan:
        parts.append(_plan_cards(files.plan))
    if not parts:
        parts.append(_hint("run.json holds no output metrics: re-run the scan to get them."))
    note = (
        "Fake-quant figures run the QDQ model with onnxruntime's basic optimisations (float arithmetic on "
        "quantized values); the deployed figure runs the same model with ORT_ENABLE_ALL integer kernels and "
        "is reported beside it, never mixed into it."
    )
    return _section("headline", "Model output", "\n".join(parts) + f'<p class="note">{note}</p>')


def _card(label: str, value: str, sub: str = "", cls: str = "") -> str:
    return (
        f'<div class="card {cls}"><div class="v">{value}</div><div class="l">{esc(label)}</div>'
        f'<div class="s">{sub}</div></div>'
    )


def _quality(cos: float) -> str:
    if math.isnan(cos):
        return ""
    return "good" if cos >= 0.999 else "fair" if cos >= 0.99 else "bad"


def _headline_cards(head: Mapping[str, Any], deployed: Mapping[str, Any]) -> str:
    cos = num(head.get("cosine"))
    cards = [
        _card(
            "cosine, all int8",
            fmt(cos, ".5f"),
            f"output <code>{esc(head.get(Col.OUTPUT, '?'))}</code>",
            _quality(cos),
        ),
        _card("SQNR dB, all int8", fmt(head.get("sqnr_db"), ".2f"), "higher is better"),
        _card("worst-sample cosine", fmt(head.get("worst_sample_cosine"), ".5f"), "minimum over samples"),
    ]
    if "top1_agreement" in head:
        cards.append(_card("top-1 agreement", fmt(head.get("top1_agreement"), ".3f"), _accuracy_line(head)))
    if deployed:
        cards.append(
            _card(
                "deployed cosine",
                fmt(deployed.get("cosine"), ".5f"),
                f"ORT_ENABLE_ALL integer kernels, SQNR {fmt(deployed.get('sqnr_db'), '.2f')} dB",
            )
        )
    return f'<div class="cards">{"".join(cards)}</div>'


def _accuracy_line(metrics: Mapping[str, Any]) -> str:
    if "accuracy" in metrics:
        fp32 = fmt(metrics.get("fp32_accuracy"), ".3f")
        return f"accuracy int8 {fmt(metrics['accuracy'], '.3f')} vs FP32 {fp32}"
    return "argmax equal to FP32"


def _outputs_table(outputs: Mapping[str, Any], deployed: Mapping[str, Any]) -> str:
    head = (
        Col.OUTPUT,
        "cosine",
        "SQNR dB",
        "worst-sample cosine",
        "max abs",
        "top-1 agreement",
        "deployed cosine",
        "deployed SQNR dB",
    )
    rows = []
    for name, m in outputs.items():
        d = deployed.get(name) or {}
        rows.append(
            [
                f"<code>{esc(name)}</code>",
                fmt(m.get("cosine"), ".5f"),
                fmt(m.get("sqnr_db"), ".2f"),
                fmt(m.get("worst_sample_cosine"), ".5f"),
                fmt(m.get("max_abs"), ".3g"),
                fmt(m.get("top1_agreement"), ".3f"),
                fmt(d.get("cosine"), ".5f"),
                fmt(d.get("sqnr_db"), ".2f"),
            ]
        )
    return _html_table(head, rows, cls="num")


def _plan_cards(plan: Mapping[str, Any]) -> str:
    target = plan.get("target") or {}
    metric = str(target.get("metric", "cosine"))
    sites = plan.get("sites") or []
    spec = ".5f" if "cos" in metric else ".3g"
    achieved = metric_value(plan.get("achieved"), metric)
    ok = not math.isnan(achieved) and achieved >= num(target.get("value"))
    interval = plan.get("interval")
    spread = (f"; interval [{fmt(interval.get('low'), spec)}, {fmt(interval.get('high'), spec)}] "
              "(rounding realisations, held-out samples)" if isinstance(interval, Mapping) else "")
    cards = [
        _card(
            f"{metric}, bisection plan",
            fmt(achieved, spec),
            f"target ≥ {fmt(target.get('value'), spec)}"
            + (f" on <code>{esc(target[Col.OUTPUT])}</code>" if target.get(Col.OUTPUT) else "") + esc(spread),
            "good" if ok else "bad",
        ),
        _card("sites kept in higher precision", str(len(sites)), esc(_precision_counts(sites))),
        _card(f"{metric}, all int8", fmt(metric_value(plan.get("all_int8"), metric), spec), "before the plan"),
        _card(
            f"{metric}, all float",
            fmt(metric_value(plan.get("all_float"), metric), spec),
            "quantization switched off",
        ),
    ]
    return f'<h3>Bisection plan</h3><div class="cards">{"".join(cards)}</div>'


def _precision_counts(sites: Sequence[Any]) -> str:
    counts: dict[str, int] = {}
    for s in sites:
        p = str(s.get("precision", "float")) if isinstance(s, Mapping) else "float"
        counts[p] = counts.get(p, 0) + 1
    return ", ".join(f"{n} {p}" for p, n in counts.items()) or "none needed"


# ---------------------------------------------------------------------------- error along depth


def _depth_section(files: RunFiles, layers: pd.DataFrame, plots: PlotCounter) -> str:
    if Col.ORDER not in layers or not len(layers):
        return _section(
            "depth",
            "Error along depth",
            _hint("layers.csv has no `order` column or no rows: re-run the scan with this quantscan version."),
        )
    fig = depth_figure(layers)
    notes = [
        "Cumulative: every site quantized, measured at this site's output. Isolated: only this site "
        "quantized, fed FP32 inputs. A cumulative drop without an isolated one is inherited from upstream."
    ]
    if Col.PLACEMENT not in layers:
        notes.append("CPU-fallback nodes are marked when the scan ran with <code>--profile NAME</code>.")
    text = " ".join(notes)
    return _section(
        "depth",
        "Error along depth",
        svg(fig, plots, "SQNR along topological order") + f'<p class="note">{text}</p>',
    )


# -------------------------------------------------------------------------------------- the table

_LAYER_COLUMNS: list[tuple[str, str, str, str]] = [
    # column, header, format, tooltip; cause and reason early so they show without scrolling sideways
    (Col.RANK, Col.RANK, "d", "1 = most harmful; how it is computed is written in summary.md"),
    (Col.NODE, Col.NODE, "s", "first node of the kernel in the original graph"),
    (Col.OP_TYPE, "op", "s", "op type of that node"),
    (Col.ISOLATED_SQNR_DB, "iso SQNR dB", ".1f", "this site alone quantized, fed FP32 inputs"),
    (Col.CUMULATIVE_SQNR_DB, "cum SQNR dB", ".1f", "every site quantized"),
    (Col.CAUSE, Col.CAUSE, "s", "intrinsic: the site's own quantization; inherited: error from upstream"),
    (Col.REASON, Col.REASON, "s", "why this rank"),
    (Col.CUMULATIVE_COSINE, "cum cosine", ".5f", "every site quantized"),
    (
        Col.CUMULATIVE_WORST_SAMPLE_COSINE,
        "worst-sample cos",
        ".4f",
        "minimum over samples, all sites quantized",
    ),
    (Col.ACT_WORST_CHANNEL_SQNR_DB, "act worst ch dB", ".1f", "output activation: worst channel SQNR"),
    (Col.ACT_CHANNEL_RANGE_SPREAD, "act spread", ".3g", "max/min of the non-zero per-channel ranges"),
    (Col.ACT_DEAD_CHANNELS, "dead ch", "d", "output channels that are always zero"),
    (Col.WEIGHT_WORST_CHANNEL_SQNR_DB, "w worst ch dB", ".1f", "weight: worst output channel SQNR"),
    (Col.WEIGHT_CHANNEL_RANGE_SPREAD, "w spread", ".3g", "max/min of the weight per-channel ranges"),
    (Col.SENSITIVE_OP, "sensitive", "b", "op type known to be fragile in int8"),
    (Col.PLACEMENT, Col.PLACEMENT, "s", "npu/cpu for the profile given"),
    (Col.COMPAT_RULE, "compat", "s", "compatibility rule that fired"),
    (Col.GAIN_IF_FLOAT, "gain if float", ".4g", "output metric with this site float, minus all-int8"),
    (Col.GAIN_IF_FLOAT_STDERR, "± gain", ".2g", "jackknife standard error of the gain over the gain samples"),
    (Col.LOSS_IF_ONLY, "loss if only", ".4g", "output metric with only this site int8, minus all-float"),
    (Col.ORDER, Col.ORDER, "d", "topological index in the original graph"),
    (Col.KERNEL, Col.KERNEL, "s", "the fused pattern quantized as one site"),
]


def _layer_table_section(layers: pd.DataFrame) -> str:
    cols = [c for c in _LAYER_COLUMNS if c[0] in layers]
    heads = "".join(f'<th title="{esc(tip)}">{esc(h)}</th>' for _, h, _, tip in cols)
    top = set(layers[Col.NODE].astype(str).head(TOP_LAYERS)) if Col.NODE in layers else set()
    body = "\n".join(_layer_row(rec, cols, top) for rec in layers.to_dict("records"))
    ops = sorted(layers[Col.OP_TYPE].dropna().astype(str).unique()) if Col.OP_TYPE in layers else []
    options = "".join(f'<option value="{esc(o)}">{esc(o)}</option>' for o in ops)
    controls = (
        f'<div class="controls"><label>op type <select id="opfilter"><option value="">all</option>{options}'
        "</select></label> <label>search "
        '<input id="textfilter" type="search" placeholder="node, kernel, reason">'
        f'</label> <span id="rowcount">{len(layers)} of {len(layers)} sites</span>'
        ' <span class="note">click a column header to sort</span></div>'
    )
    op_index = [c[0] for c in cols].index(Col.OP_TYPE) if Col.OP_TYPE in layers else -1
    table = (
        f'<div class="scroll"><table id="layertable" class="sortable data" data-opcol="{op_index}">'
        f"<thead><tr>{heads}</tr></thead><tbody>\n{body}\n</tbody></table></div>"
    )
    return _section("layers", f"Layers, ranked ({len(layers)} sites)", controls + table)


def _layer_row(rec: Mapping[str, Any], cols: Sequence[tuple[str, str, str, str]], top: set[str]) -> str:
    """One <tr>; closing </td> tags are omitted (valid HTML) to keep a 1,500-row table small."""
    cells = []
    for name, _, spec, _ in cols:
        value = rec.get(name)
        cls = _cell_class(name, value)
        attr = f' class="{cls}"' if cls else ""
        if name == Col.NODE and str(value) in top:
            text = f'<a href="#L-{_anchor(str(value))}">{esc(value)}</a>'
        elif spec == "s":
            text = "" if is_missing(value) else esc(value)
        elif spec == "b":
            text = "yes" if truthy(value) else ""
        elif spec == "d":
            text = fmt(value, ".0f")
        else:
            text = fmt(value, spec)
        cells.append(f"<td{attr}>{text}")
    return "<tr>" + "".join(cells)


def _cell_class(name: str, value: Any) -> str:
    """Colour the cells an engineer scans for: low dB values, fragile ops, CPU placement."""
    if name.endswith("_sqnr_db"):
        v = num(value)
        return "bad" if v < 20 else "fair" if v < 30 else ""
    if name == Col.SENSITIVE_OP and truthy(value):
        return "bad"
    if name == Col.PLACEMENT and str(value).lower() == "cpu":
        return "fair"
    if name == Col.CAUSE and str(value) == "intrinsic":
        return "strong"
    if name in (Col.REASON, Col.KERNEL):
        return "wrap"
    return ""


def _anchor(node: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", node)


# ------------------------------------------------------------------------------------- top layers


def _top_layers_section(files: RunFiles, layers: pd.DataFrame, plots: PlotCounter) -> str:
    hints = []
    if files.channels is None or Col.NODE not in (files.channels if files.channels is not None else {}):
        hints.append("channels.csv is missing: re-run the scan to get the per-channel range plots.")
    if not files.hist or "site_nodes" not in files.hist:
        hints.append("hist.npz is missing: re-run the scan to get the FP32 vs int8 histograms.")
    channels = _channels_by_node(files.channels)
    hist_index = _hist_index(files.hist)
    if not channels and not hist_index:
        return _section("top", "Top layers", "".join(_hint(h) for h in hints))
    qrange = _act_qrange(files.run)
    cards = [
        _layer_card(rec, channels.get(str(rec.get(Col.NODE))), _hist_for(files.hist, hist_index, rec), qrange, plots)
        for rec in layers.head(TOP_LAYERS).to_dict("records")
    ]
    intro = (
        '<p class="note">The worst-ranked sites. Left: each output channel\'s activation range (band) '
        "against the one per-tensor int8 grid (dashed): channels that use a sliver of the grid get few "
        "levels, which is what a low worst-channel SQNR means. Middle: the weight's per-output-channel "
        "|max| (each channel has its own scale; a large spread is harmless there). Right: FP32 vs "
        "dequantized int8 values of the output (log counts).</p>"
    )
    return _section("top", f"Top {len(cards)} layers", intro + "".join(_hint(h) for h in hints) + "".join(cards))


def _channels_by_node(channels: pd.DataFrame | None) -> dict[str, pd.DataFrame]:
    if channels is None or Col.NODE not in channels or not len(channels):
        return {}
    return {str(k): g for k, g in channels.groupby(channels[Col.NODE].astype(str), sort=False)}


def _hist_index(hist: Mapping[str, np.ndarray] | None) -> dict[str, int]:
    if not hist or "site_nodes" not in hist:
        return {}
    return {str(n): i for i, n in enumerate(hist["site_nodes"].tolist())}


def _hist_for(
    hist: Mapping[str, np.ndarray] | None, index: Mapping[str, int], rec: Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    k = index.get(str(rec.get(Col.NODE)))
    if hist is None or k is None:
        return None
    keys = (f"{k}/edges", f"{k}/fp32", f"{k}/int8")
    if not all(key in hist for key in keys):
        return None
    edges, fp32, int8 = (np.asarray(hist[key], dtype=np.float64) for key in keys)
    if edges.ndim != 1 or len(edges) != len(fp32) + 1 or fp32.shape != int8.shape:
        return None
    return edges, fp32, int8


def _act_qrange(run: Mapping[str, Any]) -> tuple[int, int]:
    acts = str((run.get("options") or {}).get("activations", "uint8"))
    if acts == "int16":  # the histogram's 256 bins hold 256 codes each (scanning.evaluate._code_bins)
        return (-32768, 32767)
    return (-128, 127) if acts == "int8" else (0, 255)


def _layer_card(
    rec: Mapping[str, Any],
    channels: pd.DataFrame | None,
    hist: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    qrange: tuple[int, int],
    plots: PlotCounter,
) -> str:
    node = str(rec.get(Col.NODE))
    facts = [
        ("isolated", f"{fmt(rec.get(Col.ISOLATED_SQNR_DB), '.1f')} dB"),
        ("cumulative", f"{fmt(rec.get(Col.CUMULATIVE_SQNR_DB), '.1f')} dB"),
        ("worst act channel", f"{fmt(rec.get(Col.ACT_WORST_CHANNEL_SQNR_DB), '.1f')} dB"),
        ("act spread", f"×{fmt(rec.get(Col.ACT_CHANNEL_RANGE_SPREAD), '.3g')}"),
        ("dead channels", fmt(rec.get(Col.ACT_DEAD_CHANNELS), ".0f")),
        ("worst weight channel", f"{fmt(rec.get(Col.WEIGHT_WORST_CHANNEL_SQNR_DB), '.1f')} dB"),
        (
            "scale / zero point",
            f"{fmt(rec.get(Col.ACT_SCALE), '.4g')} / {fmt(rec.get(Col.ACT_ZERO_POINT), '.0f')}",
        ),
    ]
    fact_html = " · ".join(f"{esc(k)} <b>{esc(v)}</b>" for k, v in facts if "–" not in v)
    fig = layer_figure(rec, channels, hist, qrange)
    plot = (
        svg(fig, plots, f"channels and histogram of {node}")
        if fig is not None
        else _hint("No per-channel or histogram data for this site in channels.csv / hist.npz.")
    )
    cause = esc(rec.get(Col.CAUSE, "")) if not is_missing(rec.get(Col.CAUSE)) else ""
    reason = esc(rec.get(Col.REASON, "")) if not is_missing(rec.get(Col.REASON)) else ""
    return (
        f'<div class="layer" id="L-{_anchor(node)}">'
        f"<h3>#{fmt(rec.get(Col.RANK), '.0f')} <code>{esc(node)}</code> "
        f'<span class="kernel">{esc(rec.get(Col.KERNEL, rec.get(Col.OP_TYPE, "")))}</span> '
        f'<span class="tag {cause}">{cause}</span></h3>'
        f'<p>{reason}</p><p class="facts">{fact_html}</p>{plot}</div>'
    )


# --------------------------------------------------------------------------------------- op types


def _ops_section(files: RunFiles) -> str:
    if files.ops is None or not len(files.ops):
        return _section("ops", "Per op type", _hint("ops.csv is missing: re-run the scan to get it."))
    return _section("ops", "Per op type", _frame_table(files.ops, sortable=True))


def _frame_table(
    frame: pd.DataFrame, *, sortable: bool = False, limit: int | None = None, drop: Iterable[str] = ()
) -> str:
    """Any table from the folder, as is: numbers formatted, text escaped."""
    frame = frame.drop(columns=[c for c in drop if c in frame])
    shown = frame if limit is None else frame.head(limit)
    rows = [
        [_cell_value(c, v) for c, v in zip(frame.columns, r, strict=True)]
        for r in shown.itertuples(index=False, name=None)
    ]
    extra = (
        ""
        if limit is None or len(frame) <= limit
        else f'<p class="note">First {limit} of {len(frame)} rows; the CSV has all of them.</p>'
    )
    wrap = {i for i, c in enumerate(frame.columns) if str(c) in _WRAP_COLUMNS}
    table = _html_table(
        [str(c) for c in frame.columns], rows, cls="data" + (" sortable" if sortable else ""), wrap=wrap
    )
    return table + extra


def _cell_value(column: str, value: Any) -> str:
    if is_missing(value):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else ""
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return fmt(value, ".5f" if "cosine" in column else ".4g")
    return esc(value)


_WRAP_COLUMNS = frozenset({"fix", Col.REASON, "value", "limit", "nodes"})
"""Free-text columns that wrap instead of stretching the table off screen."""


def _html_table(head: Sequence[str], rows: Sequence[Sequence[str]], cls: str = "", wrap: Iterable[int] = ()) -> str:
    """Rows are HTML already; headers are escaped here. Closing </td> tags are left out (valid HTML)."""
    ths = "".join(f"<th>{esc(h)}</th>" for h in head)
    tds = ["<td class=wrap>" if i in set(wrap) else "<td>" for i in range(len(head))]
    body = "\n".join("<tr>" + "".join(f"{tds[i]}{c}" for i, c in enumerate(r)) for r in rows)
    return (
        f'<div class="scroll short"><table class="{cls}"><thead><tr>{ths}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


# ----------------------------------------------------------------------------------------- compat


def _compat_section(files: RunFiles) -> str:
    if files.compat is None and files.partitions is None:
        return _section(
            "compat",
            "Chip compatibility",
            _hint(
                "No chip profile in this run: "
                "<code>quantscan check MODEL --profile NAME --out RUN_DIR</code> writes "
                "compat.csv and partitions.csv here (<code>quantscan profiles</code> lists the names), then "
                "<code>quantscan report RUN_DIR</code> adds this section."
            ),
        )
    parts = []
    if files.partitions is not None:
        parts.append(_partition_summary(files.partitions))
        parts.append("<h3>Partitions</h3>" + _frame_table(files.partitions, drop=("nodes",)))
    if files.compat is not None:
        parts.append(
            f"<h3>Findings ({len(files.compat)})</h3>"
            + _severity_line(files.compat)
            + _frame_table(files.compat, sortable=True, limit=500)
        )
    return _section("compat", "Chip compatibility", "\n".join(parts))


def _partition_summary(parts: pd.DataFrame) -> str:
    """Per profile: islands, NPU/CPU split, bytes crossing between islands (the cost of fallback)."""
    if "profile" not in parts:
        parts = parts.assign(profile="?")
    rows = []
    for profile, g in parts.groupby(parts["profile"].astype(str), sort=False):
        place = g[Col.PLACEMENT].astype(str).str.lower() if Col.PLACEMENT in g else pd.Series([""] * len(g))
        n_nodes = col(g, "n_nodes")
        crossing = np.nansum(col(g, "bytes_in"))
        rows.append(
            [
                esc(profile),
                str(len(g)),
                str(int((place == "npu").sum())),
                str(int((place == "cpu").sum())),
                fmt(np.nansum(n_nodes[(place == "npu").to_numpy()]), ".0f"),
                fmt(np.nansum(n_nodes[(place == "cpu").to_numpy()]), ".0f"),
                _bytes(crossing),
                fmt(np.nansum(col(g, "bytes_unknown")), ".0f"),
            ]
        )
    head = (
        "profile",
        "islands",
        "NPU islands",
        "CPU islands",
        "NPU nodes",
        "CPU nodes",
        "bytes crossing",
        "tensors of unknown size",
    )
    return _html_table(head, rows, cls="num")


def _bytes(n: float) -> str:
    for unit, size in (("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def _severity_line(compat: pd.DataFrame) -> str:
    if "severity" not in compat:
        return ""
    counts = compat["severity"].astype(str).value_counts()
    text = ", ".join(f'<span class="sev-{esc(k)}">{v} {esc(k)}</span>' for k, v in counts.items())
    return f"<p>{text}</p>"


# ----------------------------------------------------------------------------------------- bisect


def _bisect_section(files: RunFiles, plots: PlotCounter) -> str:
    plan = files.plan
    if not plan:
        return _section(
            "bisect",
            "Bisection",
            _hint(
                "No bisection in this run: "
                "<code>quantscan bisect MODEL --calib DIR --target-cosine X --out RUN_DIR</code> "
                "finds the fewest sites to keep in float and writes plan.json here."
            ),
        )
    parts = []
    points = _pareto_points(plan.get("pareto"))
    if points:
        parts.append(svg(pareto_figure(plan, points), plots, "bisection Pareto curve"))
    else:
        parts.append(_hint("plan.json has no Pareto points."))
    timed = _pareto_ms_points(plan.get("pareto"))
    if timed:
        parts.append(svg(cost_pareto_figure(plan, timed), plots, "accuracy against estimated board time"))
    intervals = _pareto_intervals(plan.get("pareto"))
    if intervals is not None:
        parts.append("<h3>Pareto points, held out</h3>" + _frame_table(intervals))
    sites = [s for s in plan.get("sites") or [] if isinstance(s, Mapping)]
    if sites:
        parts.append("<h3>Sites kept out of int8</h3>" + _frame_table(pd.DataFrame(sites)))
    facts = [
        ("target", esc(_target_line(plan.get("target")))),
        ("evaluations", esc(plan.get("evaluations", "–"))),
        *_board_time_fact(plan),
        ("model sha256", f"<code>{esc(plan.get('model_sha256', '–'))}</code>"),
    ]
    sha = (files.run.get("model") or {}).get("sha256")
    if sha and plan.get("model_sha256") and sha != plan.get("model_sha256"):
        facts.append(("warning", '<span class="bad">plan.json was made for a different model than run.json</span>'))
    parts.append(_kv_table(facts))
    return _section("bisect", "Bisection", "\n".join(parts))


def _calib_advice_section(files: RunFiles, plots: PlotCounter) -> str:
    """`scan --calib-advice`: spread against n, and the samples that alone set ranges (nothing without it)."""
    frame = files.calib_advice
    if frame is None or frame.empty or "kind" not in frame:
        return ""
    spread = frame[frame["kind"] == "spread"]
    parts = []
    if not spread.empty:
        tolerance = num(spread["tolerance"].iloc[0]) if "tolerance" in spread else math.nan
        parts.append(svg(spread_figure(spread, tolerance), plots, "scale spread against calibration samples"))
    deciders = frame[frame["kind"] == "decider"]
    if not deciders.empty:
        shown = [c for c in ("sample", "k", "max_drop", "cosine_with", "cosine_without", "advice") if c in deciders]
        parts.append("<h3>Samples that alone set a range</h3>" + _frame_table(deciders[shown].head(10)))
    return _section("calib-advice", "Calibration set", "\n".join(parts))


def _target_line(target: Any) -> str:
    if not isinstance(target, Mapping):
        return str(target)
    where = f" on output {target[Col.OUTPUT]}" if target.get(Col.OUTPUT) else ""
    return f"{target.get('metric', '?')} ≥ {target.get('value', '?')}{where}"


def _pareto_intervals(pareto: Any) -> pd.DataFrame | None:
    """Float sites, held-out value, its interval and the search's lower bound per Pareto point (None in a
    plan from before issue 32, which has no intervals)."""
    rows = [
        {"float_sites": p.get("float_sites"), "value": p.get("value"), "low": p["interval"].get("low"),
         "high": p["interval"].get("high"), "search_value": p.get("search_value"),
         **{k: p[k] for k in ("estimated_ms", "extra_ms") if k in p}}
        for p in pareto or [] if isinstance(p, Mapping) and isinstance(p.get("interval"), Mapping)
    ]
    return pd.DataFrame(rows) if rows else None


def _pareto_points(pareto: Any) -> list[tuple[float, float]]:
    """[(float site count, metric)], whether float_sites is a count or a list of site names."""
    points = []
    for p in pareto or []:
        if not isinstance(p, Mapping):
            continue
        fs = p.get("float_sites")
        n = float(len(fs)) if isinstance(fs, list) else num(fs)
        v = num(p.get("value"))
        if np.isfinite(n) and np.isfinite(v):
            points.append((n, v))
    return sorted(points)


def _pareto_ms_points(pareto: Any) -> list[tuple[float, float]]:
    """[(estimated ms, metric)] of the Pareto points plan.json priced (empty for a plan without a [cost]
    table behind it, or from before issue 39)."""
    points = []
    for p in pareto or []:
        if isinstance(p, Mapping):
            ms, v = num(p.get("estimated_ms")), num(p.get("value"))
            if np.isfinite(ms) and np.isfinite(v):
                points.append((ms, v))
    return sorted(points)


def _board_time_fact(plan: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The plan's estimated board time and its extra over all-int8, as a plan-card row (none when unpriced)."""
    ms, extra = num(plan.get("estimated_ms")), num(plan.get("extra_ms"))
    board = plan.get("board_time")
    if not np.isfinite(ms) or not isinstance(board, Mapping):
        return []
    over = f" ({extra:+.3f} ms over all-int8)" if np.isfinite(extra) else ""
    return [(f"board time on {board.get('profile', '?')}", esc(f"{ms:.3f} ms{over}, estimated"))]


# ------------------------------------------------------------------------------------------ about


def _about_section(files: RunFiles) -> str:
    parts = [
        "<p>Every number here comes from the CSV/JSON files in the run folder; "
        "<code>quantscan report RUN_DIR</code> rebuilds this page from them. "
        "Plots: matplotlib, inline SVG.</p>"
    ]
    if files.tensors is not None:
        parts.append(f"<p>tensors.csv: {len(files.tensors)} float tensors measured (not shown here).</p>")
    if files.summary:
        parts.append(f"<details><summary>summary.md</summary><pre>{esc(files.summary)}</pre></details>")
    return _section("about", "About this report", "\n".join(parts))


# ------------------------------------------------------------------------------------------- page


def _asset(name: str) -> str:
    """The page's stylesheet and script live beside this module as files (assets/), read as text."""
    return resources.files("quantscan.report").joinpath("assets", name).read_text(encoding="utf-8")


def _page(title: str, body: str) -> str:
    css, js = _asset("report.css"), _asset("report.js")
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>quantscan: {esc(title)}</title>\n<style>{css}</style></head>\n<body>\n{body}\n"
        f"<script>{js}</script>\n</body></html>\n"
    )


def device_page(table: pd.DataFrame) -> str:
    """A report.html of its own for a folder `quantscan dumps` wrote without a scan."""
    return _page("device dumps", _section("device", "Device dumps", device_body(table, PlotCounter())))
