"""Board time of a whole model on one chip profile, per kernel and per boundary, for any precision plan.

`Pricer` is built once per (model, profile): the graph is analysed, nodes coloured NPU/CPU by the
profile's rules (`compat`), kernels grouped as the chip fuses them. `price(precisions)` then costs a
plan quickly enough to price every single-site change (layers.csv's `fallback_extra_ms`):

- a site kept above int8 runs at the profile's fallback precision (int16 or fp16) on the NPU; a kernel
  the profile puts on the CPU runs in float32 there;
- pass-through kernels (Concat, Transpose, MaxPool...) run at the precision of what they read;
- a node the toolkit runs in float16 (compat's `float16` rule: rknn-toolkit2's Softmax) runs at fp16 under
  every plan, int8 or not: it is no site (as in the scan), and its converters are in the all-int8 price;
- where a tensor crosses between precisions on the NPU a converter layer runs; where it crosses between
  NPU and CPU a partition boundary costs the transfer and a synchronisation. A view (Identity, a Flatten
  after a global pool) is no layer: a crossing is seen through it, from the kernel that computed the data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import pandas as pd

from quantscan.columns import Col
from quantscan.compat.analysis import ModelAnalysis, analyse
from quantscan.compat.check import run_rules
from quantscan.compat.partitions import colour
from quantscan.compat.profiles import Profile
from quantscan.cost.kernels import Kernel, find_kernels
from quantscan.cost.roofline import KernelTime, boundary_ms, kernel_time
from quantscan.cost.table import PRECISION_BYTES, CostTable
from quantscan.graph.index import GraphIndex

INT8 = "int8"
COST_COLUMNS = (Col.NODE, Col.KERNEL, Col.OP_TYPE, "precision", "device", Col.EST_MS, "bound", "boundary_ms",
                "compute_ms", "memory_ms", "overhead_ms", "macs", "site")
"""cost.csv's columns (CONTRACT: node, kernel, precision, device, est_ms, bound)."""


@dataclass(frozen=True)
class SiteCost:
    """One kernel's estimate (cost.json `per_site`, cost.csv)."""

    node: str
    kernel: str
    op_type: str
    precision: str
    device: str
    est_ms: float
    compute_ms: float
    memory_ms: float
    overhead_ms: float
    bound: str
    site: bool
    macs: int

    def to_json(self) -> dict[str, Any]:
        return {
            Col.NODE: self.node, Col.KERNEL: self.kernel, Col.OP_TYPE: self.op_type, "precision": self.precision,
            "device": self.device, Col.EST_MS: round(self.est_ms, 6), "bound": self.bound, "site": self.site,
            "compute_ms": round(self.compute_ms, 6), "memory_ms": round(self.memory_ms, 6),
            "overhead_ms": round(self.overhead_ms, 6), "macs": self.macs,
        }


@dataclass(frozen=True)
class BoundaryCost:
    """A converter layer (precision change on the NPU) or a partition crossing (NPU <-> CPU)."""

    kind: str
    tensor: str
    from_node: str
    to_node: str
    from_precision: str
    to_precision: str
    elements: int
    est_ms: float

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "tensor": self.tensor, "from_node": self.from_node, "to_node": self.to_node,
            "from": self.from_precision, "to": self.to_precision, "elements": self.elements,
            Col.EST_MS: round(self.est_ms, 6),
        }


