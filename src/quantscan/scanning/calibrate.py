"""Pass 1 of the scan: calibrated ranges, then the quantization plan (scales, zero points, int8 weights).

The prepared FP32 model runs once over the calibration set with in-graph min/max partials (or whole
tensors for the histogram calibrators) of the tensors whose ranges set the scales; `make_plan`
turns those ranges into a `QuantPlan`: per-tensor activation qparams, per-channel symmetric int8
weights and int32 biases at s_in*s_w.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from quantscan import graph as qgraph
from quantscan import metrics as qm
from quantscan import quant
from quantscan.calib import CalibSet
from quantscan.errors import ModelError
from quantscan.graph.schedule import interleave
from quantscan.model import PreparedModel
from quantscan.records import ActivationScheme, CalibMethod
from quantscan.runner import Runner
from quantscan.scanning.calib_advice import SampleRanges, per_sample_extremes
from quantscan.scanning.options import ProgressFactory, n_batches
from quantscan.scanning.sweep import Feeds, GraphHandoff, Values, open_session, sweep
from quantscan.schemes import Scheme
from quantscan.sites import Site


@dataclass
class CalibStats:
    """What calibration saw: one range observer per scale-setting tensor, per-channel ranges per site."""

    observers: dict[str, quant.Observer]
    channel_ranges: dict[str, quant.ChannelRangeObserver]
    warnings: list[str]
    sample_ranges: SampleRanges | None = None
    """Per sample, each scale-setting tensor's (min, max) (calib_advice); minmax calibration only."""


def channel_axis_for(site: Site, shape: tuple[int, ...]) -> int | None:
    """The activation channel axis of a site's output (None for vectors and scalars)."""
    if len(shape) < 2:
        return None
    return qm.channel_axis(len(shape), site.conv_like)


def calibrate(
    prepared: PreparedModel,
    sites: Sequence[Site],
    origins: Mapping[str, str],
    cset: CalibSet,
    batch_size: int,
    runner: Runner,
    method: CalibMethod,
    scheme: ActivationScheme,
    progress: ProgressFactory,
    shapes: Mapping[str, tuple[int, ...]],
    input_shapes: Mapping[str, tuple[int, ...]],
    per_sample: bool = True,
) -> CalibStats:
    """Stream the calibration set once; ranges come from reductions inside the graph for minmax.

    Every tensor that needs a range or per-channel ranges is reduced over its trailing axes
    (onnxruntime's fast path) to [samples, channels] partial min/max; numpy folds them into the
    tensor's range and, for channel axis 1, the per-channel ranges. Histogram methods (percentile,
    entropy, mse) need the values themselves, so those tensors are exposed whole. For minmax, the same
    partials also give each sample's (min, max) per tensor (`per_sample`, numpy only: no extra output).
    """
    symmetric = scheme in (ActivationScheme.INT8, ActivationScheme.INT16)
    targets = sorted(set(origins.values()))
    observers = {t: quant.make_observer(method, symmetric=symmetric) for t in targets}
    reducer = qgraph.Reducer(prepared.opset_to)
    partials: dict[str, tuple[str, str]] = {}
    whole: list[str] = []
    channel_axis_of: dict[str, int] = {}
    explicit: dict[str, tuple[str, str]] = {}
    for site in sites:
        shape = shapes.get(site.output, ())
        axis = channel_axis_for(site, shape)
        if axis is not None:
            channel_axis_of[site.output] = axis
    for t in sorted(set(targets) | set(channel_axis_of)):
        rank = len(shapes.get(t, input_shapes.get(t, ())))
        if t in channel_axis_of and not (channel_axis_of[t] == 1 and rank >= 3):
            explicit[t] = reducer.channel_min_max(t, rank, channel_axis_of[t])
        if (t in targets and method == CalibMethod.MINMAX) or (t in channel_axis_of and t not in explicit):
            partials[t] = reducer.partial_min_max(t, rank)
        if t in targets and method != CalibMethod.MINMAX and t not in input_shapes:
            whole.append(t)
    channel_ranges = {t: quant.ChannelRangeObserver(1) for t in channel_axis_of}  # fed [mins; maxs] rows
    outputs = [*whole, *(n for pair in [*partials.values(), *explicit.values()] for n in pair)]
    fp32_nodes = [n.name for n in prepared.proto.graph.node]
    graph = GraphHandoff(interleave(reducer.attach(prepared.proto, outputs), fp32_nodes))
    ranges = _Ranges(observers, channel_ranges, method, partials, explicit)
    if per_sample and method == CalibMethod.MINMAX:
        ranges.keep_samples(cset.n_samples, batch_size)
    sweep(open_session(runner, graph, ordered=True), cset.batches(batch_size), ranges.update,
          progress=progress, label="calibrating", total=n_batches(cset.n_samples, batch_size))
    return CalibStats(observers, channel_ranges, calibration_warnings(observers), ranges.sample_ranges())


