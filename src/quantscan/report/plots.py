"""report.html's figures: matplotlib `Figure`s rendered to lean inline SVG.

Figures are drawn on the Agg/SVG canvases directly, never pyplot, so rendering a report neither
needs a display nor switches the backend of a process that imported quantscan (a notebook keeps
its own). Dense artists (hundreds of channels or sites) are rasterized inside the SVG to keep the
page small; every figure gets its own id salt so the same folder renders to the same bytes.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from quantscan.columns import Col
from quantscan.report.cells import col, esc, fmt, metric_value, num, short, truthy

COLORS = {
    "cum": "#1f6fb4",
    "iso": "#e07b22",
    "sens": "#c62828",
    "cpu": "#6d6d6d",
    "grid": "#7b1fa2",
    "fp32": "#1f6fb4",
    "int8": "#e07b22",
    "w": "#2e7d32",
    "ok": "#2e7d32",
}


DENSE_POINTS = 300
"""Above this many points an artist is rasterized (PNG inside the SVG): a 1,500-site model stays < 2 MB."""


class PlotCounter:
    """Gives every figure its own SVG id salt, so ids of several inline SVGs never collide, and the
    same folder renders to the same bytes."""

    def __init__(self) -> None:
        self.n = 0

    def salt(self) -> str:
        self.n += 1
        return f"qs{self.n}"


def figure(width: float, height: float, ncols: int = 1) -> tuple[Figure, list[Any]]:
    """Fixed margins instead of a layout engine: constrained layout draws every figure twice and
    doubled the report's build time for no visible gain on these simple panels."""
    fig = Figure(figsize=(width, height), dpi=100)
    fig.subplots_adjust(left=0.6 / width, right=1 - 0.5 / width, bottom=0.5 / height, top=1 - 0.3 / height, wspace=0.4)
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    for ax in axes:
        ax.grid(True, color="#e4e4e4", linewidth=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        ax.tick_params(labelsize=8)
    return fig, axes


_SVG_DROP = re.compile(r"<style type=\"text/css\">.*?</style>|<metadata>.*?</metadata>|<defs>\s*</defs>", re.S)


_SVG_FONT = re.compile(r"font-family: [^;\"]*;? ?")


_SVG_ID = re.compile(r' id="([^"]+)"')


_SVG_NUM = re.compile(r"(\d+\.\d)\d+")


_SVG_NOROT = re.compile(r' transform="rotate\(-?0 [^"]*\)"')


_SVG_G = re.compile(r"<g>|<g\s[^>]*>|</g>")


_SVG_GEOM = re.compile(r' (d|x|y|width|height)="([^"]*)"')


def svg(fig: Figure, plots: PlotCounter, label: str) -> str:
    """Inline SVG markup of `fig`, made lean for inlining: no XML prolog, metadata or per-figure
    stylesheet, fonts left to the page's CSS, coordinates at 0.1 px, and only the ids something
    refers to (clip paths, markers): matplotlib's group ids would repeat in every figure of the page."""
    buf = io.StringIO()
    rc: dict[str, Any] = {"svg.fonttype": "none", "svg.hashsalt": plots.salt(), "font.size": 8}
    with matplotlib.rc_context(rc):  # type: ignore[arg-type]
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None}, dpi=110)
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = _SVG_FONT.sub("", _SVG_DROP.sub("", text))
    text = _SVG_GEOM.sub(_round_geometry, text)
    used = set(re.findall(r"#([^\")\s]+)", text))
    text = _SVG_ID.sub(lambda m: m[0] if m[1] in used else "", text)
    text = _SVG_NOROT.sub("", re.sub(r">\s+<", "><", text))
    text = _unwrap_plain_groups(text)
    text = re.sub(r'<svg([^>]*?) width="[^"]*" height="[^"]*"', r"<svg\1", text, count=1)
    width_px = fig.get_figwidth() * 100
    text = text.replace("<svg", f'<svg role="img" aria-label="{esc(label)}" style="max-width:{width_px:.0f}px"', 1)
    return f'<figure class="plot">{text}</figure>'


