"""`smooth`: SmoothQuant-style activation smoothing (Xiao et al., 2023), exact in FP32.

Why: a per-tensor int8 activation is sized by its largest channel; when a few channels are 30x
larger than the rest (LayerNorm outputs of transformers, some Conv outputs), the others get a few
codes. Dividing channel j by s_j where the tensor is produced and multiplying the consumer's input
channel j by s_j moves the outlier into the weights, which are quantized per output channel:
    s_j = max|X_j|^α / max|W_j|^(1−α)      (α in [0, 1]: how much of the range moves)
The function is unchanged in exact arithmetic. Unlike `equalize`, the factors come from the measured
activation ranges (calibration data, `calibstats.channel_stats`).

Where: a tensor X every reader of which is a weight layer (Conv/Gemm/MatMul reading X as data), and
whose producer is a per-channel affine the division can fold into:
- LayerNormalization (scale and bias divided), BatchNormalization (scale and bias divided),
- a decomposed LayerNorm's tail `Mul(·, γ)` [+ `Add(·, β)`] with constant per-channel γ, β,
- a Conv/Gemm/MatMul (+ its bias Add) whose output channels are divided.

α per site: given, or chosen from `ALPHAS` by the smallest int8 noise the layer would see, estimated
from the measured statistics: a uniform quantizer's noise Δ²/12 on the activation (per-tensor uint8
step over the smoothed ranges, propagated through the consumer's weights) plus on the weights (per
output channel int8 step, propagated through E[X²]). A site where no α lowers that estimate is left
alone (refused with the figure).

Refused: a reader that is not a weight layer, channels on different axes, shared or non-constant
affine parameters, no statistics.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from quantscan.graph.edit import attr_int, node_label
from quantscan.graph.index import GraphIndex
from quantscan.rewrites.base import Change, Refusal, RewriteResult
from quantscan.rewrites.calibstats import ChannelStats
from quantscan.rewrites.fold_bn import fold_batchnorm
from quantscan.rewrites.linear import WEIGHT_OPS, Linear, linear_of, store, write_back

REWRITE_ID = "smooth"
ALPHAS: tuple[float, ...] = (0.25, 0.35, 0.5, 0.65, 0.75, 0.85)
FACTOR_LIMIT = 1e4


@dataclass
class Site:
    """A smoothable tensor: its producer's per-channel parameters and its weight-layer readers."""

    tensor: str
    axis: str
    label: str
    params: list[tuple[str, np.ndarray]]
    """(constant name, float64 value) the division applies to (affine producers)."""
    producer: Linear | None
    consumers: list[Linear]

    def divide(self, s: np.ndarray) -> None:
        """X_j / s_j at the producer, W[:, j] · s_j in every reader."""
        if self.producer is not None:
            self.producer.scale_outputs(1 / s)
        else:
            self.params = [(n, v / s.reshape(v.shape)) for n, v in self.params]
        for c in self.consumers:
            c.scale_inputs(s)


def smooth_sites(model: onnx.ModelProto) -> dict[str, str]:
    """The tensors a smoothing needs statistics for (name -> channel axis kind), BN folded first."""
    folded = fold_batchnorm(model).model
    index = GraphIndex(folded.graph, ir_version=folded.ir_version)
    return {s.tensor: s.axis for s in _sites(index, [])}


def smoothable_tensors(index: GraphIndex) -> set[str]:
    """The activations `smooth` can rescale in this graph (the diagnosis names the pass there)."""
    return {s.tensor for s in _sites(index, [])}


