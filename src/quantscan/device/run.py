"""`quantscan dumps`: read the dumps, run FP32 and quantscan's simulation on the same samples, compare.

The simulation is the scan's own: `scanning.prepare_timed` (load, sites, calibration on the whole
--calib set, the quantization plan) and `graph.build_qdq_model`, the cumulative QDQ model `--save-qdq`
writes. Both models run once per dumped sample with the tensors the dumps hold exposed; nothing else
is quantized or simulated here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pandas as pd

from quantscan import graph as qgraph
from quantscan import runfolder
from quantscan.calib import CalibSet
from quantscan.device.align import Alignment, align, to_reference
from quantscan.device.dumps import DumpSet, open_dumps, sample_indices
from quantscan.device.table import SitePairs, SiteRow, device_table
from quantscan.errors import UsageError
from quantscan.graph.index import GraphIndex
from quantscan.metrics import channel_axis
from quantscan.runner import Runner, Session
from quantscan.scanning.options import ProgressFactory, no_progress
from quantscan.scanning.prepare import ScanContext, prepare_timed
from quantscan.toolchains import every_rename
from quantscan.toolchains.renaming import NameMapper


@dataclass
class DeviceResult:
    """device.csv as a table, with what the alignment left out and which samples were compared."""

    table: pd.DataFrame
    format: str
    samples: list[str]
    alignment: Alignment
    sites: int
    warnings: list[str] = field(default_factory=list)

    @property
    def aligned_sites(self) -> int:
        return int((self.table["dump"] != "").sum())

    def save(self, out: str | Path) -> list[Path]:
        """device.csv, the device section of summary.md and report.html (added to a scan's in the same folder)."""
        from quantscan.report.device import device_markdown, with_section

        folder = runfolder.ensure_out_dir(Path(out))
        runfolder.write_csv(folder / "device.csv", self.table)
        summary = folder / "summary.md"
        old = runfolder.read_text(summary) or ""
        runfolder.atomic_write_text(summary, with_section(old, device_markdown(self)))
        return [folder / "device.csv", summary, self._report(folder)]

    def _report(self, folder: Path) -> Path:
        """report.html: the scan's page rebuilt with a device section in a run folder, else a page of its own."""
        from quantscan.report.html import device_page, write_report

        if (folder / runfolder.RUN_JSON).is_file() and (folder / "layers.csv").is_file():
            return write_report(folder)
        runfolder.atomic_write_text(folder / "report.html", device_page(self.table))
        return folder / "report.html"


def _site_rows(ctx: ScanContext) -> list[SiteRow]:
    """The kernels' rows of device.csv: a model input's site (sites.input_sites) is fed, not computed, and
    board dumps hold what the kernels wrote."""
    return [SiteRow(s.node, s.op_type, s.kernel, ctx.graph.order.get(s.node, -1), s.output)
            for s in ctx.graph.sites if not s.is_input]


def _samples(cset: CalibSet, indices: list[int]) -> list[dict[str, np.ndarray]]:
    """The calibration samples the dumps were made on, in the dumps' order."""
    chosen = sorted(set(indices))
    by_index = dict(zip(chosen, cset.select(chosen).samples(), strict=True))
    return [by_index[i] for i in indices]


def _stems(cset: CalibSet) -> list[str]:
    return [f.stem for f in cset.files] if len(cset.files) == cset.n_samples else []


def _aligned_rows(rows: list[SiteRow], alignment: Alignment) -> list[SiteRow]:
    out = []
    for row in rows:
        hit = alignment.aligned.get(row.tensor)
        out.append(row if hit is None else SiteRow(row.node, row.op_type, row.kernel, row.order, row.tensor,
                                                   hit.dump, hit.how, hit.layout))
    return out


@dataclass
class Simulation:
    """FP32 and quantscan's simulation of one model on one calibration set, ready for any number of dump sets."""

    ctx: ScanContext
    qdq: onnx.ModelProto
    fp32_session: Session
    mapper: NameMapper
    kernel_output: dict[str, str]
    """A tensor inside a fused kernel -> the kernel's output (`align`)."""


def simulate(
    model: str | Path, calib: str | Path, *, progress: ProgressFactory = no_progress, runner: Runner | None = None,
    **options: Any,
) -> Simulation:
    """The scan's front half (sites, calibration, plan) and its cumulative QDQ model; the FP32 session
    exposes every float tensor (the value alignment looks among them)."""
    ctx, _ = prepare_timed(model, calib, progress=progress, runner=runner, **options)
    qdq = qgraph.build_qdq_model(ctx.graph.prepared.proto, ctx.graph.sites, ctx.quant.plan)
    fp32_names = [t for t in ctx.graph.probe.tensor_order if t in ctx.graph.probe.float_tensors]
    fp32_session = ctx.runner.session(qgraph.expose(ctx.graph.prepared.proto, fp32_names), built=True)
    mapper = NameMapper(GraphIndex(ctx.loaded.proto.graph, model=ctx.loaded.proto), every_rename())
    producer = {o: n.name for n in ctx.loaded.proto.graph.node for o in n.output if o}
    inner = {t: s.output for s in ctx.graph.sites for t, node in producer.items() if node in s.nodes[:-1] and s.fused}
    return Simulation(ctx, qdq, fp32_session, mapper, inner)


def compare_dumps(
    model: str | Path,
    calib: str | Path,
    dumps: str | Path | DumpSet,
    *,
    fmt: str | None = None,
    progress: ProgressFactory = no_progress,
    runner: Runner | None = None,
    **options: Any,
) -> DeviceResult:
    """Per site: FP32 <-> simulation <-> device over the dumped samples (device.csv); writes nothing."""
    dset = dumps if isinstance(dumps, DumpSet) else open_dumps(dumps, fmt)
    return compare_with(simulate(model, calib, progress=progress, runner=runner, **options), dset)


def compare_with(simulation: Simulation, dset: DumpSet) -> DeviceResult:
    """`compare_dumps` on a prepared simulation (tests plant faults into many dump sets of one model)."""
    ctx, fp32_session = simulation.ctx, simulation.fp32_session
    indices = sample_indices(dset.keys, _stems(ctx.data.cset), ctx.data.cset.n_samples)
    samples = _samples(ctx.data.cset, indices)
    first_dump = dset.load(0)
    first_fp32 = fp32_session.run(samples[0])
    kernels = [s.output for s in ctx.graph.sites if not s.is_input]
    alignment = align(first_dump, first_fp32, simulation.mapper, prefer=kernels,
                      order=dset.order() if dset.order else (), kernel_output=simulation.kernel_output)
    rows = _aligned_rows(_site_rows(ctx), alignment)
    measured = [r for r in rows if r.dump]
    if not measured:
        some = ", ".join(list(first_dump)[:4])
        raise UsageError(f"--dumps: expected tensors that line up with the model's quantization sites, found none "
                         f"of {len(first_dump)} ({some}{', ...' if len(first_dump) > 4 else ''}) by name or value")
    sim_session = ctx.runner.session(qgraph.expose(simulation.qdq, [r.tensor for r in measured]), built=True)
    conv_like = {s.output: s.conv_like for s in ctx.graph.sites}
    pairs = {r.tensor: SitePairs(_channels(first_fp32[r.tensor].ndim, conv_like.get(r.tensor, False)))
             for r in measured}
    for i, (key, sample) in enumerate(zip(dset.keys, samples, strict=True)):
        dumped = first_dump if i == 0 else dset.load(i)
        fp32 = first_fp32 if i == 0 else fp32_session.run(sample)
        sim = sim_session.run(sample, [r.tensor for r in measured])
        for row in measured:
            if row.dump not in dumped:
                raise UsageError(f"--dumps: expected '{row.dump}' in every sample (it is in {dset.keys[0]}), "
                                 f"found it missing in {key}")
            ref = fp32[row.tensor]
            device = _device_value(dumped[row.dump], row, ref.shape, key)
            pairs[row.tensor].update(ref, sim[row.tensor].reshape(ref.shape), device, key)
    upstream = feeding_sites(ctx.graph.prepared.proto, [s.output for s in ctx.graph.sites],
                             {r.tensor for r in measured})
    return DeviceResult(device_table(rows, pairs, upstream), dset.format, list(dset.keys), alignment, len(rows),
                        list(ctx.warnings))


def feeding_sites(proto: onnx.ModelProto, sites: Sequence[str], measured: set[str]) -> dict[str, list[str]]:
    """Site output -> the measured site outputs it reads, walking back through everything else (layout
    ops, unmeasured sites, the nodes inside its own kernel)."""
    producer = {o: n for n in proto.graph.node for o in n.output if o}
    out: dict[str, list[str]] = {}
    for site in sites:
        found: list[str] = []
        seen: set[str] = set()
        stack = [i for i in producer[site].input if i] if site in producer else []
        while stack:
            tensor = stack.pop()
            if tensor in seen:
                continue
            seen.add(tensor)
            if tensor in measured and tensor != site:
                found.append(tensor)
            elif tensor in producer:
                stack.extend(i for i in producer[tensor].input if i)
        out[site] = found
    return out


def _channels(rank: int, conv_like: bool) -> int:
    """The contract's channel axis, and axis 1 for every 4-D tensor: ONNX images are NCHW whatever made them
    (a pooled or SE-scaled activation is no less per channel than a Conv output)."""
    return 1 if rank == 4 else (channel_axis(rank, conv_like) if rank else -1)


def _device_value(array: np.ndarray, row: SiteRow, shape: tuple[int, ...], key: str) -> np.ndarray:
    if array.size != int(np.prod(shape)):
        raise UsageError(f"--dumps: expected '{row.dump}' with {int(np.prod(shape))} values as in the first sample, "
                         f"found {array.size} (shape {list(array.shape)}) in {key}")
    return to_reference(array, row.layout, tuple(shape))

