"""Reductions inside the analysis graph: partial sums, ranges and codes instead of whole tensors.

Why: exposing every activation (FP32, cumulative and isolated) copies gigabytes out of the runtime per
batch; summing next to the producers returns a few floats per sample and channel. Float64 accumulation
across batches happens outside (metrics.py).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscan.graph.qdq import qdq_nodes
from quantscan.quant import QParams


@dataclass
class PairSums:
    """Output names of the partial sums comparing x (reference) with y.

    Each output holds partials per sample: shape [samples, ...] (e.g. [N, C] for NCHW tensors);
    `partials_per_sample` folds them. Σxy is not computed: it follows from the others.
    """

    sxx: str
    syy: str
    sdd: str
    max_d: str
    min_d: str
    shape: str  # Shape(x): elements per sample = prod(shape[1:])

    def names(self) -> tuple[str, ...]:
        """The graph outputs to fetch for this pair."""
        return (self.sxx, self.syy, self.sdd, self.max_d, self.min_d, self.shape)

    def fold(
        self, values: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """Per-sample (Σxy, Σx², Σy², Σd², max|d|) in float64 and the elements per sample.

        The arguments of `ErrorAccumulator.update_sums`. Σxy = (Σx² + Σy² − Σd²)/2: its error is of
        the order of a float32 sum of the products, and when y ≈ x the rounding of Σx² and Σy²
        cancels in the cosine.
        """
        dims = np.asarray(values[self.shape])
        n = int(dims[0]) if dims.size >= 2 else 1
        per_sample = int(np.prod(dims[1:])) if dims.size >= 2 else int(np.prod(dims))
        sxx, syy, sdd = (_fold(values[k], n, "sum") for k in (self.sxx, self.syy, self.sdd))
        max_abs = np.maximum(np.abs(_fold(values[self.max_d], n, "max")), np.abs(_fold(values[self.min_d], n, "min")))
        with np.errstate(invalid="ignore", over="ignore"):  # overflowed sums: update_sums sorts them out
            sxy = (sxx + syy - sdd) / 2.0
        return sxy, sxx, syy, sdd, max_abs, per_sample


@dataclass
class ChannelSums:
    """Output names of per-channel Σx² and Σ(x−y)²: [C] sums, or [N, C] partials when `partial`."""

    sxx: str
    sdd: str
    partial: bool

    def names(self) -> tuple[str, str]:
        return (self.sxx, self.sdd)

    def fold(self, values: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel (Σx², Σ(x−y)²) in float64 (`ChannelErrorAccumulator.update_sums`): [N, C], one row per
        sample, from partials (the accumulator adds samples, so batching does not change its bytes); [1, C]
        for the batch when the graph pooled the samples."""
        sums = [np.asarray(values[name], dtype=np.float64) for name in self.names()]
        sums = [s.reshape(s.shape[0] if self.partial else 1, -1) for s in sums]
        return sums[0], sums[1]


def _fold(values: np.ndarray, n: int, how: str) -> np.ndarray:
    """Partials [n, ...] from the graph to one float64 value per sample."""
    flat = np.asarray(values, dtype=np.float64).reshape(n, -1)
    if how == "max":
        return flat.max(axis=1)
    if how == "min":
        return flat.min(axis=1)
    return flat.sum(axis=1)


def _scalar_graph(nodes: Sequence[onnx.NodeProto], out: str) -> onnx.GraphProto:
    """A branch of an `If` whose one output `out` is a float scalar."""
    scalar = helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, [])
    return helper.make_graph(nodes, out + "_graph", [], [scalar])