def smooth(
    model: onnx.ModelProto, stats: Mapping[str, ChannelStats], alpha: float | None = None
) -> RewriteResult:
    """Smooth every site with statistics; `alpha` None chooses it per site by the noise estimate."""
    folded = fold_batchnorm(model)
    out = folded.model
    result = RewriteResult(model=out, changes=list(folded.changes), refusals=list(folded.refusals))
    index = GraphIndex(out.graph, ir_version=out.ir_version)
    for site in _sites(index, result.refusals):
        st = stats.get(site.tensor)
        if st is None or st.absmax.size != site.consumers[0].in_channels:
            result.refusals.append(Refusal(REWRITE_ID, site.label, f"no statistics for {site.tensor!r}"))
            continue
        base = noise_estimate(st, site.consumers, np.ones_like(st.absmax))
        candidates = [alpha] if alpha is not None else list(ALPHAS)
        scored = [(noise_estimate(st, site.consumers, factors(st, site.consumers, a)), a) for a in candidates]
        best, a = min(scored)
        if alpha is None and best >= base:
            result.refusals.append(Refusal(REWRITE_ID, site.label, f"no alpha in {list(ALPHAS)} lowers the "
                                           f"estimated int8 noise ({base:.3g}) at {site.tensor!r}"))
            continue
        s = factors(st, site.consumers, a)
        spread = _spread(st.absmax)
        site.divide(s)
        _write(out, site)
        result.changes.append(Change(
            REWRITE_ID, site.label,
            f"smoothed {site.tensor!r} into {', '.join(c.label for c in site.consumers)} with alpha {a:g}"
            f"{'' if alpha is not None else ' (chosen)'}: channel range spread {spread:.3g}x -> "
            f"{_spread(st.absmax / s):.3g}x, estimated int8 noise {base:.3g} -> {best:.3g}",
        ))
    return result


def _spread(r: np.ndarray) -> float:
    r = r[r > 1e-6 * r.max(initial=0.0)]
    return float(r.max() / r.min()) if r.size else 1.0


def _write(model: onnx.ModelProto, site: Site) -> None:
    layers = list(site.consumers) + ([site.producer] if site.producer is not None else [])
    write_back(model, layers)
    dtypes = {t.name: t.data_type for t in model.graph.initializer}
    for name, value in site.params:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(dtypes[name]) if name in dtypes else np.float32
        store(model, name, value.astype(dtype))


def factors(st: ChannelStats, consumers: Sequence[Linear], alpha: float) -> np.ndarray:
    """s_j = max|X_j|^α / max|W_j|^(1−α), 1 where either range is 0, bounded by FACTOR_LIMIT."""
    x = st.absmax
    w = np.max([c.in_absmax() for c in consumers], axis=0)
    s = np.ones_like(x)
    ok = (x > 0) & (w > 0)
    s[ok] = x[ok] ** alpha / w[ok] ** (1 - alpha)
    return np.clip(s, 1 / FACTOR_LIMIT, FACTOR_LIMIT)


def noise_estimate(st: ChannelStats, consumers: Sequence[Linear], s: np.ndarray) -> float:
    """Output noise power of the readers with X/s quantized uint8 per tensor and W·s int8 per channel.

    Activation: step Δx over the smoothed range, noise Δx²/12 per element, times Σ W'² of the readers.
    Weights: step Δw_o = max|W'_o|/127 per output channel, noise Δw_o²/12 times Σ_j E[X'_j²] over the
    inputs channel o reads (its group) and kernel positions.
    """
    lo = min(float((st.min / s).min()), 0.0)
    hi = max(float((st.max / s).max()), 0.0)
    dx = (hi - lo) / 255
    meansq = st.meansq / s**2
    total = 0.0
    for c in consumers:
        w = c.weight.copy()
        probe = Linear(c.node, c.kind, c.weight_name, w, c.dtype, None, None, c.output, c.group, c.trans_b)
        probe.scale_inputs(s)
        total += dx * dx / 12 * float(np.square(probe.weight).sum())
        dw = probe.out_absmax() / 127
        total += float((dw * dw / 12 * _input_power(probe, meansq)).sum())
    return total