@dataclass(frozen=True)
class CostEstimate:
    """What `quantscan cost` writes: total, per kernel, per boundary, and the figures it rests on."""

    profile: str
    total_ms: float
    run_overhead_ms: float
    per_site: tuple[SiteCost, ...]
    boundaries: tuple[BoundaryCost, ...]
    assumptions: tuple[dict[str, object], ...]
    notes: tuple[str, ...] = ()

    @property
    def kernels_ms(self) -> float:
        return sum(s.est_ms for s in self.per_site)

    @property
    def boundaries_ms(self) -> float:
        return sum(b.est_ms for b in self.boundaries)

    def table(self) -> pd.DataFrame:
        """cost.csv: one row per kernel, with the boundaries it reads across (`boundary_ms`) beside it;
        the rows' est_ms + boundary_ms plus the run overhead add up to total_ms."""
        into: dict[str, float] = {}
        for b in self.boundaries:
            into[b.to_node] = into.get(b.to_node, 0.0) + b.est_ms
        rows = [{**s.to_json(), "boundary_ms": round(into.get(s.node, 0.0), 6)} for s in self.per_site]
        return pd.DataFrame(rows, columns=list(COST_COLUMNS))

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "total_ms": round(self.total_ms, 6),
            "kernels_ms": round(self.kernels_ms, 6),
            "boundaries_ms": round(self.boundaries_ms, 6),
            "run_overhead_ms": round(self.run_overhead_ms, 6),
            "per_site": [s.to_json() for s in self.per_site],
            "boundaries": [b.to_json() for b in self.boundaries],
            "assumptions": list(self.assumptions),
            "notes": list(self.notes),
        }


