"""The record every compatibility rule returns, and the severity scale the CLI's `--fail-on` uses.

Rules never raise on odd models: whatever they cannot judge becomes a finding (or an `info` note),
so one strange node never hides the rest of the report.
"""

from __future__ import annotations

from dataclasses import dataclass

SEVERITIES: tuple[str, ...] = ("info", "warn", "error")
"""Ordered from least to most severe; `fails("warn")` means warn or error."""

COLUMNS: tuple[str, ...] = (
    "node",
    "op_type",
    "rule",
    "attribute",
    "value",
    "limit",
    "severity",
    "placement",
    "partition",
    "fix",
    "profile",
)
"""compat.csv columns, in the contract's order."""

DETAIL_COLUMNS: tuple[str, ...] = ("reason", "source", "unverified", "forces_cpu")
"""Extra per-finding columns kept beside the contract table (same row order)."""


def severity_rank(severity: str | None) -> int:
    """Position on the info < warn < error scale; -1 for "no finding"."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else -1


@dataclass(frozen=True)
class Finding:
    """One reason a node will not run (well) on a chip, with the value, the limit and a fix.

    `forces_cpu` says the node cannot stay on the NPU because of this finding; the partitioner
    colours such nodes CPU. `unverified` marks a limit no vendor document confirmed: such findings
    are capped at `warn` so CI never fails on a guess.
    """

    node: str
    op_type: str
    rule: str
    severity: str
    reason: str
    attribute: str = ""
    value: str = ""
    limit: str = ""
    fix: str = ""
    source: str = ""
    unverified: bool = False
    forces_cpu: bool = False

    def capped(self) -> Finding:
        """This finding with severity at most `warn` when its limit is unverified."""
        if self.unverified and self.severity == "error":
            return _replace_severity(self, "warn")
        return self


def _replace_severity(finding: Finding, severity: str) -> Finding:
    from dataclasses import replace

    return replace(finding, severity=severity)