class Reducer:
    """Appends reduction nodes to a graph so onnxruntime returns sums instead of whole tensors.

    Why: exposing every activation (FP32, cumulative and isolated) copies gigabytes out of the
    runtime per batch and then spends single-threaded numpy time on them. Summing inside the graph
    runs next to the producers and returns a few floats per sample and channel; float64
    accumulation across batches happens outside (metrics.py).

    Speed: onnxruntime's ReduceL2/ReduceSumSquare take a slow generic path (~0.3 G elements/s
    measured); Mul followed by ReduceSum over the trailing axes takes its fast path (~12x faster),
    and the per-channel partials are also more accurate than one long float32 sum.
    """

    def __init__(self, opset: int) -> None:
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._flat: dict[str, str] = {}
        self._sq: dict[str, str] = {}
        self._n = 0

    def _name(self, base: str) -> str:
        self._n += 1
        return f"{base}@red{self._n}"

    def _const(self, base: str, value: np.ndarray) -> str:
        name = self._name(base)
        self.inits.append(numpy_helper.from_array(value, name))
        return name

    def _node(self, op: str, inputs: list[str], base: str, **attrs: Any) -> str:
        out = self._name(base)
        self.nodes.append(helper.make_node(op, inputs, [out], name=out + "_node", **attrs))
        return out

    def reduce(self, op: str, x: str, axes: Sequence[int] | None, base: str) -> str:
        """ReduceX with keepdims=0 over `axes` (all axes when None), spelled for the opset."""
        if axes is None:
            return self._node(op, [x], base, keepdims=0)
        axes_as_input = self.opset >= 18 or (op == "ReduceSum" and self.opset >= 13)
        if axes_as_input:
            return self._node(op, [x, self._const(base + "_axes", np.array(list(axes), np.int64))], base, keepdims=0)
        return self._node(op, [x], base, keepdims=0, axes=list(axes))

    def view(self, x: str, rank: int) -> tuple[str, list[int]]:
        """(tensor, trailing axes to reduce) so that axis 0 stays the sample axis.

        Rank ≥ 3: reduce axes 2.. (partials per sample and channel, the fast path); rank 2: axis 1;
        rank ≤ 1: the whole tensor is one sample ([1, -1]).
        """
        if rank >= 3:
            return x, list(range(2, rank))
        if rank == 2:
            return x, [1]
        if x not in self._flat:
            shape = self._const(x + "_flatshape", np.array([1, -1], np.int64))
            self._flat[x] = self._node("Reshape", [x, shape], x + "_flat")
        return self._flat[x], [1]

    def sum_sq(self, x: str, rank: int) -> str:
        if x not in self._sq:
            v, axes = self.view(x, rank)
            self._sq[x] = self.reduce("ReduceSum", self._node("Mul", [v, v], x + "_sq"), axes, x + "_sxx")
        return self._sq[x]

    def pair(self, x: str, y: str, rank: int) -> PairSums:
        """Partial Σx², Σy², Σd², max d and min d per sample (d = x − y)."""
        vx, axes = self.view(x, rank)
        vy, _ = self.view(y, rank)
        d = self._node("Sub", [vx, vy], y + "_diff")
        return PairSums(
            sxx=self.sum_sq(x, rank),
            syy=self.sum_sq(y, rank),
            sdd=self.reduce("ReduceSum", self._node("Mul", [d, d], y + "_dsq"), axes, y + "_sdd"),
            max_d=self.reduce("ReduceMax", d, axes, y + "_dmax"),
            min_d=self.reduce("ReduceMin", d, axes, y + "_dmin"),
            shape=self._node("Shape", [vx], y + "_dims"),
        )

    def channel_sums(self, x: str, y: str, rank: int, axis: int) -> ChannelSums:
        """Per-channel Σx² and Σ(x−y)² over every other axis (samples included, folded by `ChannelSums`).

        Channel axis 1 of a rank ≥ 3 tensor: [N, C] partials over the trailing axes (the fast path), and
        Σx² is the error pair's own (`sum_sq`), not computed twice. Other axes: pooled in the graph."""
        d = self._node("Sub", [x, y], y + "_cdiff")
        if axis == 1 and rank >= 3:
            sdd = self.reduce("ReduceSum", self._node("Mul", [d, d], y + "_cdsq"), list(range(2, rank)), y + "_csdd")
            return ChannelSums(self.sum_sq(x, rank), sdd, partial=True)
        if axis == 1 and rank == 2:  # [N, C]: the squares are the per-sample partials (samples add exactly)
            return ChannelSums(self._node("Mul", [x, x], x + "_csq"), self._node("Mul", [d, d], y + "_cdsq"),
                               partial=True)
        others = [a for a in range(rank) if a != axis]
        return ChannelSums(
            self.reduce("ReduceSum", self._node("Mul", [x, x], x + "_csq"), others, x + "_csxx"),
            self.reduce("ReduceSum", self._node("Mul", [d, d], y + "_cdsq"), others, y + "_csdd"),
            partial=False,
        )

    def channel_min_max(self, x: str, rank: int, axis: int) -> tuple[str, str]:
        """Min/max over every axis but `axis` (pooled over samples too)."""
        others = [a for a in range(rank) if a != axis]
        return self.reduce("ReduceMin", x, others, x + "_cmin"), self.reduce("ReduceMax", x, others, x + "_cmax")

    def partial_min_max(self, x: str, rank: int) -> tuple[str, str]:
        """Min/max over the trailing axes (the fast path): [N, C] partials for NCHW tensors.

        Folding the partials in numpy gives both the tensor's range and, for channel axis 1, the
        per-channel ranges, from one pair of reductions.
        """
        v, axes = self.view(x, rank)
        return self.reduce("ReduceMin", v, axes, x + "_pmin"), self.reduce("ReduceMax", v, axes, x + "_pmax")

    def outside(self, x: str, lo: float, hi: float, rank: int) -> tuple[str, str]:
        """(count of elements of x below `lo` or above `hi`, element count of x), per batch.

        Why in the graph: the clipping an evaluation set suffers is a count over every activation;
        a few numbers per batch leave the runtime instead of the tensor.

        Why behind an `If`: the count's chain (Less, Greater, Or, Cast, ReduceSum) costs onnxruntime as
        much as a whole error pair (boolean kernels are not vectorised), yet on the default evaluation
        set (the calibration samples, min/max ranges) nothing ever clips. Two reductions (x's min and
        max) decide whether any element can be outside; only then does the chain run. The guard asks
        "provably inside?" (max <= hi and min >= lo), so a NaN extreme runs the count rather than
        skipping it: the count is the same as without the guard, NaN elements never counted."""
        dtype = np.float32
        # a quantizer range beyond float32 (a float-min mask's scale x -128) bounds nothing: clip it
        # to float32's extremes rather than cast it to -inf with a warning
        top = float(np.finfo(dtype).max)
        lo_c = self._const(x + "_clip_lo", np.array(min(max(lo, -top), top), dtype))
        hi_c = self._const(x + "_clip_hi", np.array(min(max(hi, -top), top), dtype))
        inside = self._node("And", [
            self._at_most(self.reduce("ReduceMax", x, None, x + "_max"), hi_c, x + "_le_hi"),
            self._at_most(lo_c, self.reduce("ReduceMin", x, None, x + "_min"), x + "_ge_lo"),
        ], x + "_inside")
        count = self._name(x + "_nout")
        self.nodes.append(helper.make_node(
            "If", [inside], [count], name=count + "_node",
            then_branch=self._zero_count(x), else_branch=self._outside_count(x, lo_c, hi_c)))
        return count, self._node("Size", [x], x + "_size")

    def _at_most(self, a: str, b: str, base: str) -> str:
        """a <= b as Less or Equal (LessOrEqual needs opset 12; analysis graphs may be opset 11); false
        when either is NaN."""
        return self._node("Or", [self._node("Less", [a, b], base + "_lt"), self._node("Equal", [a, b], base + "_eq")],
                          base)

    def _zero_count(self, x: str) -> onnx.GraphProto:
        """The guard's branch when every element is inside: a count of 0."""
        out = self._name(x + "_none")
        zero = helper.make_node("Constant", [], [out], name=out + "_node",
                                value=numpy_helper.from_array(np.array(0.0, np.float32), out + "_value"))
        return _scalar_graph([zero], out)

    def _outside_count(self, x: str, lo: str, hi: str) -> onnx.GraphProto:
        """The guard's other branch: the elements below `lo` or above `hi`, counted (outer-scope names)."""
        names = [self._name(x + suffix) for suffix in ("_below", "_above", "_outside", "_outf", "_count")]
        below, above, either, as_float, out = names
        nodes = [
            helper.make_node("Less", [x, lo], [below], name=below + "_node"),
            helper.make_node("Greater", [x, hi], [above], name=above + "_node"),
            helper.make_node("Or", [below, above], [either], name=either + "_node"),
            helper.make_node("Cast", [either], [as_float], name=as_float + "_node", to=onnx.TensorProto.FLOAT),
            helper.make_node("ReduceSum", [as_float], [out], name=out + "_node", keepdims=0),
        ]
        return _scalar_graph(nodes, out)

    def quantize(self, x: str, qp: QParams, tag: str) -> tuple[str, str]:
        """(integer codes, dequantized values) of x under `qp`: QuantizeLinear then DequantizeLinear."""
        out = self._name(tag)
        nodes, inits = qdq_nodes(x, out, qp, out)
        self.nodes.extend(nodes)
        self.inits.extend(inits)
        return nodes[0].output[0], out

    def attach(self, model: onnx.ModelProto, outputs: Sequence[str], *, in_place: bool = False) -> onnx.ModelProto:
        """Add the reduction nodes and make `outputs` the model's only outputs (a new model; `in_place`:
        `model` itself, for a caller whose graph exists only to be reduced, where a copy would hold every
        weight twice while the session is built)."""
        out = model if in_place else copy.deepcopy(model)
        out.graph.node.extend(self.nodes)
        out.graph.initializer.extend(self.inits)
        del out.graph.output[:]
        out.graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(outputs))
        return out
