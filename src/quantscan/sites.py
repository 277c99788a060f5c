"""Quantization sites: the kernels a chip runs after its compiler has fused the graph.

A site is where an NPU quantizes: at the data inputs and the output of one kernel. Measuring a QDQ
pair between a Conv and its Relu, or inside a decomposed HardSwish, measures an error no chip makes,
so this module groups the prepared graph's nodes into kernels first:

- an *anchor* (Conv, ConvTranspose, Gemm, MatMul) absorbs a following per-channel affine op with a
  constant operand (bias Add, scale Mul) and one fused activation (Relu, Clip, LeakyRelu, PRelu,
  HardSwish, HardSigmoid, Sigmoid, and the SiLU and decomposed-HardSwish patterns);
- decomposed LayerNorm (ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div[/Mul/Add]), Erf-GELU,
  x·sigmoid(x) and x·Clip(x+3,0,6)/6 are recognised as one kernel each;
- any other float-producing op is a kernel of its own and may absorb one fused activation;
- scale-preserving ops (Reshape, Transpose, MaxPool, Concat, ...) are not sites: they pass their
  input's quantization through.

Pure graph logic: no onnxruntime, no numpy arithmetic beyond reading constant shapes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

ANCHOR_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
DEFAULT_FUSED_ACTIVATIONS = frozenset(
    {"Relu", "Clip", "LeakyRelu", "PRelu", "HardSwish", "HardSigmoid", "Sigmoid", "SiLU"}
)
"""Activations joined to their producer when no chip profile says otherwise (CONTRACT.md's list).
`SiLU` and `HardSwish` also name the decomposed patterns x·sigmoid(x) and x·Clip(x+3,0,6)/6."""
PASS_THROUGH_OPS = frozenset(
    {
        "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Gather", "MaxPool",
        "Identity", "Concat", "Split", "Dropout", "DepthToSpace", "SpaceToDepth", "Expand", "Tile", "Pad",
    }
)
"""Ops that move or select values without computing new ones: same scale in and out."""

PARAMETER_INPUTS: Mapping[str, frozenset[int]] = {
    "Resize": frozenset({1, 2, 3}),
    "Upsample": frozenset({1}),
    "Clip": frozenset({1, 2}),
    "Pad": frozenset({1, 2, 3}),
    "Reshape": frozenset({1}),
    "Slice": frozenset({1, 2, 3, 4}),
    "Expand": frozenset({1}),
    "Tile": frozenset({1}),
    "Gather": frozenset({1}),
    "GatherElements": frozenset({1}),
    "GatherND": frozenset({1}),
    "ScatterND": frozenset({1}),
    "ScatterElements": frozenset({1}),
    "TopK": frozenset({1}),
    "Split": frozenset({1}),
    "Squeeze": frozenset({1}),
    "Unsqueeze": frozenset({1}),
    "ReduceMean": frozenset({1}),
    "ReduceSum": frozenset({1}),
    "ReduceMax": frozenset({1}),
    "ReduceMin": frozenset({1}),
    "ReduceL2": frozenset({1}),
    "LSTM": frozenset({4, 5, 6, 7}),
    "GRU": frozenset({4, 5}),
    "RNN": frozenset({4, 5}),
    "BatchNormalization": frozenset({1, 2, 3, 4}),
    "LayerNormalization": frozenset({1, 2}),
    "InstanceNormalization": frozenset({1, 2}),
    "GroupNormalization": frozenset({1, 2}),
    "Dropout": frozenset({1, 2}),
    "CumSum": frozenset({1}),
    "OneHot": frozenset({0, 1, 2}),
    "NonMaxSuppression": frozenset({2, 3, 4}),
    "RoiAlign": frozenset({1, 2}),
    "GridSample": frozenset({1}),
    "Trilu": frozenset({1}),
}
"""Inputs that are shapes, indices, scales or parameters: fake quantization never goes there."""

SENSITIVE_OPS = frozenset(
    {"LayerNormalization", "Softmax", "LogSoftmax", "Gelu", "Erf", "Exp", "Log", "Pow", "Sqrt",
     "Reciprocal"}
)
"""Ops whose int8 version is fragile on NPUs (contract: `sensitive_op`)."""

_AFFINE_OPS = frozenset({"Add", "Mul", "Sub", "Div"})


@dataclass
class Site:
    """One kernel as the chip runs it. `node` is its first node, named as in the original model."""

    node: str
    op_type: str
    kernel: str
    nodes: list[str]
    inputs: list[str]
    output: str
    weight: str | None = None
    weight_axis: int | None = None
    bias: str | None = None
    extra_weights: list[tuple[str, int]] = field(default_factory=list)
    conv_like: bool = False
    sensitive: bool = False

    @property
    def fused(self) -> bool:
        return len(self.nodes) > 1


class GraphIndex:
    """Producer/consumer maps over one graph, built once and shared by the matchers."""

    def __init__(self, graph: onnx.GraphProto, float_tensors: set[str] | None = None) -> None:
        self.graph = graph
        self.nodes = list(graph.node)
        self.constants: dict[str, onnx.TensorProto] = {t.name: t for t in graph.initializer}
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        for idx, node in enumerate(self.nodes):
            for out in node.output:
                if out:
                    self.producer[out] = idx
            for inp in node.input:
                if inp:
                    self.consumers.setdefault(inp, []).append(idx)
        self.graph_outputs = {o.name for o in graph.output}
        self.graph_inputs = {i.name for i in graph.input if i.name not in self.constants}
        self.float_tensors = float_tensors

    def is_const(self, name: str) -> bool:
        return name in self.constants

    def const_value(self, name: str) -> np.ndarray | None:
        tensor = self.constants.get(name)
        return numpy_helper.to_array(tensor) if tensor is not None else None

    def users(self, name: str) -> list[onnx.NodeProto]:
        return [self.nodes[i] for i in self.consumers.get(name, [])]

    def single_user(self, name: str) -> onnx.NodeProto | None:
        """The only consumer of `name`, when it has exactly one and is not a graph output."""
        users = self.consumers.get(name, [])
        if len(users) != 1 or name in self.graph_outputs:
            return None
        return self.nodes[users[0]]

    def is_float(self, name: str) -> bool:
        if self.float_tensors is None:
            return True
        return name in self.float_tensors


def scalar_const(index: GraphIndex, name: str) -> float | None:
    value = index.const_value(name)
    if value is None or value.size != 1:
        return None
    return float(value.reshape(()))


def other_input(node: onnx.NodeProto, name: str) -> str | None:
    """For a binary op with `name` as one operand, the other operand."""
    ins = [i for i in node.input if i]
    if len(ins) != 2 or name not in ins:
        return None
    return ins[1] if ins[0] == name else ins[0]


# --- pattern matchers: each returns (nodes, output tensor, label) or None -----------------------------

Match = tuple[list[onnx.NodeProto], str, str]


def match_silu(index: GraphIndex, x: str) -> Match | None:
    """x·sigmoid(x) and x·sigmoid(β·x): Sigmoid (optionally after Mul by a constant) times x."""
    for user in index.users(x):
        chain: list[onnx.NodeProto] = []
        sig = user
        if user.op_type == "Mul" and index.is_const(other_input(user, x) or ""):
            nxt = index.single_user(user.output[0])
            if nxt is None or nxt.op_type != "Sigmoid":
                continue
            chain.append(user)
            sig = nxt
        if sig.op_type != "Sigmoid":
            continue
        mul = index.single_user(sig.output[0])
        if mul is None or mul.op_type != "Mul" or other_input(mul, sig.output[0]) != x:
            continue
        return [*chain, sig, mul], mul.output[0], "SiLU"
    return None


def match_hardswish(index: GraphIndex, x: str) -> Match | None:
    """x·Clip(x+3, 0, 6)/6 in its exporter variants (Mul then Div/Mul, or Div first)."""
    for add in index.users(x):
        if add.op_type != "Add" or scalar_const(index, other_input(add, x) or "") != 3.0:
            continue
        clip = index.single_user(add.output[0])
        if clip is None or clip.op_type not in ("Clip", "Relu6"):
            continue
        nxt = index.single_user(clip.output[0])
        if nxt is None:
            continue
        if nxt.op_type == "Mul" and other_input(nxt, clip.output[0]) == x:
            scale = index.single_user(nxt.output[0])
            if scale is not None and _is_divide_by_six(index, scale, nxt.output[0]):
                return [add, clip, nxt, scale], scale.output[0], "HardSwish"
        if _is_divide_by_six(index, nxt, clip.output[0]):
            mul = index.single_user(nxt.output[0])
            if mul is not None and mul.op_type == "Mul" and other_input(mul, nxt.output[0]) == x:
                return [add, clip, nxt, mul], mul.output[0], "HardSwish"
    return None


def _is_divide_by_six(index: GraphIndex, node: onnx.NodeProto, x: str) -> bool:
    value = scalar_const(index, other_input(node, x) or "")
    if value is None:
        return False
    if node.op_type == "Div":
        return abs(value - 6.0) < 1e-6
    return node.op_type == "Mul" and abs(value - 1.0 / 6.0) < 1e-6


def match_layernorm(index: GraphIndex, x: str) -> Match | None:
    """ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div, optionally followed by Mul(γ) and Add(β)."""
    for mean in index.users(x):
        if mean.op_type != "ReduceMean":
            continue
        sub = index.single_user(mean.output[0])
        if sub is None or sub.op_type != "Sub" or list(sub.input) != [x, mean.output[0]]:
            continue
        d = sub.output[0]
        users = {u.op_type: u for u in index.users(d)}
        pow_, div = users.get("Pow"), users.get("Div")
        if pow_ is None or div is None or len(index.users(d)) != 2:
            continue
        mean2 = index.single_user(pow_.output[0])
        add = index.single_user(mean2.output[0]) if mean2 is not None and mean2.op_type == "ReduceMean" else None
        sqrt = index.single_user(add.output[0]) if add is not None and add.op_type == "Add" else None
        if sqrt is None or sqrt.op_type != "Sqrt" or index.single_user(sqrt.output[0]) is not div:
            continue
        assert mean2 is not None and add is not None
        nodes = [mean, sub, pow_, mean2, add, sqrt, div]
        out = div.output[0]
        for op in ("Mul", "Add"):
            nxt = index.single_user(out)
            if nxt is None or nxt.op_type != op or not index.is_const(other_input(nxt, out) or ""):
                break
            nodes.append(nxt)
            out = nxt.output[0]
        return nodes, out, "LayerNorm"
    return None


def match_gelu(index: GraphIndex, x: str) -> Match | None:
    """0.5·x·(1+erf(x/√2)) in the usual exporter orders."""
    for first in index.users(x):
        if first.op_type not in ("Div", "Mul") or not index.is_const(other_input(first, x) or ""):
            continue
        erf = index.single_user(first.output[0])
        if erf is None or erf.op_type != "Erf":
            continue
        add = index.single_user(erf.output[0])
        if add is None or add.op_type != "Add":
            continue
        nodes = [first, erf, add]
        out = add.output[0]
        for _ in range(2):
            nxt = index.single_user(out)
            if nxt is None or nxt.op_type != "Mul":
                break
            operand = other_input(nxt, out)
            if operand != x and not index.is_const(operand or ""):
                break
            nodes.append(nxt)
            out = nxt.output[0]
        if any(n.op_type == "Mul" and x in n.input for n in nodes[3:]):
            return nodes, out, "GELU"
    return None


def match_fused_activation(index: GraphIndex, x: str, fused: frozenset[str]) -> Match | None:
    """The activation a chip runs inside the producer's kernel: a listed op or a recognised pattern."""
    users = index.users(x)
    if x in index.graph_outputs:
        return None
    for matcher in (match_silu, match_hardswish):
        label = "SiLU" if matcher is match_silu else "HardSwish"
        if label not in fused and not (label == "SiLU" and "Swish" in fused):
            continue
        found = matcher(index, x)
        if found is not None and {id(n) for n in users} <= {id(n) for n in found[0]}:
            return found
    single = index.single_user(x)
    if single is not None and single.op_type in fused:
        return [single], single.output[0], single.op_type
    return None


# --- site building -------------------------------------------------------------------------------------


def find_sites(
    model: onnx.ModelProto,
    *,
    float_tensors: set[str],
    original_order: Mapping[str, int],
    bn_folded_into: Iterable[str] = (),
    fused_activations: frozenset[str] = DEFAULT_FUSED_ACTIVATIONS,
    cpu_nodes: Iterable[str] = (),
) -> list[Site]:
    """Group the prepared graph into kernels and describe where each one is quantized.

    `float_tensors` are the tensors the runtime produced as float (from a probe run): shape
    computations (int64) and booleans are never sites. `cpu_nodes` stay float (a profile's fallback).
    """
    index = GraphIndex(model.graph, float_tensors)
    folded = set(bn_folded_into)
    skip = set(cpu_nodes)
    claimed: set[int] = set()
    sites: list[Site] = []
    node_pos = {id(n): i for i, n in enumerate(index.nodes)}
    channels_first = channels_first_tensors(index)
    for idx, node in enumerate(index.nodes):
        if idx in claimed or node.name in skip or not _is_compute(index, node):
            continue
        kernel_nodes, output, labels = _grow_kernel(index, node, fused_activations)
        if any(node_pos[id(n)] in claimed or n.name in skip for n in kernel_nodes[1:]):
            # a part already taken, or a part the chip runs on the CPU: the node is a kernel alone
            kernel_nodes, output, labels = [node], node.output[0], [node.op_type]
        claimed.update(node_pos[id(n)] for n in kernel_nodes)
        if node.name in folded:
            labels.insert(1, "BatchNormalization")
        site = _make_site(index, kernel_nodes, output, labels, original_order)
        site.conv_like = site.conv_like or output in channels_first
        sites.append(site)
    return sites


_LAYOUT_SOURCES = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool",
                             "GlobalMaxPool", "BatchNormalization", "InstanceNormalization", "LpPool", "Resize",
                             "Upsample", "DepthToSpace", "SpaceToDepth"})