def _unwrap_plain_groups(svg: str) -> str:
    """Drop attribute-less <g> wrappers (and their matching </g>): a third of matplotlib's markup."""
    out: list[str] = []
    stack: list[bool] = []
    pos = 0
    for m in _SVG_G.finditer(svg):
        out.append(svg[pos : m.start()])
        pos = m.end()
        tag = m[0]
        if tag == "</g>":
            if not stack.pop():
                out.append(tag)
        else:
            plain = tag == "<g>"
            stack.append(plain)
            if not plain:
                out.append(tag)
    out.append(svg[pos:])
    return "".join(out)


def _round_geometry(match: re.Match[str]) -> str:
    value = _SVG_NUM.sub(r"\1", " ".join(match[2].split()))
    return f' {match[1]}="{value}"'


def is_dense(n: int, limit: int = DENSE_POINTS) -> bool:
    return n > limit


def finite_cap(values: np.ndarray) -> tuple[np.ndarray, float | None]:
    """+inf (exact match) plotted at a cap just above the finite maximum; returns values and the cap."""
    finite = values[np.isfinite(values)]
    if not np.isposinf(values).any():
        return values, None
    cap = float(finite.max()) + 6.0 if finite.size else 60.0
    return np.where(np.isposinf(values), cap, values), cap


def depth_figure(layers: pd.DataFrame) -> Figure:
    data = layers.assign(_o=col(layers, Col.ORDER)).sort_values("_o", kind="stable")
    x = data["_o"].to_numpy()
    cum, cap_c = finite_cap(col(data, Col.CUMULATIVE_SQNR_DB))
    iso, cap_i = finite_cap(col(data, Col.ISOLATED_SQNR_DB))
    fig, (ax,) = figure(11, 3.8)
    dense = is_dense(len(x))
    ax.plot(
        x,
        cum,
        color=COLORS["cum"],
        lw=1.4,
        marker="o" if not dense else None,
        ms=3,
        label="cumulative SQNR (all sites int8)",
        rasterized=dense,
    )
    ax.scatter(x, iso, s=10, color=COLORS["iso"], label="isolated SQNR (this site alone)", zorder=3, rasterized=dense)
    _mark_sensitive(ax, data, x)
    _mark_cpu(ax, data, x)
    _label_top(ax, data, x, cum)
    cap = max(c for c in (cap_c, cap_i, None) if c is not None) if (cap_c or cap_i) else None
    if cap is not None:
        ax.axhline(cap, color="#999", lw=0.6, ls=":")
        ax.text(x.min(), cap, " inf (exact) plotted here", fontsize=7, va="bottom", color="#666")
    ax.set_xlabel("topological order (node index in the original graph)", fontsize=8)
    ax.set_ylabel("SQNR dB (higher is better)", fontsize=8)
    ax.legend(fontsize=7, loc="upper right", ncols=2, frameon=False)
    return fig


def device_figure(table: pd.DataFrame) -> Figure:
    """device.csv along the network: FP32<->simulation, FP32<->device, simulation<->device SQNR per site, the
    first departure marked. Where the third line falls below the first, the device leaves the simulation."""
    data = table[table["dump"].fillna("").astype(str) != ""].sort_values(Col.ORDER, kind="stable")
    x = data[Col.ORDER].to_numpy()
    fig, (ax,) = figure(11, 3.4)
    dense = is_dense(len(x))
    lines = (("fp32_sim_sqnr_db", "FP32 ↔ simulation", COLORS["cum"]),
             ("fp32_device_sqnr_db", "FP32 ↔ device", COLORS["iso"]),
             ("sim_device_sqnr_db", "simulation ↔ device", COLORS["sens"]))
    caps = []
    for column, label, color in lines:
        values, cap = finite_cap(col(data, column))
        caps.append(cap)
        ax.plot(x, values, color=color, lw=1.3, marker=None if dense else "o", ms=3, label=label, rasterized=dense)
    first = data[data["first_departure"].astype(bool)]
    if not first.empty:
        ax.axvline(float(first[Col.ORDER].iloc[0]), color=COLORS["sens"], lw=0.8, ls="--")
        ax.text(float(first[Col.ORDER].iloc[0]), ax.get_ylim()[1], f" first departure: {first[Col.NODE].iloc[0]}",
                fontsize=7, va="top", color=COLORS["sens"])
    if any(c is not None for c in caps):
        ax.text(x.min() if len(x) else 0, max(c for c in caps if c is not None), " inf (exact) plotted here",
                fontsize=7, va="bottom", color="#666")
    ax.set_xlabel("topological order (node index in the original graph)", fontsize=8)
    ax.set_ylabel("SQNR dB (higher is closer)", fontsize=8)
    ax.legend(fontsize=7, loc="upper right", ncols=3, frameon=False)
    return fig


