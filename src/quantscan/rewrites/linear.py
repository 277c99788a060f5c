"""Weight layers seen as `y = W·x + b` over channels: what equalize, smooth and bias-correct edit.

Why one module: the three passes scale the same things (a layer's output channels, a layer's input
channels, its bias) on Conv, Gemm and MatMul, whose weights lay the channels out differently (grouped
and depthwise Conv, Gemm's transB, MatMul's [K, N], a MatMul whose bias is the Add after it). Each
pass keeps only its own rule; the layout arithmetic and the write-back (initializer or Constant node,
the exporter's style kept) live here once.

Channel axis of the activations: 1 for Conv (NCHW), the last one for Gemm/MatMul. A rescaling can
only pass between layers whose activations put channels on the same axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from quantscan.graph.edit import attr_float, attr_int, node_label
from quantscan.graph.index import GraphIndex

WEIGHT_OPS = ("Conv", "Gemm", "MatMul")


@dataclass
class Linear:
    """One weight layer: copies of its weight and bias (float64 once edited), written back by `store`.

    `bias_node` is the node holding the bias input (the layer itself, or the Add after a MatMul);
    `output` the tensor carrying the biased result (the Add's output for MatMul+Add).
    """

    node: onnx.NodeProto
    kind: str
    weight_name: str
    weight: np.ndarray
    dtype: np.dtype
    bias_name: str | None
    bias: np.ndarray | None
    output: str
    group: int = 1
    trans_b: bool = False

    @property
    def label(self) -> str:
        return node_label(self.node)

    @property
    def channel_axis(self) -> str:
        """'conv' (axis 1) or 'last' (Gemm/MatMul): layers exchange scales only on the same axis."""
        return "conv" if self.kind == "Conv" else "last"

    @property
    def out_channels(self) -> int:
        if self.kind == "Conv":
            return int(self.weight.shape[0])
        return int(self.weight.shape[0] if self.trans_b else self.weight.shape[1])

    @property
    def in_channels(self) -> int:
        if self.kind == "Conv":
            return int(self.weight.shape[1] * self.group)
        return int(self.weight.shape[1] if self.trans_b else self.weight.shape[0])

    def _grouped(self) -> np.ndarray:
        """Conv weight as [G, Cout/G, Cin/G, k...]: input channel c sits at [c // (Cin/G), :, c % (Cin/G)]."""
        w = self.weight
        return w.reshape((self.group, w.shape[0] // self.group) + w.shape[1:])

    def out_absmax(self) -> np.ndarray:
        """max |W| per output channel (the per-channel weight range int8 sees)."""
        axis = 0 if self.kind == "Conv" or self.trans_b else 1
        others = tuple(i for i in range(self.weight.ndim) if i != axis)
        return np.abs(self.weight).max(axis=others)

    def in_absmax(self) -> np.ndarray:
        """max |W| per input channel."""
        if self.kind == "Conv":
            g = np.abs(self._grouped())
            return g.max(axis=(1, *range(3, g.ndim))).reshape(-1)
        return np.abs(self.weight).max(axis=0 if self.trans_b else 1)

    def scale_outputs(self, factor: np.ndarray) -> None:
        """Output channel o multiplied by factor[o] (weight row and bias): y' = factor · y."""
        if self.kind == "Conv" or self.trans_b:
            self.weight = self.weight * factor.reshape((-1,) + (1,) * (self.weight.ndim - 1))
        else:
            self.weight = self.weight * factor.reshape(1, -1)
        if self.bias is not None:
            self.bias = self.bias * factor.reshape(self.bias.shape)

    def scale_inputs(self, factor: np.ndarray) -> None:
        """Input channel c's weights multiplied by factor[c]: the layer reads x / factor unchanged."""
        if self.kind == "Conv":
            g = self._grouped()
            cin_g = g.shape[2]
            f = factor.reshape((self.group, 1, cin_g) + (1,) * (g.ndim - 3))
            self.weight = (g * f).reshape(self.weight.shape)
        elif self.trans_b:
            self.weight = self.weight * factor.reshape(1, -1)
        else:
            self.weight = self.weight * factor.reshape(-1, 1)


def linear_of(node: onnx.NodeProto, index: GraphIndex) -> Linear | str:
    """The layer behind a Conv/Gemm/MatMul node, or why it cannot be rescaled.

    Refused: a non-constant or shared weight (scaling it would change another reader), a bias that is
    not one value per output channel, Gemm with transA (channels on the other axis), MatMul whose
    weight is not a 2-D constant second input, dilated/grouped shapes that do not divide.
    """
    if node.op_type not in WEIGHT_OPS or node.domain not in ("", "ai.onnx"):
        return f"{node.op_type} is not a weight layer"
    if len(node.input) < 2 or not node.input[1]:
        return "no weight input"
    wname = node.input[1]
    w = index.constant(wname)
    if w is None:
        return f"weight {wname!r} is not constant"
    if not np.issubdtype(w.dtype, np.floating):
        return f"weight {wname!r} is not float"
    if index.use_count(wname) > 1:
        return f"weight {wname!r} is shared with another node"
    out = node.output[0]
    bias_name: str | None = node.input[2] if len(node.input) > 2 and node.input[2] else None
    group, trans_b = 1, False
    if node.op_type == "Conv":
        group = attr_int(node, "group", 1)
        if w.ndim < 3 or w.shape[0] % group:
            return f"Conv weight shape {list(w.shape)} does not split into {group} groups"
    elif node.op_type == "Gemm":
        if attr_int(node, "transA", 0):
            return "Gemm has transA=1: channels on the other axis"
        trans_b = bool(attr_int(node, "transB", 0))
        if w.ndim != 2:
            return "Gemm weight is not 2-D"
        if bias_name is not None and attr_float(node, "beta", 1.0) != 1.0:
            return "Gemm has beta != 1"
    elif w.ndim != 2:
        return "MatMul weight is not a 2-D constant"
    # kept in the stored dtype until an edit (factors are float64, so the first edit promotes): the
    # diagnosis builds every layer of a model only to read the graph's structure
    layer = Linear(node, node.op_type, wname, w, w.dtype, bias_name, None, out, group, trans_b)
    if node.op_type == "MatMul":
        add = index.single_user(out)
        if add is not None and add.op_type == "Add":
            other = add.input[1] if add.input[0] == out else add.input[0]
            value = index.constant(other)
            if value is not None and value.size == layer.out_channels and value.shape[-1] == value.size:
                layer.bias_name, layer.output = other, add.output[0]
    if layer.bias_name is not None:
        b = index.constant(layer.bias_name)
        if b is None:
            return f"bias {layer.bias_name!r} is not constant"
        if b.size != layer.out_channels:
            return f"bias has {b.size} values for {layer.out_channels} output channels"
        if index.use_count(layer.bias_name) > 1:
            return f"bias {layer.bias_name!r} is shared with another node"
        layer.bias = np.asarray(b)
    return layer


def store(model: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    """Overwrite the constant `name` (initializer or Constant node) with `value`, same name and dtype.

    Same name on purpose: the rescaled weights keep the model's tensor names, so per-tensor reports
    before and after line up. Callers refused shared constants, so no other reader sees the change.
    """
    for t in model.graph.initializer:
        if t.name == name:
            t.CopyFrom(numpy_helper.from_array(value, name=name))
            return
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output and node.output[0] == name:
            for a in node.attribute:
                if a.name == "value":
                    a.t.CopyFrom(numpy_helper.from_array(value, name=name))
                    return
    raise KeyError(name)


def write_back(model: onnx.ModelProto, layers: list[Linear]) -> None:
    """Store every layer's edited weight and bias in `model`, in the original dtypes."""
    for layer in layers:
        store(model, layer.weight_name, layer.weight.astype(layer.dtype))
        if layer.bias_name is not None and layer.bias is not None:
            store(model, layer.bias_name, layer.bias.astype(layer.dtype))