_LAYOUT_KEEPERS = frozenset({"Add", "Sub", "Mul", "Div", "Relu", "Clip", "LeakyRelu", "PRelu", "Sigmoid",
                             "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu", "Softplus", "Pad", "Concat",
                             "Identity", "Dropout", "Split", "Slice", "Pow", "Sqrt", "Abs", "Neg", "Erf"})


def channels_first_tensors(index: GraphIndex) -> set[str]:
    """Tensors in the NCHW layout of a convolutional network: the channel axis is 1 (CONTRACT.md).

    Conv-like producers start the layout; elementwise ops, activations, padding and concatenation keep
    it; reshapes and transposes end it. So an SE block's Mul after a Conv has its channels on axis 1,
    not on the last (width) axis.
    """
    found: set[str] = set()
    for node in index.nodes:
        keeps = node.op_type in _LAYOUT_KEEPERS and any(i in found for i in node.input)
        if node.op_type in _LAYOUT_SOURCES or keeps:
            found.update(o for o in node.output if o)
    return found


def _is_compute(index: GraphIndex, node: onnx.NodeProto) -> bool:
    if node.op_type in PASS_THROUGH_OPS or node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "Cast" and node.input and index.is_float(node.input[0]):
        return False  # float-to-float cast: a no-op on the chip, same scale in and out
    out = node.output[0] if node.output else ""
    return bool(out) and index.is_float(out)


