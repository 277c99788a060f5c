"""CheckResult: the findings and partitions of one model against several profiles, as tables.

`findings` has exactly the compat.csv columns (contract order); `details` holds the reason, source,
verification flag and suggested rewrite for the same rows; `records` the same rows as typed `Finding`s.
Rows that are not nodes (the model's opset) have empty node/op_type/placement/partition; a graph
input's row takes its first consumer's placement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pandas as pd

from quantscan.columns import Col
from quantscan.errors import UsageError
from quantscan.records import Finding, Severity, severity_rank

PARTITION_COLUMNS = (
    "profile",
    "partition",
    Col.PLACEMENT,
    "n_nodes",
    "first_node",
    "nodes",
    "bytes_in",
    "bytes_out",
    "bytes_unknown",
    "from_partitions",
    "bytes_estimated",
)

PROFILE_TABLE_COLUMNS = (
    "profile",
    "errors",
    "warnings",
    "infos",
    "cpu_islands",
    "npu_islands",
    "cpu_nodes",
    "npu_nodes",
    "folded_nodes",
    "bytes_crossing",
    "worst",
)
"""profiles.csv: one row per profile checked, the chip-choice table of `check --profile all`."""


@dataclass
class CheckResult:
    findings: pd.DataFrame
    details: pd.DataFrame
    partitions: pd.DataFrame
    node_placement: dict[str, dict[str, str]]
    profiles: list[str]
    notes: list[str] = field(default_factory=list)
    records: list[Finding] = field(default_factory=list)
    """The typed findings behind `findings`/`details`, row for row (rewrite ids live here)."""
    fold_flags: list[str] = field(default_factory=list)
    """`rewrite` flags that fold every If a flag can fold (`--freeze-input sr=16000 --fix-dim ...`)."""

    def _rows(self, profile: str) -> pd.DataFrame:
        return self.findings[self.findings["profile"] == profile]

    def worst_severity(self, profile: str) -> str | None:
        """error, warn or info: the worst finding for `profile`; None when it has none."""
        rows = self._rows(profile)
        if rows.empty:
            return None
        return max(rows["severity"], key=severity_rank)

    def fails(self, level: str) -> bool:
        """True when any profile has a finding at `level` or worse (`--fail-on error|warn`)."""
        if level not in tuple(Severity):
            raise UsageError(f"expected --fail-on one of {', '.join(Severity)}, found '{level}'")
        return any(severity_rank(self.worst_severity(p)) >= severity_rank(level) for p in self.profiles)

    def summary(self) -> pd.DataFrame:
        """Side by side per profile (one column each): counts by severity, placement, islands, bytes."""
        return pd.DataFrame({p: self._summary(p) for p in self.profiles})

    def summary_rows(self) -> list[dict[str, object]]:
        """The same summary as one dict per profile (for summary.md/report tables)."""
        return [{"profile": p, **self._summary(p)} for p in self.profiles]

    def profile_table(self) -> pd.DataFrame:
        """One row per profile (profiles.csv), the chips that take the model most nearly as it is first:
        fewest errors, then fewest CPU islands (each one a round trip off the NPU), then fewest warnings."""
        table = pd.DataFrame(self.summary_rows(), columns=list(PROFILE_TABLE_COLUMNS))
        order = ["errors", "cpu_islands", "warnings", "profile"]
        return table.sort_values(order, kind="stable").reset_index(drop=True)

    def _summary(self, profile: str) -> dict[str, object]:
        rows = self._rows(profile)
        parts = self.partitions[self.partitions["profile"] == profile]
        placement = self.node_placement.get(profile, {})
        counts: Mapping[str, int] = rows["severity"].value_counts().to_dict()
        return {
            "worst": self.worst_severity(profile) or "none",
            "errors": int(counts.get("error", 0)),
            "warnings": int(counts.get("warn", 0)),
            "infos": int(counts.get("info", 0)),
            "npu_nodes": int(parts.loc[parts[Col.PLACEMENT] == "npu", "n_nodes"].sum()),
            "cpu_nodes": int(parts.loc[parts[Col.PLACEMENT] == "cpu", "n_nodes"].sum()),
            "folded_nodes": len(placement) - int(parts["n_nodes"].sum()),
            "islands": len(parts),
            "npu_islands": int((parts[Col.PLACEMENT] == "npu").sum()),
            "cpu_islands": int((parts[Col.PLACEMENT] == "cpu").sum()),
            "bytes_crossing": int(parts["bytes_in"].sum()),
        }
