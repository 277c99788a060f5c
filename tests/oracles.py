"""The weight-scheme oracle, written out in numpy: independent of quantscan's quantizer (quant.py).

Why one module: tests/scanning/test_schemes.py, tests/bisect/test_bisect_scheme.py and benchmarks/schemes.py
(which puts tests/ on its path) each held a copy of these formulas, and two copies of an oracle can drift
apart without either test failing. The grids: symmetric int4 in groups puts the largest-magnitude value on
-8, as onnxruntime's MatMulNBits does (benchmarks/schemes.py checks it against that quantizer); int8 is
symmetric per output channel. `bn_folded` is the FP32 graph quantscan measures (its BatchNormalization
rewrite, not its quantizer), so the oracle's weights are the same tensors.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from quantscan.model import constants_to_initializers
from quantscan.rewrites.fold_bn import fold_batchnorm


def int4_symmetric_groups(w: np.ndarray, in_axis: int, group: int) -> np.ndarray:
    """Group-wise symmetric int4, one group at a time: scale = (value of largest |.|) / -8, codes
    round-half-even(x / scale) clipped to [-8, 7]."""
    moved = np.moveaxis(w.astype(np.float32), in_axis, 0)
    out = np.empty_like(moved)
    for start in range(0, moved.shape[0], group):
        block = moved[start:start + group]
        flat = block.reshape(block.shape[0], -1)
        extreme = flat[np.abs(flat).argmax(axis=0), np.arange(flat.shape[1])]
        scale = (extreme.astype(np.float64) / -8.0).astype(np.float32)
        scale[scale == 0] = 1.0
        codes = np.clip(np.rint(flat / scale), -8, 7)
        out[start:start + group] = (codes * scale).astype(np.float32).reshape(block.shape)
    return np.moveaxis(out, 0, in_axis)


def int8_per_channel(w: np.ndarray, out_axis: int) -> np.ndarray:
    """Symmetric int8 per output channel: scale = absmax / 127."""
    moved = np.moveaxis(w.astype(np.float32), out_axis, 0)
    out = np.empty_like(moved)
    for c in range(moved.shape[0]):
        scale = np.float32(np.abs(moved[c]).max() / 127.0) or np.float32(1.0)
        out[c] = np.clip(np.rint(moved[c] / scale), -128, 127) * scale
    return np.moveaxis(out, 0, out_axis)


def weight_axes(node: onnx.NodeProto) -> tuple[int, int]:
    """(output axis, input axis) of a node's weight (input 1)."""
    if node.op_type == "Conv":
        return 0, 1
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return (0, 1) if trans_b else (1, 0)
    return 1, 0  # MatMul [K, N]


def oracle_model(model: onnx.ModelProto, weights: str, group: int | None) -> onnx.ModelProto:
    """`model` with the weight of every Conv/Gemm/MatMul replaced by its written-out fake-quant value."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    done: set[str] = set()
    for node in out.graph.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul") or len(node.input) < 2 or node.input[1] not in inits:
            continue
        name = node.input[1]
        w = numpy_helper.to_array(inits[name])
        if name in done or w.ndim < 2:
            continue
        out_axis, in_axis = weight_axes(node)
        fq = int4_symmetric_groups(w, in_axis, group or w.shape[in_axis]) if weights == "int4" \
            else int8_per_channel(w, out_axis)
        inits[name].CopyFrom(numpy_helper.from_array(fq, name))
        done.add(name)
    return out


def pooled_figures(
    fp32: onnx.ModelProto, fq: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]
) -> dict[str, tuple[float, float]]:
    """Per output (cosine, SQNR dB) pooled over every element of every sample: Σxy / sqrt(Σx² Σy²) and
    10 log10(Σx² / Σ(x-y)²), both models run by onnxruntime."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.intra_op_num_threads = 1  # one summation order, run to run
    a = ort.InferenceSession(fp32.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(fq.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in a.get_outputs()]
    xs: dict[str, list[np.ndarray]] = {n: [] for n in names}
    ys: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for feed in feeds:
        for n, x, y in zip(names, a.run(names, feed), b.run(names, feed), strict=True):
            xs[n].append(np.asarray(x, np.float64).ravel())
            ys[n].append(np.asarray(y, np.float64).ravel())
    figures = {}
    for n in names:
        x, y = np.concatenate(xs[n]), np.concatenate(ys[n])
        figures[n] = (float(x @ y / np.sqrt((x @ x) * (y @ y))), float(10 * np.log10((x @ x) / ((x - y) @ (x - y)))))
    return figures


def pooled_cosines(fp32: onnx.ModelProto, fq: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> dict[str, float]:
    return {k: v[0] for k, v in pooled_figures(fp32, fq, feeds).items()}


def bn_folded(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with Constant-node weights as initializers (Paddle exports) and BatchNormalization
    folded into the Conv before it: the weights quantscan quantizes."""
    weighted = onnx.ModelProto()
    weighted.CopyFrom(model)
    constants_to_initializers(weighted)
    return fold_batchnorm(weighted).model