def _input_power(layer: Linear, meansq: np.ndarray) -> np.ndarray:
    """Σ over the inputs output channel o reads of E[X_j²], times the kernel size (Conv)."""
    if layer.kind != "Conv":
        return np.full(layer.out_channels, float(meansq.sum()))
    g = layer.group
    kernel = int(np.prod(layer.weight.shape[2:]))
    per_group = meansq.reshape(g, -1).sum(axis=1) * kernel
    return np.repeat(per_group, layer.out_channels // g)


def _sites(index: GraphIndex, refusals: list[Refusal]) -> list[Site]:
    """Every tensor read only by weight layers whose producer folds a per-channel division."""
    sites: list[Site] = []
    layers: dict[str, Linear] = {}
    for node in index.nodes:
        for tensor in node.output[:1]:
            users = index.users(tensor)
            if not users or tensor in index.graph_outputs:
                continue
            if not all(u.op_type in WEIGHT_OPS and u.input[0] == tensor for u in users):
                continue
            got = _site(node, tensor, users, index, layers)
            if isinstance(got, Site):
                sites.append(got)
            elif got:
                refusals.append(Refusal(REWRITE_ID, node_label(node), got))
    return sites


def _site(
    node: onnx.NodeProto, tensor: str, users: list[onnx.NodeProto], index: GraphIndex, layers: dict[str, Linear]
) -> Site | str | None:
    consumers: list[Linear] = []
    for u in users:
        key = node_label(u)
        c = layers.get(key) or linear_of(u, index)
        if isinstance(c, str):
            return f"reader {key}: {c}"
        layers[key] = c
        consumers.append(c)
    axis, channels = consumers[0].channel_axis, consumers[0].in_channels
    if any(c.channel_axis != axis or c.in_channels != channels for c in consumers):
        return f"readers of {tensor!r} disagree on the channel axis or count"
    found = _producer(node, tensor, index, layers, axis, channels)
    if found is None or isinstance(found, str):
        return found
    producer, params = found
    return Site(tensor, axis, node_label(node), params, producer, consumers)


def _producer(
    node: onnx.NodeProto, tensor: str, index: GraphIndex, layers: dict[str, Linear], axis: str, channels: int
) -> tuple[Linear | None, list[tuple[str, np.ndarray]]] | str | None:
    """What the division folds into: a weight layer, or the named per-channel constants of an affine."""
    weight_node = node
    if node.op_type == "Add":  # MatMul + bias Add
        weight_node = index.producer_node(node.input[0]) or node
    if weight_node.op_type in WEIGHT_OPS:
        key = node_label(weight_node)
        layer = layers.get(key) or linear_of(weight_node, index)
        if isinstance(layer, Linear) and layer.output == tensor:
            layers[key] = layer
            if layer.channel_axis != axis or layer.out_channels != channels:
                return f"{key} and the readers of {tensor!r} keep channels on different axes"
            return layer, []
    if node.op_type == "LayerNormalization":
        if attr_int(node, "axis", -1) != -1 or axis != "last":
            return "LayerNormalization normalizes over more than the channel axis"
        return _params(index, [n for n in node.input[1:3] if n], channels, axis)
    if node.op_type == "BatchNormalization":
        return _params(index, list(node.input[1:3]), channels, axis)
    if node.op_type == "Add":
        beta = _constant_operand(node, index)
        mul = index.producer_node(node.input[1] if beta == node.input[0] else node.input[0])
        if beta is None or mul is None or mul.op_type != "Mul" or index.use_count(mul.output[0]) != 1:
            return None
        gamma = _constant_operand(mul, index)
        return None if gamma is None else _params(index, [gamma, beta], channels, axis)
    if node.op_type == "Mul":
        gamma = _constant_operand(node, index)
        return None if gamma is None else _params(index, [gamma], channels, axis)
    return None


def _constant_operand(node: onnx.NodeProto, index: GraphIndex) -> str | None:
    """The one constant input of a binary op whose other input is computed, else None."""
    if len(node.input) != 2:
        return None
    const = [index.constant(n) is not None for n in node.input]
    if const == [False, True]:
        return node.input[1]
    if const == [True, False]:
        return node.input[0]
    return None


def _params(
    index: GraphIndex, names: list[str], channels: int, axis: str
) -> tuple[None, list[tuple[str, np.ndarray]]] | str | None:
    """The named per-channel constants (not shared, one value per channel on `axis`), or why not."""
    out: list[tuple[str, np.ndarray]] = []
    for name in names:
        value = index.constant(name)
        if value is None:
            return None
        if index.use_count(name) > 1:
            return f"per-channel parameter {name!r} is shared with another node"
        per_channel = value.size == channels and (
            value.shape[-1] == channels if axis == "last" else value.shape[0] == channels or
            (value.ndim >= 3 and value.shape[-3] == channels))
        if not per_channel or not np.issubdtype(value.dtype, np.floating):
            return None
        out.append((name, value.astype(np.float64)))
    return None, out
