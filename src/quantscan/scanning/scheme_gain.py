"""Per-site sensitivity to weight bits and to activation bits, separately, under the chosen scheme.

The questions a scheme with fewer bits raises (issue 43): under w4, which layers need 8-bit weights
(RKLLM's hybrid_rate keeps a share of layers at the wider scheme), and under 8-bit activations, which
sites need 16-bit ones (W8A16 islands). For each site, the headline output cosine with ONLY that site
moved up one step, minus the scheme's own cosine:

- `scheme_weight_bits_gain`: that site's weights at int8 per output channel (symmetric), everything else
  as the scheme; computed when the scheme's weights are int4;
- `scheme_act_bits_gain`: that site's output activation at int16 (symmetric, from the same calibrated
  range), everything else as the scheme; computed when the scheme's activations are 8-bit and the scheme
  is not the default w8a8 (whose per-site question is `gain_if_float`).

Each variant is the scheme's QDQ model with one weight or one activation changed, run on the first
`gain_samples` evaluation samples (all when 0) beside the FP32 model: one session per variant, so the cost
grows with the site count (MiniLM-L6 under w4a16-g128: 36 weight variants). Positive = the wider step helps.
The figures are named `scheme_` so they never clash with the weights-only / activations-only split of
the default scheme.

Under `--state` (a decoder LM's KV cache, a streaming model's state) each variant runs the evaluation
samples as one stream in file order and carries ITS OWN state: OUT of step k is IN of step k+1, the first
step reading the set's own. That is the deployed decode, and it is where int4 K/V error builds up over
the steps; a per-step gain on the FP32 cache cannot see it (issue 43: on the char GPT the per-step
ranking's top sites recovered 38% of the w4 loss per step, 4% with the cache carried; RESULTS.md). The
FP32 reference carries its own state as well, so the base is the carried stream's cosine, not the
scan's per-step headline. The cost is the same number of runs, one step at a time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice

import numpy as np
import onnx
import pandas as pd

from quantscan import graph as qgraph
from quantscan import quant
from quantscan.calib import CalibSet
from quantscan.columns import Col
from quantscan.graph.mixed import INT16_OPSET
from quantscan.model import onnx_opset, upgrade_opset
from quantscan.records import ActivationScheme
from quantscan.runner import Runner
from quantscan.scanning.prepare import ScanContext
from quantscan.sites import Site

WEIGHT_GAIN = "scheme_weight_bits_gain"
ACT_GAIN = "scheme_act_bits_gain"


@dataclass
class SchemeGains:
    """Per site node: the output-cosine gain of its wider weights / activations (absent: not computed)."""

    weight: dict[str, float] = field(default_factory=dict)
    activation: dict[str, float] = field(default_factory=dict)
    base_cosine: float = math.nan
    samples: int = 0
    seconds: float = 0.0


def wanted(ctx: ScanContext) -> tuple[bool, bool]:
    """(weight gains, activation gains) this scan's scheme asks for; neither with `--no-gain` or for the
    default w8a8 (whose per-site question is `gain_if_float`)."""
    scheme = ctx.chip.scheme
    if ctx.opts.gain_candidates == 0 or scheme.is_default:
        return False, False
    return scheme.weight_bits < 8, scheme.activation_bits == 8


def scheme_gains(ctx: ScanContext) -> SchemeGains | None:
    """Both per-site gains as `wanted` decides; None when neither is."""
    weights, acts = wanted(ctx)
    if not (weights or acts):
        return None
    started = time.perf_counter()
    prepared = ctx.graph.prepared.proto
    if acts and onnx_opset(prepared) < INT16_OPSET:  # QuantizeLinear takes int16 from opset 21
        prepared = upgrade_opset(prepared, INT16_OPSET)
    sites, plan = ctx.graph.sites, ctx.quant.plan
    feeds = list(first_samples(ctx.data.eval_set, ctx.data.batch_size, ctx.opts.gain_samples))
    outputs = ctx.headline_outputs()
    state = dict(ctx.opts.state)

    def run(model: onnx.ModelProto) -> dict[str, np.ndarray]:
        if state:
            return run_carried(ctx.runner, model, feeds, outputs, state)
        return run_outputs(ctx.runner, model, feeds, outputs)

    reference = run(prepared)

    def cosine(variant: qgraph.QuantPlan) -> float:
        return headline_cosine(reference, run(qgraph.build_qdq_model(prepared, sites, variant)))

    base = cosine(plan)
    result = SchemeGains(base_cosine=base, samples=sum(sample_count(f) for f in feeds))
    for site in sites:
        if weights and site.weight and site.weight in plan.weights:
            wider = with_int8_weight(prepared, plan, site, ctx.chip.per_channel_weights)
            result.weight[site.node] = cosine(wider) - base
        if acts and site.output in plan.activations:
            result.activation[site.node] = cosine(_with_int16_activation(ctx, plan, site.output)) - base
    result.seconds = time.perf_counter() - started
    return result


def with_scheme_gains(layers: pd.DataFrame, gains: SchemeGains | None) -> pd.DataFrame:
    """layers.csv with the `scheme_` columns (empty where a site has no weight / no quantized output)."""
    if gains is None or layers.empty:
        return layers
    out = layers.copy()
    if gains.weight:
        out[WEIGHT_GAIN] = out[Col.NODE].map(gains.weight).astype(float)
    if gains.activation:
        out[ACT_GAIN] = out[Col.NODE].map(gains.activation).astype(float)
    return out


def with_int8_weight(prepared: onnx.ModelProto, plan: qgraph.QuantPlan, site: Site, per_channel: bool
                      ) -> qgraph.QuantPlan:
    """`plan` with the site's weight at int8 per output channel (its bias, if quantized, re-derived)."""
    assert site.weight is not None and site.weight_axis is not None
    init = next(t for t in prepared.graph.initializer if t.name == site.weight)
    w = onnx.numpy_helper.to_array(init).astype(np.float32)
    qp = quant.weight_qparams(w, site.weight_axis, 8, per_channel=per_channel)
    weights = dict(plan.weights)
    weights[site.weight] = qgraph.WeightQuant(site.weight, qp, quant.quantize(w, qp))
    biases = dict(plan.biases)
    if site.bias in biases and site.inputs and site.inputs[0] in plan.activations:
        b = onnx.numpy_helper.to_array(next(t for t in prepared.graph.initializer if t.name == site.bias))
        s_in = float(plan.activations[site.inputs[0]].scale)
        values, scale, _ = quant.quantize_bias(b.astype(np.float32), s_in, np.resize(qp.scale, b.shape))
        biases[site.bias] = qgraph.BiasQuant(site.bias, values, scale)
    return replace(plan, weights=weights, biases=biases)