class _Ranges:
    """Pass 1's accumulator: folds each batch's in-graph partial min/max (or whole tensors, for the
    histogram methods) into the tensors' observers and per-channel ranges."""

    def __init__(
        self,
        observers: Mapping[str, quant.Observer],
        channel_ranges: Mapping[str, quant.ChannelRangeObserver],
        method: CalibMethod,
        partials: Mapping[str, tuple[str, str]],
        explicit: Mapping[str, tuple[str, str]],
    ) -> None:
        self.observers, self.channel_ranges, self.method = observers, channel_ranges, method
        self.partials, self.explicit = partials, explicit
        self._left = 0
        self._batch = 0
        self._rows: list[tuple[np.ndarray, np.ndarray]] = []

    def keep_samples(self, n_samples: int, batch_size: int) -> None:
        """Also keep each sample's (min, max) per tensor: batches hold `batch_size` samples, the last
        one the rest of `n_samples` (CalibSet.batches)."""
        self._left, self._batch = n_samples, batch_size

    def sample_ranges(self) -> SampleRanges | None:
        if not self._batch:
            return None
        names = list(self.observers)
        if not self._rows:
            return SampleRanges(names, np.empty((0, len(names)), np.float32), np.empty((0, len(names)), np.float32))
        return SampleRanges(names, np.concatenate([r[0] for r in self._rows]),
                            np.concatenate([r[1] for r in self._rows]))

    def update(self, feeds: Feeds, values: Values) -> None:
        count = min(self._batch, self._left)
        self._left -= count
        sample_lo, sample_hi = [], []
        for t, obs in self.observers.items():
            if self.method == CalibMethod.MINMAX:
                lo, hi = values[self.partials[t][0]], values[self.partials[t][1]]
                obs.update(np.array([np.min(lo), np.max(hi)], dtype=np.float32))
                if count:
                    per_lo, per_hi = per_sample_extremes(lo, hi, count)
                    sample_lo.append(per_lo)
                    sample_hi.append(per_hi)
            else:
                obs.update(values[t] if t in values else feeds[t])
        for t, ch in self.channel_ranges.items():
            if t in self.explicit:
                lo, hi = values[self.explicit[t][0]], values[self.explicit[t][1]]
            else:  # partials [N, C]: fold the samples away
                lo, hi = values[self.partials[t][0]].min(axis=0), values[self.partials[t][1]].max(axis=0)
            ch.update(np.stack([np.ravel(lo), np.ravel(hi)]))
        if sample_lo:
            self._rows.append((np.stack(sample_lo, axis=1), np.stack(sample_hi, axis=1)))


def calibration_warnings(observers: Mapping[str, quant.Observer]) -> list[str]:
    """One warning per tensor whose calibration saw NaN/Inf (left out of its range)."""
    return [f"tensor '{name}': NaN/Inf seen in activations during calibration (left out of its range)"
            for name, obs in observers.items() if obs.nonfinite]


def merge_calib_stats(shards: Sequence[CalibStats]) -> CalibStats:
    """Min/max calibration of disjoint sample shards (`--workers`, in shard order) as one: ranges are
    minima and maxima, so the merge is exact; per-sample ranges stack in shard order. Histogram
    observers do not merge (their bins adapt to the data seen)."""
    merged = shards[0]
    for other in shards[1:]:
        for name, obs in merged.observers.items():
            if not isinstance(obs, quant.MinMaxObserver):
                raise TypeError(f"only min/max ranges merge exactly, found {type(obs).__name__}")
            obs.merge(other.observers[name])  # type: ignore[arg-type]
        for name, ch in merged.channel_ranges.items():
            ch.merge(other.channel_ranges[name])
    per_sample = [s.sample_ranges for s in shards]
    samples = SampleRanges.concat([s for s in per_sample if s is not None]) if all(per_sample) else None
    return CalibStats(merged.observers, merged.channel_ranges, calibration_warnings(merged.observers), samples)


