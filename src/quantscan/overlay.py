"""Per-node data for Google's Model Explorer, so engineers see the int8 error on the graph itself.

Why its own module: the run folder's tables are keyed by node; Model Explorer (ai-edge-model-explorer,
ONNX adapter model-explorer-onnx) overlays "node data" files on a graph. Its format, as defined in
model_explorer/node_data_builder.py (`GraphNodeData.to_json_string`): one JSON object per metric,
`{"name": str, "results": {NODE_KEY: {"value": number|string, "bgColor"?: css, "textColor"?: css}},
"thresholds": [{"value": number, "bgColor": css, "textColor"?: css}], "gradient": [{"stop": 0..1,
"bgColor"?: css, "textColor"?: css}]}`. A node key is a node id (the ONNX adapter uses the ONNX node
name) or one of the node's output tensor names. One file holds one metric, so `-o nodes.json` holds
the cumulative SQNR and its siblings `nodes.<metric>.json` the others.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from quantscan import runfolder
from quantscan.columns import Col
from quantscan.errors import FileError
from quantscan.readers.jsonfile import read_json

SQNR_THRESHOLDS = ((10.0, "#d7191c"), (20.0, "#fdae61"), (30.0, "#ffffbf"), (1.0e9, "#a6d96a"))
"""SQNR bands (dB, upper bounds): red under ~1.5 useful bits, amber, pale, green; same for both SQNRs."""

GAIN_GRADIENT = ({"stop": 0, "bgColor": "#ffffff"}, {"stop": 1, "bgColor": "#d7191c"})
"""Gain if float: the larger the gain, the redder (the site worth keeping float)."""

METRICS = (
    ("cumulative_sqnr", Col.CUMULATIVE_SQNR_DB, "cumulative SQNR dB (all sites int8)"),
    ("isolated_sqnr", Col.ISOLATED_SQNR_DB, "isolated SQNR dB (this site alone int8)"),
    ("gain", Col.GAIN_IF_FLOAT, "gain if float (bisect)"),
)
"""(file suffix, layers.csv column, Model Explorer name): numeric metrics written when the column exists."""


@dataclass(frozen=True)
class OverlayFile:
    """One node-data file: its suffix (`""` for the main file), name and JSON content."""

    suffix: str
    data: dict[str, Any]


def node_data(name: str, values: Mapping[str, float | str], *, thresholds: bool = False,
              gradient: bool = False) -> dict[str, Any]:
    """A GraphNodeData object in Model Explorer's JSON form (the fields its builder writes)."""
    data: dict[str, Any] = {"name": name, "results": {k: {"value": v} for k, v in values.items()}}
    if thresholds:
        data["thresholds"] = [{"value": v, "bgColor": c} for v, c in SQNR_THRESHOLDS]
    if gradient:
        data["gradient"] = [dict(g) for g in GAIN_GRADIENT]
    return data


def _column_values(layers: pd.DataFrame, column: str) -> dict[str, float]:
    """Finite values of `column` by node name (the ONNX adapter's node id). dB to 4 decimals; a cosine
    gain to 4 significant digits, since gains of 1e-5 are typical and 4 decimals would show them as 0."""
    out: dict[str, float] = {}
    numbers = pd.to_numeric(layers[column], errors="coerce")  # a hand-edited cell is no figure, not a crash
    for node, raw in zip(layers[Col.NODE], numbers, strict=True):
        number = float(raw)
        if math.isfinite(number):
            out[str(node)] = round(number, 4) if column.endswith("_db") else float(f"{number:.4g}")
    return out


def _findings(layers: pd.DataFrame, compat: pd.DataFrame | None) -> dict[str, str]:
    """Per node, a short text: the scan's cause for the top-ranked sites and the chip rules it breaks."""
    texts: dict[str, list[str]] = {}
    if Col.CAUSE in layers.columns:
        for node, cause in zip(layers[Col.NODE], layers[Col.CAUSE], strict=True):
            if isinstance(cause, str) and cause and cause != "intrinsic":
                texts.setdefault(str(node), []).append(cause)
    if compat is not None and {Col.NODE, "rule"} <= set(compat.columns):
        for node, rule in zip(compat[Col.NODE], compat["rule"], strict=True):
            if isinstance(rule, str) and rule:
                texts.setdefault(str(node), []).append(rule)
    return {node: "; ".join(dict.fromkeys(items)) for node, items in texts.items()}


