"""`equalize`: cross-layer equalization (Nagel et al., "Data-Free Quantization", ICCV 2019).

Why: when one output channel of a layer has weights 30x larger than another, the int8 grid of that
layer (per tensor) or of the activation it writes (always per tensor) is sized by the large channel and
the small one gets a few codes. For a layer pair P -> f -> C where f commutes with positive per-channel
scaling (f(x/s) = f(x)/s for s > 0), dividing P's output channel i by s_i and multiplying C's input
channel i by s_i leaves the network's function unchanged in exact arithmetic:
    s_i = sqrt(r1_i / r2_i),  r1_i = max|W_P[i, :]|,  r2_i = max|W_C[:, i]|
makes both ranges sqrt(r1_i·r2_i), the equal split the paper proves optimal for the pair.

What commutes: nothing, Relu, LeakyRelu, PRelu (slope unchanged: positive-homogeneous), and on Conv
activations the channel-wise pooling ops (MaxPool, AveragePool, their Global forms), Identity and
Dropout. Sigmoid, HardSwish, Clip (ReLU6), SiLU and Add do not: refused with the reason.

Chains (Conv -> Relu -> depthwise Conv -> Conv) share layers between pairs; every pair is re-balanced in
turn until no scale moves more than `TOLERANCE` (joint equalization, the paper's iteration). A tensor
feeding several weight layers (MTCNN's three heads) is balanced against the largest of their ranges.

BatchNormalization is folded first (`fold-bn`): a BN between P and f would otherwise block the pair.
Refused: non-constant or shared weights or biases, channel counts that differ, channels on different
axes (Conv NCHW vs Gemm/MatMul last axis), a path that branches or is a graph output.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from quantscan.graph.edit import node_label
from quantscan.graph.index import GraphIndex
from quantscan.rewrites.base import Change, Refusal, RewriteResult
from quantscan.rewrites.fold_bn import fold_batchnorm
from quantscan.rewrites.linear import WEIGHT_OPS, Linear, linear_of, write_back

REWRITE_ID = "equalize"
LayerOf = Callable[[onnx.NodeProto], "Linear | str"]
HOMOGENEOUS = frozenset({"Relu", "LeakyRelu", "PRelu", "Identity", "Dropout"})
"""Ops through which positive per-channel scaling passes on any channel axis."""
CHANNELWISE_POOLS = frozenset({"MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool"})
"""Ops that commute with scaling on Conv (NCHW) activations only."""
MAX_ITERATIONS = 100
TOLERANCE = 1e-4
"""Stop when the largest |log s_i| of a sweep is below this (scales within 0.01% of 1)."""
SCALE_LIMIT = 1e2
"""Bound on a channel's total factor over all sweeps: a near-dead channel (range ~0 on one side) would
otherwise ask for 1e10 and the float32 rounding of the rescaled weights would show in the output."""
DEAD = 1e-6
"""A channel whose weight range is below this fraction of its layer's largest is left alone (s = 1)."""


class Pair:
    """A producer, the commuting ops after it, and the weight layers reading what they write."""

    def __init__(self, producer: Linear, path: list[onnx.NodeProto], consumers: list[Linear]) -> None:
        self.producer = producer
        self.path = path
        self.consumers = consumers

    def describe(self) -> str:
        via = " -> ".join(n.op_type for n in self.path)
        names = ", ".join(c.label for c in self.consumers)
        return f"{self.producer.label} -> {names}" + (f" through {via}" if via else "")


def equalize(model: onnx.ModelProto) -> RewriteResult:
    """Equalize every commuting weight-layer pair jointly; the model is BN-folded first."""
    folded = fold_batchnorm(model)
    out = folded.model
    index = GraphIndex(out.graph, ir_version=out.ir_version)
    result = RewriteResult(model=out, changes=list(folded.changes), refusals=list(folded.refusals))
    pairs = find_pairs(index, result.refusals)
    if not pairs:
        return result
    before = {id(p): _imbalance(p) for p in pairs}
    totals = {id(p): np.ones(p.producer.out_channels) for p in pairs}
    sweeps = 0
    while sweeps < MAX_ITERATIONS:
        sweeps += 1
        worst = 0.0
        for p in pairs:
            s = _step(p, totals[id(p)])
            totals[id(p)] *= s
            worst = max(worst, float(np.abs(np.log(s)).max(initial=0.0)))
        if worst < TOLERANCE:
            break
    layers = {id(layer): layer for p in pairs for layer in (p.producer, *p.consumers)}
    write_back(out, list(layers.values()))
    for p in pairs:
        s = totals[id(p)]
        result.changes.append(Change(
            REWRITE_ID, p.producer.label,
            f"equalized {p.describe()}: channel scales {s.min():.3g}..{s.max():.3g}, weight range spread "
            f"{before[id(p)]:.3g}x -> {_imbalance(p):.3g}x (channels below {DEAD:g} of the largest left out; "
            f"{sweeps} sweeps over {len(pairs)} pairs)",
        ))
    return result


def _imbalance(p: Pair) -> float:
    """max/min of the producer's per-output-channel weight ranges (what equalization narrows)."""
    r = p.producer.out_absmax().astype(np.float64)
    r = r[r > DEAD * r.max(initial=0.0)]
    return float(r.max() / r.min()) if r.size else 1.0