def _with_int16_activation(ctx: ScanContext, plan: qgraph.QuantPlan, tensor: str) -> qgraph.QuantPlan:
    """`plan` with one activation at symmetric int16 from the range that set its 8-bit scale. A bias
    read at s_in * s_w of this tensor stays as the scheme put it: int32 codes of the 8-bit scale, a grid
    finer than any int8 kernel's accumulator needs."""
    origin = ctx.graph.origins.get(tensor, tensor)
    lo, hi = ctx.quant.calib_stats.observers[origin].range()
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 0.0
    activations = dict(plan.activations)
    activations[tensor] = quant.activation_qparams(lo, hi, ActivationScheme.INT16)
    return replace(plan, activations=activations)


def first_samples(cset: CalibSet, batch_size: int, limit: int) -> Iterator[Mapping[str, np.ndarray]]:
    """The first `limit` samples (all when 0), in batches of the scan's size."""
    if limit <= 0:
        yield from cset.batches(batch_size)
        return
    yield from islice(cset.batches(batch_size), max(1, math.ceil(limit / batch_size)))


def sample_count(feeds: Mapping[str, np.ndarray]) -> int:
    return max((int(np.shape(v)[0]) for v in feeds.values() if np.ndim(v)), default=1)


def run_outputs(
    runner: Runner, model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]], outputs: Sequence[str]
) -> dict[str, np.ndarray]:
    """The headline outputs over every batch, flattened and joined (float64)."""
    session = runner.session(model, built=True)
    got: dict[str, list[np.ndarray]] = {o: [] for o in outputs}
    for batch in feeds:
        values = session.run(dict(batch), list(outputs))
        for o in outputs:
            got[o].append(np.asarray(values[o], np.float64).ravel())
    return {o: np.concatenate(v) for o, v in got.items()}


def run_carried(
    runner: Runner,
    model: onnx.ModelProto,
    feeds: Sequence[Mapping[str, np.ndarray]],
    outputs: Sequence[str],
    state: Mapping[str, str],
) -> dict[str, np.ndarray]:
    """`run_outputs` over one stream in order, the model carrying its own state (`state` is {OUT: IN}):
    the first step reads IN from its feed, every later step the OUT this model gave on the step before."""
    session = runner.session(model, built=True)
    wanted = list(dict.fromkeys([*outputs, *state]))
    got: dict[str, list[np.ndarray]] = {o: [] for o in outputs}
    carried: dict[str, np.ndarray] = {}
    for step in feeds:
        values = session.run({**step, **carried}, wanted)
        carried = {inp: np.asarray(values[out]) for out, inp in state.items()}
        for o in outputs:
            got[o].append(np.asarray(values[o], np.float64).ravel())
    return {o: np.concatenate(v) for o, v in got.items()}


def headline_cosine(reference: Mapping[str, np.ndarray], other: Mapping[str, np.ndarray]) -> float:
    """The headline metric: pooled cosine per output, the worst output counts (CONTRACT "Metrics")."""
    worst = math.inf
    for name, x in reference.items():
        y = other[name]
        xx, yy = float(x @ x), float(y @ y)
        cos = 1.0 if xx == yy == 0 else (0.0 if xx == 0 or yy == 0 else float(x @ y) / math.sqrt(xx * yy))
        worst = min(worst, cos)
    return worst
