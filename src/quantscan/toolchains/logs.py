"""`quantscan log FILE [--model M]`: recognise the tool, parse its log, map names, build the findings.

The command's API: `read_log` returns the parsed log, the findings as compat.csv rows (the
contract's columns) and a per-layer table (`log_layers.csv`: every vendor name the log printed in
its placement or similarity tables, its ONNX node when mapped, its placement and cosines). Files
are written by the CLI through runfolder; this module only reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from quantscan.columns import Col
from quantscan.errors import UsageError
from quantscan.graph.index import GraphIndex
from quantscan.readers.text import read_bytes
from quantscan.records import FINDING_COLUMNS, FINDING_DETAIL_COLUMNS, Finding
from quantscan.toolchains import TOOLCHAINS, every_rename
from quantscan.toolchains.findings import (
    RULE_MISMATCH,
    RULE_PRECISION,
    log_findings,
    placement_mismatches,
    unsupported_findings,
)
from quantscan.toolchains.parsed import ParsedLog
from quantscan.toolchains.renaming import NameMapper, NameMatch

MAX_LOG_BYTES = 256 * 1024 * 1024
"""A conversion log is megabytes; a bigger file is not one run's log (and would be read whole)."""

LAYER_COLUMNS = ("layer", "vendor_op", Col.NODE, Col.OP_TYPE, "tensor", "mapped_by", Col.PLACEMENT, "check_placement",
                 "dtype", "partition", "entire_cosine", "single_cosine", "is_output", "line")
"""log_layers.csv: one row per vendor name, placement-table names first, then similarity-only names.
`check_placement` is where `check --profile P` puts the mapped node (only with a model and a profile)."""


@dataclass
class LogReading:
    """One log read: what it said, the findings it makes, and how its names map to the model."""

    parsed: ParsedLog
    records: list[Finding]
    findings: pd.DataFrame
    details: pd.DataFrame
    layers: pd.DataFrame
    matches: dict[str, NameMatch] = field(default_factory=dict)
    model_given: bool = False
    profile: str = ""
    """The `check` profile the vendor's placements were compared with ("" when none was given)."""

    @property
    def unmapped(self) -> list[str]:
        """Vendor names no node, tensor or renaming rule explains (empty without a model)."""
        return [name for name, match in self.matches.items() if not match.mapped]

    def summary_lines(self) -> list[str]:
        """What the command prints: stage, failure, placements, the lowest cosine, the unmapped names."""
        parsed = self.parsed
        lines = [f"{parsed.label}: last stage finished: {parsed.stage_reached or 'none shown'}"]
        if parsed.failure is not None:
            failure = parsed.failure
            where = f" at {failure.vendor_op} '{failure.layer}'".replace("  ", " ") if failure.layer else ""
            step = f" ({failure.step})" if failure.step else ""
            lines.append(f"failed in {failure.stage}{step}{where}: {failure.message}")
        if parsed.layers:
            cpu = sum(1 for r in parsed.layers if r.target == "cpu" and not r.io_operator)
            wide = int((self.findings["rule"] == RULE_PRECISION).sum())
            lines.append(f"placement table: {len(parsed.layers)} rows, {cpu} on the CPU, {wide} kept wider than int8")
        lowest = _lowest_cosine(parsed)
        if lowest:
            lines.append(lowest)
        if self.profile:
            mismatches = self.findings[self.findings["rule"] == RULE_MISMATCH]
            nodes = ", ".join(mismatches[Col.NODE].tolist()[:8])
            lines.append(f"check --profile {self.profile}: {len(mismatches)} placement mismatches"
                         + (f" ({nodes})" if nodes else ""))
        if self.model_given:
            unmapped = self.unmapped
            names = f"; unmapped: {', '.join(unmapped[:8])}{' ...' if len(unmapped) > 8 else ''}" if unmapped else ""
            mapped = len(self.matches) - len(unmapped)
            lines.append(f"mapped {mapped}/{len(self.matches)} vendor names to the model{names}")
        return lines


def _lowest_cosine(parsed: ParsedLog) -> str:
    """The similarity row with the lowest cosine (single when the tool prints it, else accumulated)."""
    scored = [(s.single_cosine if s.single_cosine is not None else s.entire_cosine, s) for s in parsed.similarity]
    rows = [(value, s) for value, s in scored if value is not None]
    if not rows:
        return ""
    value, worst = min(rows, key=lambda item: item[0])
    kind = "single cosine" if worst.single_cosine is not None else "cosine"
    return f"similarity table: {len(rows)} rows with figures, lowest {kind} {value:.5f} at {worst.layer}"


def read_log(path: str | Path, model: str | Path | None = None, profile: str | Path | None = None) -> LogReading:
    """Parse the log at `path`; with `model`, name the ONNX node behind each vendor layer; with `profile`
    too, put each vendor placement beside the one `check --profile` predicts (a mismatch is a finding)."""
    if profile is not None and model is None:
        raise UsageError("--profile: expected --model too (check places the model's nodes), found no --model")
    text = read_log_text(Path(path))
    parsed = parse_log_text(text, str(path))
    matches: dict[str, NameMatch] = {}
    predicted: dict[str, str] = {}
    profile_name = ""
    unsupported: dict[str, str] = {}
    if model is not None:
        index = _model_index(model)
        matches = map_names(parsed, index)
        unsupported = nodes_of_types(index, parsed.unsupported_ops)
    if model is not None and profile is not None:
        profile_name, predicted = check_placement_of(model, profile)
    records = log_findings(parsed, matches)
    records += unsupported_findings(parsed, unsupported)
    records += placement_mismatches(parsed, matches, predicted, profile_name)
    rows = [f.to_row() for f in records]
    return LogReading(
        parsed=parsed,
        records=records,
        findings=pd.DataFrame(rows, columns=list(FINDING_COLUMNS)),
        details=pd.DataFrame(rows, columns=list(FINDING_DETAIL_COLUMNS)),
        layers=layer_table(parsed, matches, predicted),
        matches=matches,
        model_given=model is not None,
        profile=profile_name,
    )