def _grow_kernel(
    index: GraphIndex, node: onnx.NodeProto, fused: frozenset[str]
) -> tuple[list[onnx.NodeProto], str, list[str]]:
    """Start at `node`, return the kernel's nodes, its output tensor and the parts of its name."""
    x = node.input[0] if node.input else ""
    for matcher in (match_layernorm, match_gelu, match_silu, match_hardswish):
        found = matcher(index, x) if x else None
        if found is not None and found[0][0] is node:
            nodes, out, label = found
            return nodes, out, [f"{label}[{'+'.join(n.op_type for n in nodes)}]"]
    nodes, out, labels = [node], node.output[0], [node.op_type]
    if node.op_type in ANCHOR_OPS and _has_const_weight(index, node):
        for _ in range(2):
            affine = index.single_user(out)
            if affine is None or affine.op_type not in _AFFINE_OPS:
                break
            operand = other_input(affine, out)
            if operand is None or not index.is_const(operand) or affine.input[0] != out and affine.op_type in (
                "Sub",
                "Div",
            ):
                break
            nodes.append(affine)
            labels.append(affine.op_type)
            out = affine.output[0]
    activation = match_fused_activation(index, out, fused) if node.op_type not in fused else None
    if activation is not None:
        act_nodes, out, label = activation
        nodes.extend(act_nodes)
        labels.append(label if len(act_nodes) == 1 else f"{label}[{'+'.join(n.op_type for n in act_nodes)}]")
    return nodes, out, labels