def _step(p: Pair, total: np.ndarray) -> np.ndarray:
    """Re-balance one pair; returns the factors s (producer channel i divided by s_i), bounded so that
    the channel's factor over all sweeps (`total` so far) stays within SCALE_LIMIT."""
    r1 = p.producer.out_absmax().astype(np.float64)
    r2 = np.max([c.in_absmax() for c in p.consumers], axis=0).astype(np.float64)
    s = np.ones_like(r1)
    ok = (r1 > DEAD * r1.max(initial=0.0)) & (r2 > DEAD * r2.max(initial=0.0))
    s[ok] = np.sqrt(r1[ok] / r2[ok])
    s = np.clip(s, 1 / (SCALE_LIMIT * total), SCALE_LIMIT / total)
    p.producer.scale_outputs(1 / s)
    for c in p.consumers:
        c.scale_inputs(s)
    return s


def equalized_tensors(index: GraphIndex) -> set[str]:
    """The activations `equalize` rescales (each pair's producer output and the outputs along its path):
    the diagnosis names the pass at sites writing one of them."""
    out: set[str] = set()
    for p in find_pairs(index, []):
        out.add(p.producer.output)
        out.update(n.output[0] for n in p.path)
    return out


def find_pairs(index: GraphIndex, refusals: list[Refusal]) -> list[Pair]:
    """Every producer -> commuting path -> consumers pair; refusals appended for the blocked ones."""
    layers: dict[str, Linear] = {}

    def layer(node: onnx.NodeProto) -> Linear | str:
        key = node_label(node)
        if key not in layers:
            got = linear_of(node, index)
            if isinstance(got, str):
                return got
            layers[key] = got
        return layers[key]

    pairs: list[Pair] = []
    for node in index.nodes:
        if node.op_type not in WEIGHT_OPS or node.domain not in ("", "ai.onnx"):
            continue
        found = _pair_from(node, index, layer)
        if isinstance(found, Pair):
            pairs.append(found)
        elif found:
            refusals.append(Refusal(REWRITE_ID, node_label(node), found))
    return pairs


def _pair_from(node: onnx.NodeProto, index: GraphIndex, layer: LayerOf) -> Pair | str | None:
    """The pair starting at weight layer `node`, a refusal reason, or None (nothing to pair with)."""
    producer = layer(node)
    tensor = producer.output if isinstance(producer, Linear) else node.output[0]
    path: list[onnx.NodeProto] = []
    while True:
        users = index.users(tensor)
        if not users or tensor in index.graph_outputs:
            return None
        if all(u.op_type in WEIGHT_OPS and u.input[0] == tensor for u in users):
            return _pair_with(node, producer, path, users, layer)
        if len(users) > 1:
            if any(u.op_type in WEIGHT_OPS for u in users):
                return f"{node_label(node)}'s output also feeds {_ops(users)}: not a single path to weight layers"
            return None
        nxt = users[0]
        blocked = _blocks(nxt, index, producer)
        if blocked:
            after = _next_weight_layer(nxt, index)
            if after is None:
                return None
            return f"{nxt.op_type} between {node_label(node)} and {node_label(after)}: {blocked}"
        path.append(nxt)
        tensor = nxt.output[0]


def _pair_with(
    node: onnx.NodeProto, producer: Linear | str, path: list[onnx.NodeProto], users: list[onnx.NodeProto],
    layer: LayerOf,
) -> Pair | str:
    if isinstance(producer, str):
        return f"{node_label(node)}: {producer}"
    consumers: list[Linear] = []
    for u in users:
        c = layer(u)
        if isinstance(c, str):
            return f"consumer {node_label(u)}: {c}"
        if c.channel_axis != producer.channel_axis:
            return f"{node_label(node)} ({producer.kind}) and {c.label} ({c.kind}) keep channels on different axes"
        if c.in_channels != producer.out_channels:
            return f"{c.label} reads {c.in_channels} channels, {node_label(node)} writes {producer.out_channels}"
        consumers.append(c)
    return Pair(producer, path, consumers)


def _blocks(node: onnx.NodeProto, index: GraphIndex, producer: Linear | str) -> str:
    """Why scaling cannot pass through `node` ('' when it can)."""
    conv = isinstance(producer, Linear) and producer.kind == "Conv"
    if node.op_type in CHANNELWISE_POOLS and conv:
        return ""
    if node.op_type not in HOMOGENEOUS:
        return "not positive-homogeneous"
    if node.op_type == "PRelu" and index.constant(node.input[1]) is None:
        return "PRelu slope is not constant"
    if len([o for o in node.output if o]) > 1:
        return "writes more than one output"
    return ""


def _next_weight_layer(node: onnx.NodeProto, index: GraphIndex) -> onnx.NodeProto | None:
    """The weight layer right after `node` (through one single-user op at most), for the refusal text."""
    for _ in range(2):
        users = index.users(node.output[0]) if node.output else []
        if len(users) != 1:
            return None
        node = users[0]
        if node.op_type in WEIGHT_OPS:
            return node
    return None


def _ops(nodes: list[onnx.NodeProto]) -> str:
    return ", ".join(node_label(n) for n in nodes)