class Pricer:
    """Prices precision plans for one model on one profile (the graph work is done once, here)."""

    def __init__(self, analysis: ModelAnalysis, profile: Profile, table: CostTable) -> None:
        self.profile = profile
        self.table = table
        view = analysis.view
        findings = run_rules(analysis, profile)
        colours = colour(analysis, findings)
        self.placement = {view.names[i]: c for i, c in colours.items()}
        self.float16_nodes = frozenset(f.node for f in findings if f.rule == FLOAT16_RULE and f.node)
        self.kernels = find_kernels(analysis, frozenset(profile.fused_activations), self.placement,
                                    self.float16_nodes)
        position = {name: i for i, name in enumerate(view.names)}
        self._producer: dict[str, int] = {}
        for k_index, k in enumerate(self.kernels):
            for n in k.nodes:
                for out in view.nodes[position[n]].output if n in position else ():
                    if out:
                        self._producer[out] = k_index
        self._elements = {t: int(view.info(t).numel() or 0) for t in self._producer}
        self.input_sites = _input_sites(view)
        self.fallback = fallback_precision(profile)
        unknown = sum(1 for k in self.kernels if k.role != "free" and k.output_elems == 0)
        guessed = [f"{f.input}[{f.axis}]={f.value}" for f in analysis.loaded.fills if not f.from_user and f.axis]
        self.notes: tuple[str, ...] = tuple(
            [f"{unknown} kernels have no static output size: priced at their fixed overhead only"] * bool(unknown)
            + [f"input dims nobody gave were guessed ({', '.join(guessed)}): give --input-shape for the shape "
               "you deploy"] * bool(guessed)
        )

    @classmethod
    def of(
        cls, model: onnx.ModelProto | str | Path, profile: Profile,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
    ) -> Pricer:
        """Analyse `model` for `profile`; ProfileError when the profile has no (complete) [cost] table."""
        table = CostTable.of(profile)
        return cls(analyse(model, input_shapes), profile, table)

    @property
    def site_nodes(self) -> list[str]:
        return [*self.input_sites, *(k.node for k in self.kernels if k.site)]

    def precision_of(self, kernel: Kernel, plan: Mapping[str, str]) -> str:
        """The precision a kernel runs at under `plan` (site node -> "float"/"int16"/"fp16"/"int8")."""
        if kernel.device == "cpu":
            return "float"
        wanted = plan.get(kernel.node, INT8)
        if wanted in ("float", "fp16", "float16"):
            return self.fallback if self.fallback != "int16" else "fp16"
        return "int16" if wanted == "int16" else INT8

    def precisions(self, plan: Mapping[str, str]) -> list[str]:
        """Each kernel's precision; pass-through kernels take that of what they read."""
        out: list[str] = []
        for k in self.kernels:
            if k.device == "npu" and k.node in self.float16_nodes:
                out.append("fp16")
                continue
            if k.site or k.device == "cpu" or not k.inputs:
                out.append(self.precision_of(k, plan))
                continue
            j = self._producer.get(k.inputs[0])
            out.append(out[j] if j is not None and j < len(out) and self.kernels[j].device == k.device
                       else self.precision_of(k, plan))
        return out

    def price(self, plan: Mapping[str, str] | None = None) -> CostEstimate:
        """The estimate under `plan` (default: every NPU site int8)."""
        plan = plan or {}
        precs = self.precisions(plan)
        per_site = (*(self._input_cost(node, plan) for node in self.input_sites),
                    *(self._site_cost(k, p) for k, p in zip(self.kernels, precs, strict=True)))
        bounds = tuple(self._boundaries(precs))
        run = self.table.run_overhead_us * 1e-3
        total = run + sum(s.est_ms for s in per_site) + sum(b.est_ms for b in bounds)
        return CostEstimate(self.profile.name, total, run, per_site, bounds,
                            tuple(self.table.assumptions()), self.notes)

    def extra_ms(self, plan: Mapping[str, str]) -> float:
        """Time `plan` adds over all-int8 (conversions included)."""
        return self.price(plan).total_ms - self.price({}).total_ms

    def fallback_extra_ms(self) -> dict[str, float]:
        """Per site: what keeping that one site at the fallback precision adds over all-int8."""
        base = self.price({}).total_ms
        return {n: self.price({n: "float"}).total_ms - base for n in self.site_nodes}

    def site_neighbours(self) -> dict[str, set[str]]:
        """Kernel sites that exchange a tensor, directly or through kernels that are no site (a MaxPool, a
        Concat, a view): where one is float and the other int8, a converter runs between them. Model input
        sites are left out: their price does not depend on their neighbours (`_input_cost`)."""
        readers: dict[int, list[int]] = {}
        for i, k in enumerate(self.kernels):
            for t in k.inputs:
                j = self._producer.get(t)
                if j is not None and j != i:
                    readers.setdefault(j, []).append(i)
        found: dict[str, set[str]] = {k.node: set() for k in self.kernels if k.site}
        for start, k in enumerate(self.kernels):
            if not k.site:
                continue
            stack, seen = list(readers.get(start, [])), set()
            while stack:
                i = stack.pop()
                if i in seen:
                    continue
                seen.add(i)
                if self.kernels[i].site:
                    found[k.node].add(self.kernels[i].node)
                    found[self.kernels[i].node].add(k.node)
                else:
                    stack.extend(readers.get(i, []))
        return found

    def island_ms(self, nodes: set[str], estimate: CostEstimate | None = None) -> float:
        """Board time of a group of nodes (a compat partition): its kernels and the boundaries into it."""
        est = estimate or self.price({})
        kernels = {k.node for k in self.kernels if nodes.intersection(k.nodes)}
        return (sum(s.est_ms for s in est.per_site if s.node in kernels)
                + sum(b.est_ms for b in est.boundaries if b.to_node in kernels))

    def _site_cost(self, k: Kernel, precision: str) -> SiteCost:
        t: KernelTime = kernel_time(k, precision, k.device, self.table)
        return SiteCost(k.node, k.kernel, k.op, precision, k.device, t.est_ms, t.compute_ms, t.memory_ms,
                        t.overhead_ms, t.bound if k.role != "free" else "overhead", k.site, k.macs)

    def _input_cost(self, node: str, plan: Mapping[str, str]) -> SiteCost:
        """A model input site. At int8 the chip reads the frame inside each run's fixed cost (the fitted
        `run_overhead_us`), so 0 ms of its own; kept float, it reads it at the fallback width and a
        converter layer brings it to int8 for the kernels (the graph's converter price). Why: "feed the
        input float" is often the first thing a summary suggests, and it was the one unpriced answer."""
        n = self.input_sites[node]
        if plan.get(node, INT8) in (INT8, "uint8"):
            return SiteCost(node, INPUT_KERNEL, INPUT_KERNEL, INT8, "npu", 0.0, 0.0, 0.0, 0.0, "overhead", True, 0)
        wide = "int16" if plan[node] == "int16" else (self.fallback if self.fallback != "int16" else "fp16")
        gbps = self.table.dram_gbps
        extra_read = n * (PRECISION_BYTES[wide] - PRECISION_BYTES[INT8]) / (gbps * 1e9) * 1e3
        converter = boundary_ms(n, PRECISION_BYTES[wide], PRECISION_BYTES[INT8], self.table.converter_us, gbps)
        return SiteCost(node, INPUT_KERNEL, INPUT_KERNEL, wide, "npu", extra_read + converter, 0.0,
                        extra_read + converter - self.table.converter_us * 1e-3, self.table.converter_us * 1e-3,
                        "memory", True, 0)

    def _boundaries(self, precs: Sequence[str]) -> list[BoundaryCost]:
        seen: set[tuple[str, str, str]] = set()
        found: list[BoundaryCost] = []
        for i, k in enumerate(self.kernels):
            if k.role == "free":  # a view: its readers see through it
                continue
            for t in k.inputs:
                j = self._producer.get(t)
                if j is None:
                    continue
                j = self._computed_by(j)
                src = self.kernels[j]
                kind = _crossing(src, precs[j], k, precs[i])
                if kind is None or (t, precs[i], k.device) in seen:
                    continue
                seen.add((t, precs[i], k.device))
                n = self._elements.get(t, 0)
                fixed, gbps = ((self.table.partition_us, self.table.dram_gbps) if kind == "partition"
                               else (self.table.converter_us, self.table.dram_gbps))
                ms = boundary_ms(n, PRECISION_BYTES[precs[j]], PRECISION_BYTES[precs[i]], fixed, gbps)
                found.append(BoundaryCost(kind, t, src.node, k.node, precs[j], precs[i], n, ms))
        return found


    def _computed_by(self, j: int) -> int:
        """The kernel that computed what kernel `j` holds: `j` itself, or above a chain of views."""
        for _ in range(len(self.kernels)):
            k = self.kernels[j]
            up = self._producer.get(k.inputs[0]) if k.role == "free" and k.inputs else None
            if up is None:
                return j
            j = up
        return j