def _mark_sensitive(ax: Any, data: pd.DataFrame, x: np.ndarray) -> None:
    if Col.SENSITIVE_OP not in data:
        return
    mask = np.array([truthy(v) for v in data[Col.SENSITIVE_OP]])
    if mask.any():
        ax.vlines(
            x[mask],
            0,
            1,
            transform=ax.get_xaxis_transform(),
            color=COLORS["sens"],
            alpha=0.35,
            lw=1.2,
            label="sensitive op (Softmax, LayerNorm, ...)",
            rasterized=is_dense(int(mask.sum())),
        )


def _mark_cpu(ax: Any, data: pd.DataFrame, x: np.ndarray) -> None:
    if Col.PLACEMENT not in data:
        return
    mask = (data[Col.PLACEMENT].astype(str).str.lower() == "cpu").to_numpy()
    if mask.any():
        ax.vlines(
            x[mask],
            0,
            0.06,
            transform=ax.get_xaxis_transform(),
            color=COLORS["cpu"],
            lw=3,
            label="CPU fallback (profile)",
        )


def _label_top(ax: Any, data: pd.DataFrame, x: np.ndarray, cum: np.ndarray) -> None:
    """Name the five worst-ranked sites on the plot: the first places to look."""
    if Col.RANK not in data:
        return
    rank = col(data, Col.RANK)
    iso = col(data, Col.ISOLATED_SQNR_DB)
    for j, i in enumerate(np.argsort(rank, kind="stable")[:5]):
        if not math.isfinite(rank[i]):  # a hand-edited "inf" rank names no place
            continue
        y = iso[i] if np.isfinite(iso[i]) else cum[i]
        ax.annotate(
            f"#{int(rank[i])} {short(str(data[Col.NODE].iloc[i]))}",
            (x[i], y),
            xytext=(4, -10 + 18 * (j % 2)),
            textcoords="offset points",
            fontsize=7,
            color="#333",
        )


def layer_figure(
    rec: Mapping[str, Any],
    channels: pd.DataFrame | None,
    hist: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
    qrange: tuple[int, int],
) -> Figure | None:
    has_act = channels is not None and {"act_min", "act_max"} <= set(channels.columns)
    has_w = (
        channels is not None
        and "weight_absmax" in channels
        and bool(np.isfinite(col(channels, "weight_absmax")).any())
    )
    panels: list[Callable[[Any], None]] = []
    if has_act and channels is not None:
        panels.append(lambda ax: _act_panel(ax, channels, rec, qrange))
    if has_w and channels is not None:
        panels.append(lambda ax: _weight_panel(ax, channels))
    if hist is not None:
        panels.append(lambda ax: _hist_panel(ax, *hist))
    if not panels:
        return None
    fig, axes = figure(3.9 * len(panels), 2.7, ncols=len(panels))
    for draw, ax in zip(panels, axes, strict=True):
        draw(ax)
    return fig