def _has_const_weight(index: GraphIndex, node: onnx.NodeProto) -> bool:
    return len(node.input) > 1 and index.is_const(node.input[1])


def weight_axis(node: onnx.NodeProto) -> int:
    """Output-channel axis of a weight (contract): Conv 0, ConvTranspose 1, MatMul [K,N] 1, Gemm by transB."""
    if node.op_type == "ConvTranspose":
        return 1
    if node.op_type == "MatMul":
        return 1
    if node.op_type == "Gemm":
        trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
        return 0 if trans_b else 1
    return 0


def _make_site(
    index: GraphIndex,
    nodes: list[onnx.NodeProto],
    output: str,
    labels: list[str],
    original_order: Mapping[str, int],
) -> Site:
    first = nodes[0]
    inside = {o for n in nodes for o in n.output}
    data_inputs: list[str] = []
    weight = bias = None
    axis = None
    extra: list[tuple[str, int]] = []
    if first.op_type in ANCHOR_OPS and _has_const_weight(index, first):
        weight, axis = first.input[1], weight_axis(first)
        if first.op_type != "MatMul" and len(first.input) > 2 and first.input[2]:
            bias_value = index.const_value(first.input[2])
            if bias_value is not None and bias_value.ndim == 1:
                bias = first.input[2]
    if first.op_type in ("LSTM", "GRU", "RNN"):
        extra = [(name, 1) for name in first.input[1:3] if name and index.is_const(name)]
    for node in nodes:
        params = PARAMETER_INPUTS.get(node.op_type, frozenset())
        for pos, name in enumerate(node.input):
            if not name or name in inside or pos in params or index.is_const(name) or not index.is_float(name):
                continue
            if node is first and pos == 1 and weight is not None:
                continue
            if name not in data_inputs:
                data_inputs.append(name)
    op_types = {n.op_type for n in nodes}
    sensitive = bool(op_types & SENSITIVE_OPS) or any(lbl.startswith(("LayerNorm", "GELU")) for lbl in labels)
    if not sensitive and first.op_type == "Div" and not index.is_const(first.input[1] if len(first.input) > 1 else ""):
        sensitive = True
    if first.op_type in ("ReduceMean", "ReduceSum") and any(
        u.op_type in ("Sub", "Div") for u in index.users(first.output[0])
    ):
        sensitive = True
    if output in index.graph_outputs and op_types & {"Sigmoid", "Tanh"}:
        sensitive = True
    return Site(
        node=first.name,
        op_type=first.op_type,
        kernel="+".join(labels),
        nodes=[n.name for n in nodes],
        inputs=data_inputs,
        output=output,
        weight=weight,
        weight_axis=axis,
        bias=bias,
        extra_weights=extra,
        conv_like=first.op_type in ("Conv", "ConvTranspose"),
        sensitive=sensitive,
    )
