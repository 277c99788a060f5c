"""`VendorRun`: one vendor toolchain run lined up with quantscan, and the files it writes.

vendor.csv (contract columns, `quantscan.toolchains.align.VENDOR_COLUMNS`), vendor.json (tool, version,
target, stage reached, log path, times, output cosines of both simulators, placement counts, the
plan applied through the vendor's mechanism) and vendor_findings.csv (compat.csv columns plus the
vendor layer and the reason: every placement that differs from `check`'s prediction).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from quantscan import runfolder
from quantscan.columns import Col
from quantscan.toolchains import align


@dataclass
class VendorRun:
    """What `quantscan vendor` measured; `table` is vendor.csv, `findings` vendor_findings.csv."""

    tool: str
    version: str
    target: str
    model: str
    python: str
    stages: list[str]
    error: dict[str, Any] | None
    log: str
    times: dict[str, float]
    samples: int
    analysis_samples: int
    qs_output_cosine: dict[str, float]
    vendor_output_cosine: dict[str, float]
    table: pd.DataFrame
    findings: pd.DataFrame
    unexplained_placements: int
    explained_placements: int
    plan: dict[str, Any] | None = None
    files: list[Path] = field(default_factory=list)

    @property
    def stage_reached(self) -> str:
        """The last stage the toolkit finished (load_onnx, build, simulator, accuracy_analysis)."""
        return self.stages[-1] if self.stages else "none"

    @property
    def headline(self) -> tuple[str, float, float]:
        """(output, quantscan cosine, vendor cosine) for the worst output by the vendor's figure."""
        common = [o for o in self.vendor_output_cosine if o in self.qs_output_cosine]
        if not common:
            return "", math.nan, math.nan
        worst = min(common, key=lambda o: self.vendor_output_cosine[o])
        return worst, self.qs_output_cosine[worst], self.vendor_output_cosine[worst]

    def loss_counts(self) -> dict[str, int]:
        if self.table.empty:
            return {}
        counts = self.table["loss"].replace("", "unmeasured").value_counts()
        return {str(k): int(v) for k, v in counts.items()}

    def to_json(self) -> dict[str, Any]:
        output, qs, vendor = self.headline
        return {
            "tool": self.tool,
            "version": self.version,
            "target": self.target,
            "model": self.model,
            "python": self.python,
            "stage_reached": self.stage_reached,
            "stages": self.stages,
            "error": self.error,
            "log": self.log,
            "times": self.times,
            "samples": self.samples,
            "analysis_samples": self.analysis_samples,
            Col.OUTPUT: output,
            "qs_output_cosine": self.qs_output_cosine,
            "vendor_output_cosine": self.vendor_output_cosine,
            "delta_output_cosine": vendor - qs if math.isfinite(vendor - qs) else None,
            "layers": int(len(self.table)),
            "loss": self.loss_counts(),
            "agreement": align.agreement(self.table),
            "placement_mismatches": {"unexplained": self.unexplained_placements,
                                     "explained": self.explained_placements},
            "plan": self.plan,
        }

    def save(self, out: Path) -> list[Path]:
        """vendor.csv, vendor_findings.csv and vendor.json into `out`, each atomically."""
        folder = runfolder.ensure_out_dir(out)
        paths = [folder / "vendor.csv", folder / "vendor_findings.csv", folder / "vendor.json"]
        runfolder.write_csv(paths[0], self.table)
        runfolder.write_csv(paths[1], self.findings)
        runfolder.write_json(paths[2], self.to_json())
        self.files = paths
        return paths
