"""Plans applied by RKNN-Toolkit2 itself: hybrid quantization step 1 once, step 2 per set of float sites.

Why this shape: step 1 calibrates (the slow part) and lists the tensors the toolkit kept; step 2 builds
from its files with `custom_quantize_layers` filled. So `HybridRknn` runs step 1 once per model and
samples, maps every requested set of sites onto step 1's names (`names.resolve`: a name it does not
know aborts step 2), and runs step 2 plus the simulator per set: `bisect --verify rknn` applies the
plan and its Pareto points this way, `bisect --evaluator rknn` every candidate of the search. Each
`apply` is one independent job in its own folder (step 1's files are only read), so the executor seam
maps it over candidates (bisect/external.BuildPool): threads here, or Ray tasks on nodes that have the
toolkit, which then read and write `work` at the same path (a shared filesystem).
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from quantscan.calib import CalibSet
from quantscan.errors import UsageError
from quantscan.model import LoadedModel
from quantscan.readers.text import read_text, read_text_lenient
from quantscan.records import Plan, PlanSite, Precision
from quantscan.toolchains.driverfiles import read_simulated, sample_sums
from quantscan.toolchains.driving import graph_names, output_cosines, run_driver
from quantscan.toolchains.judging import JudgingToolchain
from quantscan.toolchains.rknn import files as rknn_files
from quantscan.toolchains.rknn import names as rknn_names
from quantscan.toolchains.rknn.export import requantize_ops
from quantscan.toolchains.rknn.kit import PYTHON
from quantscan.toolchains.rknn.steps import DRIVER, driver_job, write_samples


@dataclass
class HybridRknn(JudgingToolchain):
    """One model and sample set in RKNN hybrid quantization (module docstring); `builds` counts step-2
    builds. Step 1 runs on the first `apply`."""

    known: list[str] = field(default_factory=list)
    step1_seconds: float = 0.0
    tool: str = "rknn"
    export: str = "rknn"

    @classmethod
    def _inputs(cls, loaded: LoadedModel, cset: CalibSet, names: list[str], target: str, work: Path,
                threads: int | None) -> tuple[dict[str, Any], list[list[str]]]:
        """One .npy per input and sample (the toolkit's dataset file lists them; the reference reads them)."""
        samples = write_samples(cset, names, work / "data")
        return driver_job(loaded, cset, names, samples, target, work, 0), samples

    @property
    def step1_dir(self) -> Path:
        return self.work / "step1"

    def step1(self) -> list[str]:
        """Run step 1 once (its cfg is reused while it exists); the tensor names it kept."""
        stem = Path(self.job["model"]).stem
        cfg = self.step1_dir / f"{stem}.quantization.cfg"
        if not (cfg.exists() and (self.step1_dir / f"{stem}.model").exists()):
            t0 = time.perf_counter()
            job = {**self.job, "work": str(self.step1_dir), "hybrid_step1": True}
            result = run_driver(self.python, job, self.step1_dir, self.work / "rknn_step1.log", driver=DRIVER,
                                keep_build=True)
            self.step1_seconds = time.perf_counter() - t0
            if result.get("error") or not cfg.exists():
                message = (result.get("error") or {}).get("message", "no cfg written")
                raise UsageError(f"rknn hybrid step 1: expected {cfg.name}, found it failed ({message}); "
                                 f"see {self.work / 'rknn_step1.log'}")
        if not self.known:
            self.known = rknn_names.step1_names(read_text(cfg, "rknn hybrid step 1's cfg"))
        return self.known

    def resolve(self, sites: Sequence[PlanSite]) -> list[rknn_names.SiteNames]:
        """The sites in step 1's names, with the tensors the target's profile says RKNN would requantize
        after a float site (`[requantize] ops`) named with them."""
        graph = self.loaded.proto.graph
        node_outputs = {n.name: [o for o in n.output if o] for n in graph.node}
        info = {n.name: (n.op_type, list(n.input), list(n.output)) for n in graph.node}
        return rknn_names.resolve(sites, graph_names(self.loaded.proto), self.step1(), node_outputs,
                                  requantize_ops(self.target), info)

    def apply(self, sites: Sequence[PlanSite], label: str) -> dict[str, Any]:
        """Step 2 with `sites` at float16/int16, then the simulator on every sample: its output cosine per
        output, what each site was mapped to, which sites vanished, and what RKNN ran each one at."""
        resolved = self.resolve(sites)
        stem = Path(self.job["model"]).stem
        folder = self.work / label
        folder.mkdir(parents=True, exist_ok=True)
        cfg_text = read_text(self.step1_dir / f"{stem}.quantization.cfg", "rknn hybrid step 1's cfg")
        cfg = folder / f"{stem}.quantization.cfg"
        cfg.write_text(fill_custom(cfg_text, rknn_names.custom_lines(resolved)), encoding="utf-8")
        step2 = {"model": str(self.step1_dir / f"{stem}.model"), "data": str(self.step1_dir / f"{stem}.data"),
                 "cfg": str(cfg)}
        job = {**self.job, "work": str(folder), "hybrid_step2": step2}
        log = folder / "rknn.log"
        t0 = time.perf_counter()
        result = run_driver(self.python, job, folder, log, driver=DRIVER)
        self.builds += 1
        simulated = read_simulated(folder / "sim_outputs.npz")
        cosines = output_cosines(self.reference, simulated, self.output_names) if simulated else {}
        log_text = read_text_lenient(log, "vendor: the toolkit's log")
        places = rknn_files.parse_layer_table(log_text)
        return {
            "float_sites": [s.node for s in sites],
            "vendor_output_cosine": cosines,
            "cosine": min(cosines.values()) if cosines else math.nan,
            "vendor_sample_sums": sample_sums(self.reference, simulated, self.output_names) if simulated else {},
            "names": {s.node: list(s.names) for s in resolved},
            "requantized": {s.node: list(s.tail) for s in resolved if s.tail},
            "vanished": [s.node for s in resolved if s.vanished],
            "dropped": self._dropped(sites),
            "warning": rknn_names.vanished_warning(resolved),
            "honoured": rknn_names.honoured(resolved, places, graph_names(self.loaded.proto)),
            "cfg": str(cfg),
            "version": result.get("version") or rknn_files.toolkit_version(log_text),
            "stages": result.get("stages", []),
            "error": result.get("error"),
            "seconds": round(time.perf_counter() - t0, 3),
        }

    def _dropped(self, sites: Sequence[PlanSite]) -> dict[str, list[str]]:
        """Site node -> its kernel's tensors step 1 did not keep (folded or renamed: CONTRACT's "any name
        it dropped"); sites that lost none are left out."""
        known = set(self.step1())
        outputs = {n.name: [o for o in n.output if o] for n in self.loaded.proto.graph.node}
        out = {}
        for site in sites:
            gone = [t for n in site.node_names for t in outputs.get(n, ()) if t not in known]
            if gone:
                out[site.node] = gone
        return out

    def names_for(self, sites: Sequence[PlanSite]) -> dict[str, list[str]]:
        """Site node -> the names step 1 kept for it and the requantized tensors after it (bisect's
        rknn_hybrid_quant.cfg export); a vanished site none (RKNN runs it and what follows int8)."""
        return {r.node: [*r.names, *r.tail] if r.names else [] for r in self.resolve(sites)}

    def prepare(self) -> None:
        """Step 1 before builds run side by side (`apply` would otherwise start it in each of them)."""
        self.step1()

    def close(self) -> None:
        """Drop what only builds need (the samples, step 1's model copies: MBs each)."""
        shutil.rmtree(self.work / "data", ignore_errors=True)
        for pattern in ("*.model", "*.data", "check*.onnx"):
            for path in self.step1_dir.glob(pattern):
                path.unlink()


def toolchain_factory(tool: str, python: str | Path | None, target: str | None, work: Path) -> Any:
    """The toolchain `bisect --verify/--evaluator TOOL` builds with (`bisect.external.ToolchainFactory`),
    made once the bisection has loaded the model and samples. Its Python is checked now, before any
    long work. (tpu-mlir's: `toolchains/tpumlir/judge.toolchain_factory`.)"""
    if tool != "rknn":
        raise UsageError(f"bisect --verify/--evaluator: expected rknn, found {tool}")
    if not target:
        raise UsageError("bisect --verify/--evaluator rknn: expected --profile CHIP (e.g. rk3588), found none")
    from quantscan.toolchains.interpreter import find_python

    vendor_python = find_python(PYTHON, python)

    def make(loaded: LoadedModel, cset: CalibSet) -> HybridRknn:
        return HybridRknn.create(loaded, cset, vendor_python, str(target), work)

    return make


def fill_custom(cfg_text: str, lines: Sequence[str]) -> str:
    """Step 1's cfg with `custom_quantize_layers` holding `lines` (it writes `custom_quantize_layers: {}`)."""
    if not lines:
        return cfg_text
    block = "custom_quantize_layers:\n" + "\n".join(lines)
    if "custom_quantize_layers: {}" in cfg_text:
        return cfg_text.replace("custom_quantize_layers: {}", block, 1)
    return cfg_text.replace("custom_quantize_layers:", block, 1)


def sites_of(plan: Plan, nodes: Sequence[str], model: onnx.ModelProto,
             site_outputs: Mapping[str, str]) -> list[PlanSite]:
    """PlanSites for a set of site nodes: the plan's own where it has them, else the kernel from the
    graph between the site node and its output (`site_outputs`: node -> output, from the bisect
    session's sites or gain.csv; `names.kernel_nodes`) at the plan's fallback precision."""
    own = {s.node: s for s in plan.sites}
    graph_nodes = [(n.name, list(n.input), list(n.output)) for n in model.graph.node]
    first_output = {n.name: next((o for o in n.output if o), "") for n in model.graph.node}
    out = []
    for node in nodes:
        if node in own:
            out.append(own[node])
            continue
        last = site_outputs.get(node) or first_output.get(node, "")
        out.append(PlanSite(node=node, output=last, precision=Precision(Precision.parse(str(plan.fallback))),
                            nodes=rknn_names.kernel_nodes(graph_nodes, node, last)))
    return out
