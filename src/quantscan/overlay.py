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

SQNR_THRESHOLDS = ((10.0, "#d7191c"), (20.0, "#fdae61"), (30.0, "#ffffbf"), (1.0e9, "#a6d96a"))
"""SQNR bands (dB, upper bounds): red under ~1.5 useful bits, amber, pale, green; same for both SQNRs."""

GAIN_GRADIENT = ({"stop": 0, "bgColor": "#ffffff"}, {"stop": 1, "bgColor": "#d7191c"})
"""Gain if float: the larger the gain, the redder (the site worth keeping float)."""

METRICS = (
    ("cumulative_sqnr", "cumulative_sqnr_db", "cumulative SQNR dB (all sites int8)"),
    ("isolated_sqnr", "isolated_sqnr_db", "isolated SQNR dB (this site alone int8)"),
    ("gain", "gain_if_float", "gain if float (bisect)"),
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
    """Finite values of `column` by node name (the ONNX adapter's node id)."""
    out: dict[str, float] = {}
    numbers = pd.to_numeric(layers[column], errors="coerce")  # a hand-edited cell is no figure, not a crash
    for node, raw in zip(layers["node"], numbers, strict=True):
        number = float(raw)
        if math.isfinite(number):
            out[str(node)] = round(number, 4)
    return out


def _findings(layers: pd.DataFrame, compat: pd.DataFrame | None) -> dict[str, str]:
    """Per node, a short text: the scan's cause for the top-ranked sites and the chip rules it breaks."""
    texts: dict[str, list[str]] = {}
    if "cause" in layers.columns:
        for node, cause in zip(layers["node"], layers["cause"], strict=True):
            if isinstance(cause, str) and cause and cause != "intrinsic":
                texts.setdefault(str(node), []).append(cause)
    if compat is not None and {"node", "rule"} <= set(compat.columns):
        for node, rule in zip(compat["node"], compat["rule"], strict=True):
            if isinstance(rule, str) and rule:
                texts.setdefault(str(node), []).append(rule)
    return {node: "; ".join(dict.fromkeys(items)) for node, items in texts.items()}


def build_overlay(run_dir: Path) -> list[OverlayFile]:
    """Every node-data file the run folder supports: SQNRs always, gain after bisect, findings when any."""
    run = runfolder.load_run(Path(run_dir))
    files: list[OverlayFile] = []
    for suffix, column, name in METRICS:
        if column in run.layers.columns:
            values = _column_values(run.layers, column)
            if values:
                is_sqnr = column.endswith("sqnr_db")
                files.append(OverlayFile("" if not files else suffix,
                                         node_data(name, values, thresholds=is_sqnr, gradient=not is_sqnr)))
    findings = _findings(run.layers, run.compat)
    if findings:
        files.append(OverlayFile("findings", node_data("findings", findings)))
    return files


def overlay_paths(out: Path, files: list[OverlayFile]) -> list[Path]:
    """`nodes.json` for the first file, `nodes.<suffix>.json` beside it for the others."""
    return [out if not f.suffix else out.with_name(f"{out.stem}.{f.suffix}{out.suffix or '.json'}") for f in files]


NAMES = frozenset({name for _s, _c, name in METRICS} | {"findings"})
"""The `name` of every node-data object quantscan writes."""


def is_overlay_file(path: Path) -> bool:
    """A node-data file quantscan wrote: a JSON object with `results` and one of our metric names."""
    try:
        data = runfolder.parse_json(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
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