def _act_panel(ax: Any, channels: pd.DataFrame, rec: Mapping[str, Any], qrange: tuple[int, int]) -> None:
    ch = _channel_axis(channels)
    lo, hi = col(channels, "act_min"), col(channels, "act_max")
    dense = is_dense(len(ch))
    ax.stairs(
        hi,
        _edges(ch),
        baseline=lo,
        fill=True,
        color=COLORS["cum"],
        alpha=0.45,
        lw=0,
        label="channel min..max",
        rasterized=dense,
    )
    scale, zp = num(rec.get(Col.ACT_SCALE)), num(rec.get(Col.ACT_ZERO_POINT))
    if np.isfinite(scale) and np.isfinite(zp):
        for q in qrange:
            ax.axhline((q - zp) * scale, color=COLORS["grid"], ls="--", lw=0.9)
    if "act_sqnr_db" in channels:
        twin = ax.twinx()
        twin.plot(ch, col(channels, "act_sqnr_db"), "o", ms=2, color=COLORS["iso"], rasterized=is_dense(len(ch), 64))
        twin.set_ylabel("channel SQNR dB (dots)", fontsize=7, color=COLORS["iso"])
        twin.tick_params(labelsize=7, colors=COLORS["iso"])
        twin.spines["top"].set_visible(False)
    ax.set_title("activation range per channel vs per-tensor grid (dashed)", fontsize=8)
    ax.set_xlabel("channel", fontsize=7)


def _weight_panel(ax: Any, channels: pd.DataFrame) -> None:
    ch = _channel_axis(channels)
    w = col(channels, "weight_absmax")
    positive = w[np.isfinite(w) & (w > 0)]
    spread = positive.max() / positive.min() if positive.size else math.nan
    log = bool(spread > 30)
    baseline = positive.min() / 2 if log else 0.0
    ax.stairs(
        np.where(np.isfinite(w), np.maximum(w, baseline), baseline),
        _edges(ch),
        baseline=baseline,
        fill=True,
        color=COLORS["w"],
        alpha=0.6,
        lw=0,
        rasterized=is_dense(len(ch)),
    )
    if log:
        _log_y(ax)
    ax.set_title(f"weight |max| per output channel (spread ×{fmt(spread, '.3g')})", fontsize=8)
    ax.set_xlabel("output channel", fontsize=7)


def _hist_panel(ax: Any, edges: np.ndarray, fp32: np.ndarray, int8: np.ndarray) -> None:
    ax.stairs(fp32, edges, color=COLORS["fp32"], lw=1.2, label="FP32")
    ax.stairs(int8, edges, color=COLORS["int8"], lw=1.0, label="int8 (dequantized)")
    if (fp32 > 0).any() or (int8 > 0).any():
        _log_y(ax)
    ax.set_title("output values", fontsize=8)
    ax.set_xlabel("value", fontsize=7)
    ax.legend(fontsize=6, frameon=False)


def _edges(ch: np.ndarray) -> np.ndarray:
    """Bin edges centred on the channel indices, for stairs()."""
    return np.concatenate([ch - 0.5, ch[-1:] + 0.5]) if len(ch) else np.array([0.0])


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def _log_y(ax: Any) -> None:
    """Log y axis labelled 10³ in plain text: the default mathtext labels cost a third of the build."""
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(_pow10))


def _pow10(value: float, _pos: int | None = None) -> str:
    if value <= 0 or not math.isfinite(value):
        return ""
    exp = math.log10(value)
    if abs(exp - round(exp)) < 1e-9:
        return "10" + str(round(exp)).translate(_SUPERSCRIPT)
    return f"{value:g}"


def _channel_axis(channels: pd.DataFrame) -> np.ndarray:
    ch = col(channels, "channel")
    return ch if np.isfinite(ch).all() else np.arange(len(channels), dtype=np.float64)