def check_placement_of(model: str | Path, profile: str | Path) -> tuple[str, dict[str, str]]:
    """The profile's name and where `check` places each node of the model (npu/cpu)."""
    from quantscan.compat.check import check

    result = check(model, [profile])
    name = result.profiles[0]
    return name, dict(result.node_placement.get(name, {}))


def read_log_text(path: Path) -> str:
    """The log's text (undecodable bytes replaced), or one UsageError saying what the file is instead."""
    if not path.exists():
        raise UsageError(f"expected a vendor conversion log file, found nothing at {path}")
    if path.is_dir():
        raise UsageError(f"expected a vendor conversion log file, found a directory: {path}")
    size = path.stat().st_size
    if size == 0:
        raise UsageError(f"expected a vendor conversion log, found an empty file: {path}")
    if size > MAX_LOG_BYTES:
        raise UsageError(f"expected a conversion log of at most {MAX_LOG_BYTES >> 20} MiB, found {size} bytes "
                         f"in {path} (cut it to one conversion run)")
    data = read_bytes(path, "expected a vendor conversion log", MAX_LOG_BYTES)
    if b"\x00" in data[:4096]:
        raise UsageError(f"expected a text conversion log, found a binary file: {path}")
    return data.decode("utf-8", errors="replace")


def parse_log_text(text: str, where: str = "the log") -> ParsedLog:
    """The parser whose tool's markers the text carries (the first in `TOOLCHAINS` order); UsageError when
    no supported tool's are there."""
    readers = [(tool.label, tool.log) for tool in TOOLCHAINS.values() if tool.log is not None]
    for _, reader in readers:
        if reader.looks_like(text):
            return reader.parse(text)
    labels = [label for label, _ in readers]
    named = f"{', '.join(labels[:-1])} or {labels[-1]}" if len(labels) > 1 else labels[0]
    raise UsageError(f"expected an {named} conversion log, found none of their markers in {where}")


def _model_index(model: str | Path) -> GraphIndex:
    from quantscan.model import load_model

    return GraphIndex.of(load_model(model).proto)


def nodes_of_types(index: GraphIndex, op_types: list[str]) -> dict[str, str]:
    """Node name -> op type for every node of the given op types (the tool named types, not nodes)."""
    wanted = set(op_types)
    return {index.names[i]: node.op_type for i, node in enumerate(index.nodes) if node.op_type in wanted}


def map_names(parsed: ParsedLog, index: GraphIndex) -> dict[str, NameMatch]:
    """Every vendor name the log printed (failure, placement rows, similarity rows) on the model."""
    mapper = NameMapper(index, every_rename())
    names = [parsed.failure.layer] if parsed.failure is not None and parsed.failure.layer else []
    names += [row.layer for row in parsed.layers if not row.io_operator]
    names += [row.layer for row in parsed.similarity]
    names += [row.tensor for row in parsed.weight_outliers]
    return {name: mapper.match(name) for name in dict.fromkeys(names)}


def layer_table(parsed: ParsedLog, matches: dict[str, NameMatch],
                predicted: dict[str, str] | None = None) -> pd.DataFrame:
    """log_layers.csv: placement rows (with their cosine when the tool prints one), then similarity rows."""
    predicted = predicted or {}
    rows: list[dict[str, object]] = []
    for layer in parsed.layers:
        if layer.io_operator:
            continue
        match = matches.get(layer.layer)
        rows.append({**_mapped(match), "layer": layer.layer, "vendor_op": layer.vendor_op,
                     Col.PLACEMENT: layer.target, "check_placement": predicted.get(match.node, "") if match else "",
                     "dtype": layer.dtype, "partition": layer.partition, "entire_cosine": layer.cosine,
                     "line": layer.line})
    placed = {layer.layer for layer in parsed.layers}
    for sim in parsed.similarity:
        if sim.layer in placed and not sim.is_output:
            continue
        rows.append({**_mapped(matches.get(sim.layer)), "layer": sim.layer, "vendor_op": sim.vendor_op,
                     "entire_cosine": sim.entire_cosine, "single_cosine": sim.single_cosine,
                     "is_output": sim.is_output, "line": sim.line})
    return pd.DataFrame(rows, columns=list(LAYER_COLUMNS))


def _mapped(match: NameMatch | None) -> dict[str, object]:
    """The mapping columns; all empty when no model was given (nothing was looked up)."""
    if match is None:
        return {Col.NODE: "", Col.OP_TYPE: "", "tensor": "", "mapped_by": ""}
    return {Col.NODE: match.node, Col.OP_TYPE: match.op_type, "tensor": match.tensor, "mapped_by": match.mapped_by}