def make_plan(
    model: onnx.ModelProto,
    sites: Sequence[Site],
    origins: Mapping[str, str],
    observers: Mapping[str, quant.Observer],
    scheme: ActivationScheme,
    per_channel_weights: bool = True,
    weight_scheme: Scheme | None = None,
    grid_points: Mapping[str, float] | None = None,
    floors: Mapping[str, float] | None = None,
) -> tuple[qgraph.QuantPlan, list[str]]:
    """Ranges -> QuantPlan; warnings for zero ranges and clamped biases. `per_channel_weights=False`:
    one weight scale per tensor (the chip's profile says it has no per-channel scales). `weight_scheme`
    (quantscan.schemes): int4 and group-wise weights; float activations leave every activation float.

    Biases stay float when activations are float (a weight-only kernel adds its bias in fp16) and when
    weights are grouped (no single s_in*s_w per output channel to put an int32 bias on: group-wise
    kernels dequantize weights and accumulate in float). `grid_points`: origin tensor -> a value its grid
    must reach beyond what calibration saw (a profile's `[output_grid]`: prepare.output_grid_points).
    `floors`: tensor -> the lowest value its grid holds (a HardSwish input inside a kernel: -3, below
    which the HardSwish is 0; RKNN's cfg clips such a range there)."""
    ws = weight_scheme or Scheme()
    plan = qgraph.QuantPlan()
    warnings: list[str] = []
    points = grid_points or {}
    for tensor, origin in origins.items():
        if scheme == ActivationScheme.FLOAT:
            break
        rmin, rmax = observers[origin].range()
        if not (math.isfinite(rmin) and math.isfinite(rmax)):
            rmin, rmax = 0.0, 0.0
        if origin in points:
            rmin, rmax = min(rmin, points[origin]), max(rmax, points[origin])
        if floors and tensor in floors:
            rmin = max(rmin, floors[tensor])
        if rmin == rmax == 0.0:
            warnings.append(f"tensor '{tensor}' is zero on every calibration sample (zero range): scale 1 used")
        plan.activations[tensor] = quant.activation_qparams(rmin, rmax, scheme)
    inits = {t.name: t for t in model.graph.initializer}
    for site in sites:
        for name, axis in [(site.weight, site.weight_axis), *site.extra_weights]:
            if not name or axis is None or name in plan.weights:
                continue
            w = onnx.numpy_helper.to_array(inits[name]).astype(np.float32)
            if w.ndim <= axis:
                continue
            if not np.all(np.isfinite(w)):  # e.g. a BatchNormalization with a NaN epsilon folded into it
                raise ModelError(f"expected finite weights, found NaN/Inf in weight {name!r} of node "
                                 f"{site.node!r} after preparation (check the BatchNormalization folded into it)")
            qp = quant.weight_qparams(w, axis, ws.weight_bits, per_channel=per_channel_weights,
                                      group_size=ws.group_size, symmetric=not ws.weight_zero_point)
            plan.weights[name] = qgraph.WeightQuant(name, qp, quant.quantize(w, qp))
        if ws.group_size is None and site.bias and site.weight in plan.weights and site.inputs \
                and site.inputs[0] in plan.activations:
            b = onnx.numpy_helper.to_array(inits[site.bias]).astype(np.float32)
            w_scale = plan.weights[site.weight].qparams.scale
            if w_scale.size != b.size:  # grouped ConvTranspose: per-group channel scales repeat
                w_scale = np.resize(w_scale, b.shape)
            s_in = float(plan.activations[site.inputs[0]].scale)
            values, scale, overflowed = quant.quantize_bias(b, s_in, w_scale)
            if overflowed:
                warnings.append(f"site '{site.node}': bias overflows int32 at scale s_in*s_w and was clamped")
            plan.biases[site.bias] = qgraph.BiasQuant(site.bias, values, scale)
    return plan, warnings