def pareto_figure(plan: Mapping[str, Any], points: Sequence[tuple[float, float]]) -> Figure:
    target = plan.get("target") or {}
    metric = str(target.get("metric", "cosine"))
    xs, ys = zip(*points, strict=True)
    fig, (ax,) = figure(8, 3.2)
    ax.step(xs, ys, where="post", color=COLORS["cum"], lw=1.4)
    ax.plot(xs, ys, "o", color=COLORS["cum"], ms=4, label="Pareto front")
    refs = (
        (target.get("value"), "target", COLORS["sens"], "--"),
        (metric_value(plan.get("all_int8"), metric), "all int8", COLORS["iso"], ":"),
        (metric_value(plan.get("all_float"), metric), "all float", COLORS["ok"], ":"),
    )
    for value, label, color, style in refs:
        if np.isfinite(num(value)):
            ax.axhline(num(value), color=color, ls=style, lw=1, label=f"{label} {num(value):.5g}")
    achieved = metric_value(plan.get("achieved"), metric)
    if np.isfinite(achieved):
        ax.plot([len(plan.get("sites") or [])], [achieved], "*", ms=12, color=COLORS["sens"], label="chosen plan")
    ax.set_xlabel("sites kept in float", fontsize=8)
    ax.set_ylabel(f"output {metric}", fontsize=8)
    ax.legend(fontsize=7, frameon=False, loc="best")
    return fig


def cost_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (ms, value) points no other point beats on both axes (no faster point is at least as accurate),
    fastest first: the plans worth their time."""
    front: list[tuple[float, float]] = []
    for ms, value in sorted(points, key=lambda p: (p[0], -p[1])):
        if not front or value > front[-1][1]:
            front.append((ms, value))
    return front


def cost_pareto_figure(plan: Mapping[str, Any], points: Sequence[tuple[float, float]]) -> Figure:
    """Held-out accuracy against estimated board time, one dot per Pareto point of the site search: the
    fewest-sites curve is not the cheapest, since sites differ in what they cost at the fallback precision."""
    target = plan.get("target") or {}
    metric = str(target.get("metric", "cosine"))
    board = plan.get("board_time") or {}
    fig, (ax,) = figure(8, 3.2)
    xs, ys = zip(*points, strict=True)
    ax.plot(xs, ys, "o", color=COLORS["cum"], ms=4, alpha=0.5, label="Pareto points of the site search")
    fx, fy = zip(*cost_front(points), strict=True)
    ax.step(fx, fy, where="post", color=COLORS["cum"], lw=1.4, label="front in accuracy x time")
    int8_ms, int8_value = num(board.get("int8_ms")), metric_value(plan.get("all_int8"), metric)
    if np.isfinite(int8_ms) and np.isfinite(int8_value):
        ax.plot([int8_ms], [int8_value], "s", ms=6, color=COLORS["iso"], label=f"all int8 {int8_ms:.3g} ms")
    goal = num(target.get("value"))
    if np.isfinite(goal):
        ax.axhline(goal, color=COLORS["sens"], ls="--", lw=1, label=f"target {goal:.7g}")
    chosen_ms, achieved = num(plan.get("estimated_ms")), metric_value(plan.get("achieved"), metric)
    if np.isfinite(chosen_ms) and np.isfinite(achieved):
        ax.plot([chosen_ms], [achieved], "*", ms=12, color=COLORS["sens"], label="chosen plan")
    ax.set_xlabel(f"board time on {board.get('profile', '?')}, ms (estimated, not measured)", fontsize=8)
    ax.set_ylabel(f"output {metric}", fontsize=8)
    ax.legend(fontsize=7, frameon=False, loc="best")
    return fig


def spread_figure(spread: pd.DataFrame, tolerance: float) -> Figure:
    """calib-advice: the scales' bootstrap spread against the number of calibration samples."""
    n = spread["n"].to_numpy(float)
    fig, (ax,) = figure(8, 3.0)
    ax.plot(n, 100 * spread["spread_p90"].to_numpy(float), "o-", color=COLORS["sens"], ms=4,
            label="p90 over tensors")
    ax.plot(n, 100 * spread["spread_median"].to_numpy(float), "o-", color=COLORS["cum"], ms=4, label="median")
    if np.isfinite(tolerance):
        ax.axhline(100 * tolerance, color=COLORS["ok"], ls="--", lw=1, label=f"settled ({tolerance:.0%})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(n, [str(int(v)) for v in n])
    ax.set_xlabel("calibration samples n (bootstrap draws)", fontsize=8)
    ax.set_ylabel("scale spread (p95-p5)/median, %", fontsize=8)
    ax.legend(fontsize=7, frameon=False, loc="best")
    return fig