FLOAT16_RULE = "float16"
"""compat's rule naming the nodes a toolkit runs in float16 inside an int8 model (compat/rules/float16.py)."""

INPUT_KERNEL = "input"
"""The kernel and op a model input site is priced as (sites.INPUT_OP's spelling)."""


def _input_sites(view: GraphIndex) -> dict[str, int]:
    """Float32 graph inputs and their element counts, by the node name layers.csv gives a model input site
    (`sites.input_sites`: the input's name, `input:NAME` when a node has that name)."""
    floats = {vi.name for vi in view.graph.input if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    nodes = {n.name for n in view.nodes}
    return {(f"{INPUT_KERNEL}:{name}" if name in nodes else name): int(view.info(name).numel() or 0)
            for name in view.inputs if name in floats}


def _crossing(src: Kernel, src_prec: str, dst: Kernel, dst_prec: str) -> str | None:
    if src.device != dst.device:
        return "partition"
    if src.device == "npu" and src_prec != dst_prec and "free" not in (src.role, dst.role):
        return "converter"
    return None


def fallback_precision(profile: Profile) -> str:
    """The precision a site kept above int8 runs at on this chip (int16 or fp16)."""
    return "int16" if profile.fallback_precision == "int16" else "fp16"


def estimate(
    model: onnx.ModelProto | str | Path, profile: Profile, plan: Mapping[str, str] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> CostEstimate:
    """One-call form: the estimate of `model` on `profile` under `plan` (None: all int8)."""
    return Pricer.of(model, profile, input_shapes).price(plan)


def board_ms(
    model: onnx.ModelProto | str | Path, profile: Profile, input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> float | None:
    """The all-int8 estimate of `model` on `profile`, None when the profile has no [cost] table (a
    rewrite's before/after: a decomposition that runs more kernels shows here)."""
    if not profile.cost:
        return None
    return Pricer.of(model, profile, input_shapes).price({}).total_ms


def static_input_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """The graph inputs whose every dim is a number (a rewritten model after --fix-dim): the shapes its
    original is priced at too, so before and after compare the same inference."""
    inits = {t.name for t in model.graph.initializer}
    out: dict[str, list[int]] = {}
    for vi in model.graph.input:
        dims = vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else []
        if vi.name not in inits and dims and all(d.HasField("dim_value") for d in dims):
            out[vi.name] = [int(d.dim_value) for d in dims]
    return out
