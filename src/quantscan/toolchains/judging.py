"""What a toolchain that judges plans holds (`bisect --evaluator/--verify TOOL`): the base of RKNN's
`rknn/hybrid.HybridRknn` and tpu-mlir's `tpumlir/judge.MixedTpuMlir`.

Why a base: both are one model and one sample set in the vendor's toolkit, each build scored against
onnxruntime's FP32 outputs on the very samples the toolkit got. They held the same fields and wrote the same
`create` preamble (the samples as the tool reads them, the driver's job, the FP32 reference) and differ in
how the samples are written and what a build runs: a subclass writes `_inputs` and `apply`. It meets
`bisect.external.Toolchain` with the subclass's `tool`, `export`, `names_for`, `prepare` and `close`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import numpy as np

from quantscan.calib import CalibSet
from quantscan.model import LoadedModel, graph_inputs
from quantscan.records import PlanSite
from quantscan.toolchains.driving import fp32_outputs


@dataclass
class JudgingToolchain(ABC):
    """One model and sample set in a vendor toolkit that builds plans (module docstring)."""

    loaded: LoadedModel
    python: Path
    """The vendor's interpreter (`interpreter.find_python`)."""
    target: str
    work: Path
    """The folder every build writes its own subfolder into (absolute: the driver runs elsewhere)."""
    job: dict[str, Any]
    """The driver's job every build starts from (model, target, samples)."""
    reference: list[list[np.ndarray]]
    """The FP32 outputs per sample (onnxruntime), what the toolkit's simulated outputs are scored against."""
    output_names: list[str]
    builds: int = field(default=0, kw_only=True)
    """Builds run (the cost `bisect --evaluator TOOL` and plan_transfer report)."""

    @classmethod
    def create(cls, loaded: LoadedModel, cset: CalibSet, python: Path, target: str, work: Path,
               threads: int | None = None) -> Self:
        """Write the samples (quantscan's preprocessed tensors, as `vendor TOOL` feeds them), the driver's job
        and the FP32 reference outputs; what every build shares runs on the first build (`prepare`)."""
        work = work.resolve()
        names = [s.name for s in graph_inputs(loaded.proto)]
        job, feeds = cls._inputs(loaded, cset, names, target, work, threads)
        reference = fp32_outputs(loaded, feeds, names, threads)
        return cls(loaded, python, target, work, job, reference, [o.name for o in loaded.proto.graph.output])

    @classmethod
    @abstractmethod
    def _inputs(cls, loaded: LoadedModel, cset: CalibSet, names: list[str], target: str, work: Path,
                threads: int | None) -> tuple[dict[str, Any], list[list[str]]]:
        """The samples written into `work` as the toolkit reads them; returns the driver's job and, per
        sample, one .npy file per input (in `names` order) for the FP32 reference."""

    @abstractmethod
    def apply(self, sites: Sequence[PlanSite], label: str) -> dict[str, Any]:
        """One build with `sites` above int8 in `work / label`, simulated on every sample and scored."""

    def evaluate(self, sites: Sequence[PlanSite], label: str) -> dict[str, Any]:
        """`bisect.external.Toolchain`'s name for `apply`."""
        return self.apply(sites, label)
