"""summary.md's hand-off table: one row per distinct cause, errors first, with the count and nodes."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from quantscan.compat.check import check
from quantscan.report.summary import _profile_section

LAYERS = pd.DataFrame(columns=["node", "cause", "reason", "isolated_sqnr_db", "cumulative_sqnr_db", "placement"])


@pytest.mark.real
def test_a_recogniser_hand_off_is_grouped_and_ordered(assets: Path) -> None:
    compat = check(assets / "models" / "ppocrv4_rec.onnx", ["horizon-x3"])
    source = SimpleNamespace(compat=compat, profile="horizon-x3", layers=LAYERS)
    lines = _profile_section(source)  # type: ignore[arg-type]
    start = lines.index("| nodes | limit | strategy | numeric check | latency note |")
    rows = [line for line in lines[start + 2:] if line.startswith("| ")]
    findings = compat.findings[compat.findings["severity"].isin(["error", "warn"]) & (compat.findings["node"] != "")]
    nodes = findings["node"].drop_duplicates()
    assert len(rows) < len(nodes) / 2, (len(rows), len(nodes))  # grouped, not one row per node
    counts = [int(m.group(1)) if (m := re.search(r"\((\d+) nodes\)", r)) else 1 for r in rows]
    assert sum(counts) == len(nodes)  # every node is in exactly one row
    severities = [r.split("|")[2].split()[0] for r in rows]
    assert severities == sorted(severities, key=lambda s: s != "error")  # errors first
