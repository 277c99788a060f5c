"""Fake-quant vs deployed, per site: where onnxruntime's integer kernels part from the simulation.

Why: the scan's figures come from float fake-quant (ORT_ENABLE_BASIC); the deployed check runs the
same QDQ model at ORT_ENABLE_ALL, where onnxruntime fuses DequantizeLinear -> op -> QuantizeLinear
into integer kernels (QLinearConv, QLinearMatMul, ...). When the two output figures differ (issue
10: a CRNN at cosine 0.998 fake-quant, 0.688 on integer kernels), the engineer needs to know which
kernels do it. Both sessions expose every site's integer codes (the QuantizeLinear outputs, which
the fused kernels write themselves, so exposing them does not stop a fusion), and each site's
dequantized output is compared, deployed against fake-quant, on the first few samples. A site that
*introduces* the difference has a much lower agreement than its inputs: sites are ordered by that
drop, the few largest are reported with the likely reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from quantscan import graph as qgraph
from quantscan import metrics as qm
from quantscan.calib import CalibSet
from quantscan.columns import Col
from quantscan.metrics import SQNR_CAP_DB
from quantscan.quant import QParams
from quantscan.records import DEPLOYED_GAP, Headline
from quantscan.runner import Runner
from quantscan.scanning.impact import first_samples
from quantscan.scanning.prepare import ScanContext
from quantscan.scanning.sweep import Feeds, GraphHandoff, Values, open_session, sweep
from quantscan.sites import Site

GAP_SAMPLES = 8
"""Samples the per-site comparison runs on (the first ones): it only runs when the outputs differ."""
TOP_SITES = 3
MIN_DROP_DB = 6.0
"""A site must lose at least this much agreement against its inputs to be named."""
INT32_LIMIT = 2**31 - 1


@dataclass
class GapSite:
    """One site where the integer kernels part from the simulation: agreement and the likely reason."""

    node: str
    kernel: str
    output: str
    sqnr_db: float
    """Deployed output of this site against its fake-quant output (higher is closer)."""
    cosine: float
    drop_db: float
    """How much agreement this site loses against its inputs (capped figures)."""
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {Col.NODE: self.node, Col.KERNEL: self.kernel, Col.OUTPUT: self.output,
                "sqnr_db": _json_float(self.sqnr_db), "cosine": _json_float(self.cosine),
                "drop_db": _json_float(self.drop_db), Col.REASON: self.reason}


def _json_float(value: float) -> float | str:
    return value if math.isfinite(value) else str(value)


def with_codes(qdq: onnx.ModelProto, tensors: Sequence[str]) -> onnx.ModelProto:
    """The QDQ model with the integer codes of `tensors` as extra graph outputs."""
    model = onnx.ModelProto()
    model.CopyFrom(qdq)
    present = {o for n in model.graph.node for o in n.output}
    existing = {o.name for o in model.graph.output}
    for t in tensors:
        name = qgraph.activation_codes(t)
        if name in present and name not in existing:
            model.graph.output.append(helper.make_empty_tensor_value_info(name))
    return model


def _dequantize(codes: np.ndarray, qp: QParams) -> np.ndarray:
    return (codes.astype(np.float32) - np.float32(qp.zero_point)) * np.float32(qp.scale)


def likely_reason(site: Site, plan: qgraph.QuantPlan) -> str:
    """Why onnxruntime's integer kernel may compute this site differently from the simulation."""
    bias = plan.biases.get(site.bias or "")
    if bias is not None and np.any(np.abs(bias.values.astype(np.int64)) >= INT32_LIMIT):
        return ("int32 bias saturation: the bias was clamped at the int32 limit (s_in*s_w too small for it), "
                "and the integer kernel adds the accumulator to it in int32, which wraps; the simulation adds in "
                "float. Fix: a larger input or weight scale for this site, or keep it float")
    weight = plan.weights.get(site.weight or "")
    if weight is not None and weight.qparams.axis is not None and site.op_type in ("MatMul", "Gemm"):
        return ("per-channel weights on a MatMul/Gemm: onnxruntime's integer MatMul kernels take per-tensor "
                "weight scales, so the runtime runs this kernel differently from the per-channel simulation")
    return ("requantization inside onnxruntime's fused integer kernel: the int32 accumulator is rounded once to "
            "the output scale (and a fused activation applied on integers), where the simulation rounds the "
            "float result")


def locate_gap(
    qdq: onnx.ModelProto,
    sites: Sequence[Site],
    plan: qgraph.QuantPlan,
    samples: CalibSet,
    batch_size: int,
    runner: Runner,
) -> list[GapSite]:
    """The sites that introduce the fake-quant vs deployed difference, largest drop first (at most TOP_SITES)."""
    measured = [s for s in sites if s.output in plan.activations]
    model = with_codes(qdq, [s.output for s in measured])
    outputs = {o.name for o in model.graph.output}
    measured = [s for s in measured if qgraph.activation_codes(s.output) in outputs]
    names = [qgraph.activation_codes(s.output) for s in measured]
    deployed = runner.session(model, opt_level="all", built=True)
    fake = open_session(runner, GraphHandoff(model))
    del model
    acc = {s.node: qm.ErrorAccumulator() for s in measured}

    def accumulate(feeds: Feeds, a: Values) -> None:
        b = deployed.run(feeds, names)
        for s, name in zip(measured, names, strict=True):
            qp = plan.activations[s.output]
            acc[s.node].update(_dequantize(a[name], qp), _dequantize(b[name], qp))

    sweep(fake, samples.batches(batch_size), accumulate, fetch=names)
    return _introducing(measured, acc, plan)


def _capped(value: float) -> float:
    return min(value, SQNR_CAP_DB) if not math.isnan(value) else -math.inf


def _introducing(
    sites: Sequence[Site], acc: Mapping[str, qm.ErrorAccumulator], plan: qgraph.QuantPlan
) -> list[GapSite]:
    by_output = {s.output: s.node for s in sites}
    found = []
    for s in sites:
        own = _capped(acc[s.node].sqnr_db)
        inputs = [_capped(acc[by_output[t]].sqnr_db) for t in s.inputs if t in by_output and by_output[t] != s.node]
        drop = (min(inputs) if inputs else SQNR_CAP_DB) - own
        if drop >= MIN_DROP_DB:
            found.append(GapSite(s.node, s.kernel, s.output, acc[s.node].sqnr_db, acc[s.node].cosine, drop,
                                 likely_reason(s, plan)))
    return sorted(found, key=lambda g: -g.drop_db)[:TOP_SITES]


def deployed_gap_sites(ctx: ScanContext, qdq: onnx.ModelProto, head: Headline) -> list[GapSite]:
    """The sites behind a fake-quant vs deployed output gap above DEPLOYED_GAP (none when there is none)."""
    gap = head.deployed_gap()
    if gap is None or abs(gap) <= DEPLOYED_GAP:
        return []
    return locate_gap(qdq, ctx.graph.sites, ctx.quant.plan, first_samples(ctx.data.eval_set, GAP_SAMPLES),
                      ctx.data.batch_size,
                      ctx.runner)