@dataclass(frozen=True)
class _Tables:
    """What the overlay reads from a folder: the per-node table, the compat findings, the bisect plan."""

    layers: pd.DataFrame
    compat: pd.DataFrame | None
    plan: dict[str, Any] | None


def _load_tables(run_dir: Path) -> _Tables:
    """A scan's run folder (run.json + layers.csv), or a bisect folder without a scan (plan.json +
    layers.csv/gain.csv): bisect writes no run.json of its own, and its gains are what the user
    most wants on the graph."""
    run_dir = Path(run_dir)
    if (run_dir / runfolder.RUN_JSON).is_file() or not (run_dir / "plan.json").is_file():
        run = runfolder.load_run(run_dir)
        return _Tables(run.layers, run.compat, runfolder.read_plan(run_dir / "plan.json", strict=True))
    for name in (runfolder.LAYERS_CSV, "gain.csv"):
        if (run_dir / name).is_file():
            layers = runfolder.read_table(run_dir / name, required=True)
            if layers is not None and Col.NODE in layers.columns:
                compat = runfolder.read_table(run_dir / "compat.csv")
                return _Tables(layers, compat, runfolder.read_plan(run_dir / "plan.json", strict=True))
    raise runfolder.ReportError(f"expected a bisect folder's layers.csv or gain.csv (a table with a node column) "
                                f"beside its plan.json, found neither in {run_dir}")


def _plan_values(plan: dict[str, Any] | None) -> dict[str, str]:
    """Per planned site, the precision bisect keeps it at (float, int16); every other site is int8."""
    sites = (plan or {}).get("sites") or []
    return {str(s[Col.NODE]): str(s.get("precision", "float")) for s in sites if isinstance(s, dict) and Col.NODE in s}


def build_overlay(run_dir: Path) -> list[OverlayFile]:
    """Every node-data file the folder supports: SQNRs after a scan, gain and plan after bisect,
    findings when any."""
    tables = _load_tables(run_dir)
    files: list[OverlayFile] = []
    for suffix, column, name in METRICS:
        if column in tables.layers.columns:
            values = _column_values(tables.layers, column)
            if values:
                is_sqnr = column.endswith("sqnr_db")
                files.append(OverlayFile("" if not files else suffix,
                                         node_data(name, values, thresholds=is_sqnr, gradient=not is_sqnr)))
    plan = _plan_values(tables.plan)
    if plan:
        files.append(OverlayFile("" if not files else "plan", node_data("bisect plan (kept precision)", plan)))
    findings = _findings(tables.layers, tables.compat)
    if findings:
        files.append(OverlayFile("" if not files else "findings", node_data("findings", findings)))
    return files


def overlay_paths(out: Path, files: list[OverlayFile]) -> list[Path]:
    """`nodes.json` for the first file, `nodes.<suffix>.json` beside it for the others."""
    return [out if not f.suffix else out.with_name(f"{out.stem}.{f.suffix}{out.suffix or '.json'}") for f in files]


NAMES = frozenset({name for _s, _c, name in METRICS} | {"findings"})
"""The `name` of every node-data object quantscan writes."""


def is_overlay_file(path: Path) -> bool:
    """A node-data file quantscan wrote: a JSON object with `results` and one of our metric names."""
    try:
        data = read_json(Path(path), "-o")
    except FileError:
        return False
    return isinstance(data, dict) and data.get("name") in NAMES and isinstance(data.get("results"), dict)


def write_overlay(run_dir: Path, out: Path, *, force: bool = False) -> list[Path]:
    """Write the node-data files; returns their paths (the main one first). Refuses, before writing any,
    a path that is one of the run folder's files and a file quantscan did not write (unless `force`)."""
    if not Path(out).name or Path(out).is_dir():
        raise runfolder.UsageError(f"-o: expected a file path for the node data, found a folder at {out or '.'}")
    files = build_overlay(run_dir)
    paths = overlay_paths(Path(out), files)
    runfolder.refuse_inputs(paths, runfolder.run_members(Path(run_dir)), "-o")
    for path in paths:
        runfolder.refuse_foreign_overwrite(path, "-o", is_overlay_file, force)
    for path, f in zip(paths, files, strict=True):
        runfolder.write_json(path, f.data)
    return paths
