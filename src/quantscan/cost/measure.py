"""`cost --profile onnxruntime`: measured per-node times on this machine instead of an estimate.

The all-int8 QDQ model (onnxruntime's quantize_static recipe, calibrated on seeded random inputs: time
does not depend on the values) and the float model each run at ORT_ENABLE_ALL under onnxruntime's own
profiler (`runner.profile_nodes`), `repeats` times in fresh sessions. A node's time is the lower quartile
(`QUANTILE`) of its runs in one repetition, then the median over repetitions; repeatability compares the
repetitions node by node (goal: within 10%).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import pandas as pd

from quantscan.columns import Col
from quantscan.compat.loader import load
from quantscan.graph.index import GraphIndex

QUANTILE = 25.0
"""Which percentile of a repetition's runs stands for it. Why not the median: on a shared machine a run is
only ever slowed (preempted, its cache evicted), never sped up, so a low quantile is nearer the machine's own
time and moves less with the load. Measured at load 33-39 on 2 cores (benchmarks/cost_ort_repeat.py, RESULTS.md):
the whole run's spread between repetitions fell from 10-17% (median) to 4-8% (lower quartile); the minimum
was erratic for the total (up to 45%: one lucky run decides it)."""
INTEGER_OPS = ("QLinear", "ConvInteger", "MatMulInteger", "QuantizeLinear", "DequantizeLinear", "DynamicQuantize")
"""Op types onnxruntime runs on integers (after its QDQ fusions): such a node is an int8 kernel."""


@dataclass(frozen=True)
class NodeTime:
    node: str
    op_type: str
    typical_us: tuple[float, ...]
    """The node's QUANTILE time in each repetition."""

    @property
    def est_ms(self) -> float:
        return float(np.median(self.typical_us)) * 1e-3

    @property
    def precision(self) -> str:
        return "int8" if self.op_type.startswith(INTEGER_OPS) else "float"


@dataclass(frozen=True)
class Measured:
    """cost.json for `--profile onnxruntime`: the QDQ model's nodes as measured, the float model's total."""

    total_ms: float
    float_ms: float
    nodes: tuple[NodeTime, ...]
    total_repeats_ms: tuple[float, ...]
    runs: int
    threads: int | None

    def repeatability(self) -> dict[str, float]:
        """Node by node, how far the repetitions' times differ (relative to their mean)."""
        diffs, weights = [], []
        for n in self.nodes:
            values = np.array(n.typical_us)
            if len(values) < 2 or values.mean() <= 0:
                continue
            diffs.append(float((values.max() - values.min()) / values.mean()))
            weights.append(float(values.mean()))
        if not diffs:
            return {"median_rel_diff": 0.0, "time_weighted_rel_diff": 0.0, "within_10pct": 1.0, "total_rel_diff": 0.0}
        totals = np.array(self.total_repeats_ms)
        return {
            "median_rel_diff": float(np.median(diffs)),
            "time_weighted_rel_diff": float(np.average(diffs, weights=weights)),
            "within_10pct": float(np.mean(np.array(diffs) <= 0.10)),
            "total_rel_diff": float((totals.max() - totals.min()) / totals.mean()) if totals.mean() > 0 else 0.0,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": "onnxruntime", "total_ms": round(self.total_ms, 6), "float_ms": round(self.float_ms, 6),
            "per_site": [{Col.NODE: n.node, Col.KERNEL: n.op_type, "precision": n.precision, "device": "cpu",
                          Col.EST_MS: round(n.est_ms, 6), "bound": "measured",
                          "repeats_ms": [round(v * 1e-3, 6) for v in n.typical_us]} for n in self.nodes],
            "boundaries": [],
            "repeatability": self.repeatability(),
            "assumptions": [{"figure": "measured", "value": self.runs, "fitted": False,
                             "source": f"onnxruntime profiler on this machine, ORT_ENABLE_ALL, {self.runs} runs x "
                                       f"{len(self.total_repeats_ms)} sessions, threads {self.threads or 'default'}; "
                                       "the QDQ model from quantize_static calibrated on seeded random inputs"}],
        }

    def table(self) -> pd.DataFrame:
        rows = [{Col.NODE: n.node, Col.KERNEL: n.op_type, "precision": n.precision, "device": "cpu",
                 Col.EST_MS: n.est_ms, "bound": "measured"} for n in self.nodes]
        return pd.DataFrame(rows, columns=[Col.NODE, Col.KERNEL, "precision", "device", Col.EST_MS, "bound"])


def random_feeds(view: GraphIndex, seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs of the fixed view's shapes (normal floats; zeros for integer inputs)."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for name in view.inputs:
        info = view.info(name)
        shape = tuple(int(d) for d in (info.shape or ()) if isinstance(d, int))
        dtype = onnx.helper.tensor_dtype_to_np_dtype(info.elem_type or onnx.TensorProto.FLOAT)
        feeds[name] = (rng.standard_normal(shape).astype(dtype) if np.issubdtype(dtype, np.floating)
                       else np.zeros(shape, dtype))
    return feeds


def measure(
    model: onnx.ModelProto, quantize_static: Mapping[str, Any], input_shapes: Mapping[str, Sequence[int]] | None = None,
    *, runs: int = 20, repeats: int = 2, threads: int | None = 1, seed: int = 0,
) -> Measured:
    """`quantize_static`: onnxruntime's quantizer arguments for the QDQ model (scanning.ort_recipe's
    `quantize_static_call`, the onnxruntime profile's recipe)."""
    from quantscan.runner import profile_nodes, quantize_static_model

    feeds = random_feeds(load(model, input_shapes).fixed, seed)
    calib = [random_feeds(load(model, input_shapes).fixed, seed + 1 + i) for i in range(4)]
    qdq = quantize_static_model(_with_fixed_inputs(model, feeds), calib, quantize_static)
    q_profiles = [profile_nodes(qdq, feeds, runs=runs, threads=threads) for _ in range(repeats)]
    f_profiles = [profile_nodes(model, feeds, runs=runs, threads=threads) for _ in range(repeats)]
    nodes = tuple(
        NodeTime(name, q_profiles[0].op_types[name],
                 tuple(_typical(p.node_us.get(name, [0.0])) for p in q_profiles))
        for name in q_profiles[0].node_us
    )
    totals = tuple(_typical(p.run_us) * 1e-3 for p in q_profiles)
    float_ms = float(np.median([_typical(p.run_us) for p in f_profiles])) * 1e-3
    return Measured(float(np.median(totals)), float_ms, nodes, totals, runs, threads)


def _typical(times_us: Sequence[float]) -> float:
    return float(np.percentile(np.asarray(times_us, float), QUANTILE))


def _with_fixed_inputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """The model with its graph inputs declared at the feeds' shapes (quantize_static infers from them)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for vi in out.graph.input:
        if vi.name in feeds and vi.type.HasField("tensor_type"):
            shape = vi.type.tensor_type.shape
            for axis, value in enumerate(feeds[vi.name].shape):
                if axis < len(shape.dim):
                    shape.dim[axis].Clear()
                    shape.dim[axis].dim_value = int(value)
    return out
