"""`bias-correct`: remove from each layer's bias the mean output shift its int8 weights cause.

Why: rounding a layer's weights to int8 adds an error ε = Q(W) − W whose effect on the output is not
zero-mean when the inputs are not (after Relu they never are): E[y_q − y] = ε·E[x] per output channel,
a systematic shift that accumulates through the network (Nagel et al. 2019, §4.2; empirical variant:
E[x] measured on the calibration data). Subtracting it from the FP32 bias makes the int8 layer
unbiased: b' = b − ε·E[x].

Not exact: the FP32 model changes by that shift (small by construction: one int8 weight step times the
input mean), so its proof is the approximate one, and the runner reports per site the int8-weight
error of the layer's output before and after (`calibstats.tensor_sqnr`).

Weights are quantized as the scan does (`quant.weight_qparams`: symmetric per output channel). For a
Conv the shift is per output channel with E[x] per input channel, summed over the kernel: border
pixels that read padding see a slightly different shift (ignored, as in the paper).

BatchNormalization is folded first (`fold-bn`): the chip quantizes the folded weights.
Refused: layers without a bias input (MatMul without an Add after it, Conv without B), no statistics
for the layer's input (not reached by the calibration run), weights the weight-layer rules refuse.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from quantscan import quant
from quantscan.graph.edit import node_label
from quantscan.graph.index import GraphIndex
from quantscan.rewrites.base import Change, Refusal, RewriteResult
from quantscan.rewrites.calibstats import ChannelStats
from quantscan.rewrites.fold_bn import fold_batchnorm
from quantscan.rewrites.linear import WEIGHT_OPS, Linear, linear_of, store, write_back

REWRITE_ID = "bias-correct"


def _layers(model: onnx.ModelProto) -> tuple[list[Linear], list[Refusal]]:
    """The weight layers of `model` a correction can edit, and why the others cannot be."""
    index = GraphIndex(model.graph, ir_version=model.ir_version)
    layers: list[Linear] = []
    refusals: list[Refusal] = []
    for node in index.nodes:
        if node.op_type not in WEIGHT_OPS or node.domain not in ("", "ai.onnx"):
            continue
        got = linear_of(node, index)
        if isinstance(got, str):
            refusals.append(Refusal(REWRITE_ID, node_label(node), got))
        elif got.bias is None:
            refusals.append(Refusal(REWRITE_ID, got.label, "no bias input to correct"))
        else:
            layers.append(got)
    return layers, refusals


def bias_sites(model: onnx.ModelProto) -> dict[str, str]:
    """Input tensors whose per-channel means a correction needs (name -> channel axis kind)."""
    folded = fold_batchnorm(model).model
    return {layer.node.input[0]: layer.channel_axis for layer in _layers(folded)[0]}


def weight_error(layer: Linear) -> np.ndarray:
    """ε = Q(W) − W, W quantized symmetric int8 per output channel (the scan's weight scheme)."""
    axis = 0 if layer.kind == "Conv" or layer.trans_b else 1
    w32 = layer.weight.astype(np.float32)
    return quant.fake_quant(w32, quant.weight_qparams(w32, axis)).astype(np.float64) - layer.weight.astype(np.float64)


def output_shift(layer: Linear, mean: np.ndarray) -> np.ndarray:
    """E[y_q − y] per output channel: ε·E[x] (Conv: summed over the kernel, within the group)."""
    eps = weight_error(layer)
    if layer.kind == "Conv":
        g = layer.group
        summed = eps.reshape(eps.shape[0], eps.shape[1], -1).sum(axis=2)  # [Cout, Cin/G]
        cout_g, cin_g = eps.shape[0] // g, eps.shape[1]
        m = mean.reshape(g, cin_g)
        return np.einsum("goc,gc->go", summed.reshape(g, cout_g, cin_g), m).reshape(-1)
    return eps @ mean if layer.trans_b else mean @ eps


def bias_correct(model: onnx.ModelProto, stats: Mapping[str, ChannelStats]) -> RewriteResult:
    """Correct every layer with a bias and input statistics; BN is folded first."""
    folded = fold_batchnorm(model)
    out = folded.model
    result = RewriteResult(model=out, changes=list(folded.changes), refusals=list(folded.refusals), exact=False)
    layers, refusals = _layers(out)
    result.refusals.extend(refusals)
    edited: list[Linear] = []
    for layer in layers:
        s = stats.get(layer.node.input[0])
        if s is None:
            result.refusals.append(Refusal(REWRITE_ID, layer.label, "no statistics for its input"))
            continue
        if s.mean.size != layer.in_channels:
            result.refusals.append(Refusal(
                REWRITE_ID, layer.label, f"input has {s.mean.size} channels, the weight reads {layer.in_channels}"))
            continue
        shift = output_shift(layer, s.mean)
        assert layer.bias is not None
        before = float(np.sqrt(np.mean(np.square(layer.bias.astype(np.float64))))) or 1.0
        layer.bias = layer.bias.astype(np.float64) - shift.reshape(layer.bias.shape)
        edited.append(layer)
        result.changes.append(Change(
            REWRITE_ID, layer.label,
            f"removed the int8-weight mean shift from the bias: RMS {np.sqrt(np.mean(shift ** 2)):.3g} "
            f"({np.sqrt(np.mean(shift ** 2)) / before:.2%} of the bias RMS)",
        ))
    for layer in edited:
        if layer.bias_name is not None and layer.bias is not None:
            store(out, layer.bias_name, layer.bias.astype(layer.dtype))
    return result


def with_int8_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose correctable layers' weights are replaced by their int8 values (dequantized).

    What the per-site figures compare: the layer outputs with int8 weights and FP32 activations, so the
    figure isolates what bias correction addresses.
    """
    out = fold_batchnorm(model).model
    layers, _ = _layers(out)
    for layer in layers:
        layer.weight = layer.weight + weight_error(layer)
    write_back(out, layers)
    return out
