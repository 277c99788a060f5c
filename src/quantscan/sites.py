"""Quantization sites: the kernels a chip runs after its compiler has fused the graph.

A site is where an NPU quantizes: at the data inputs and the output of one kernel. Measuring a QDQ
pair between a Conv and its Relu, or inside a decomposed HardSwish, measures an error no chip makes,
so this module groups the prepared graph's nodes into kernels first:

- an *anchor* (Conv, ConvTranspose, Gemm, MatMul) absorbs a following per-channel affine op with a
  constant operand (bias Add, scale Mul) and one fused activation (Relu, Clip, LeakyRelu, PRelu,
  HardSwish, HardSigmoid, Sigmoid, and the SiLU and decomposed-HardSwish patterns);
- decomposed LayerNorm (mean by ReduceMean or MatMul by 1/C; Sqrt+Div, Reciprocal, 1/Sqrt or
  Pow -0.5; or the variance as E[x²] − E[x]² from sums times 1/C, as jax2tf writes flax's), GELU
  (Erf and tanh forms), Softmax (Exp/ReduceSum/Div, with or without the ReduceMax/Sub shift),
  x·sigmoid(x) and HardSwish (x·Clip(x+3,0,6)/6, x·HardSigmoid(x)) are recognised as one kernel
  each by what they compute (`quantscan.patterns`), when their intermediate tensors are read nowhere
  else;
- any other float-producing op is a kernel of its own and may absorb one fused activation;
- scale-preserving ops (Reshape, Transpose, MaxPool, Concat, ...) are not sites: they pass their
  input's quantization through.

Pure graph logic: no onnxruntime, no numpy arithmetic beyond reading constant shapes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import onnx

from quantscan.graph.edit import attr_int
from quantscan.graph.index import GraphIndex, other_input
from quantscan.patterns import fused_activation, gelu, hardswish, layernorm, layernorm_moments, silu, softmax
from quantscan.patterns.base import Match

ANCHOR_OPS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
DEFAULT_FUSED_ACTIVATIONS = frozenset(
    {"Relu", "Clip", "LeakyRelu", "PRelu", "HardSwish", "HardSigmoid", "Sigmoid", "SiLU"}
)
"""Activations joined to their producer when no chip profile says otherwise (CONTRACT.md's list).
`SiLU` and `HardSwish` also name the decomposed patterns x·sigmoid(x), x·Clip(x+3,0,6)/6 and
x·HardSigmoid(x)."""
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

SENSITIVE_KERNELS = (layernorm.KERNEL, gelu.KERNEL, softmax.KERNEL)
"""Decomposed kernels built from sensitive ops (contract: "and kernels built from them")."""

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
    shares: list[str] = field(default_factory=list)
    """A model input's site (`input_sites`): the tensors that carry the input's quantization unchanged
    through scale-preserving ops to the first kernels (a Transpose to [T, N, F] before an LSTM). The
    input site decides their precision as it decides the input's."""
    quantized_if: str | None = None
    """A recipe where this kernel quantizes only when an earlier quantized kernel already quantized
    this tensor (onnxruntime's Reshape/MaxPool/Relu...: `is_tensor_quantized(input)`); None: always."""
    inner: list[str] = field(default_factory=list)
    """Tensors inside the kernel the chip also rounds to int8 when the kernel runs int8 (a profile's
    `[kernel_points]`: RKNN's depthwise Conv+HardSwish pre-activation, `with_depthwise_hardswish_points`)."""

    @property
    def fused(self) -> bool:
        return len(self.nodes) > 1

    @property
    def is_input(self) -> bool:
        """A model input as a site (`input_sites`): no node, its output is the graph input it quantizes."""
        return not self.nodes


INPUT_OP = "input"
"""`op_type` and `kernel` of a model input's site row in layers.csv."""


def input_sites(model: onnx.ModelProto, sites: Iterable[Site], fixed: Iterable[str] = ()) -> list[Site]:
    """The model inputs as sites, in graph-input order: every float32 graph input a kernel reads as data,
    directly or through scale-preserving ops (`carried`).

    Why: every NPU quantizes its inputs (the converter's input quantizer, or the first kernel's int8
    input), and an input whose values crowd into a few codes (power spectra: 88% of a speaker encoder's
    mel frames in uint8 code 0) costs the output more than any layer after it. As a site of its own
    it gets isolated/cumulative figures, cause rules and a `gain_if_float` ("feed it float or int16"),
    and its error is no longer charged to the first kernel that reads it. The site owns its tensor and
    the tensors carrying it (`Site.shares`): their precision is the input site's alone
    (graph.mixed.MixedBuilder). `node` is the input's name (`input:NAME` if a node has that name).
    Recurrent state inputs and `--const` inputs (`fixed`: fed back from an output, or one value the data
    does not cover) are not sites: their quantization follows the kernels that read them.
    """
    read = {t for s in sites for t in s.inputs}
    skip = set(fixed) | {t.name for t in model.graph.initializer}
    node_names = {n.name for n in model.graph.node}
    found = []
    for graph_input in model.graph.input:
        name = graph_input.name
        reached = [t for t in carried(model.graph, name) if t in read]
        # float32 only: a float64 input is Cast to float32 in the analysis copy, and that Cast's output is
        # what a kernel reads and what is quantized (QuantizeLinear takes no double)
        if reached and name not in skip and graph_input.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            node = f"{INPUT_OP}:{name}" if name in node_names else name
            found.append(Site(node=node, op_type=INPUT_OP, kernel=INPUT_OP, nodes=[], inputs=[], output=name,
                              shares=[t for t in reached if t != name]))
    return found


HARDSWISH_FLOOR = -3.0
"""HardSwish is 0 from here down: a grid for its input need not reach below it."""


def with_depthwise_hardswish_points(model: onnx.ModelProto, sites: Iterable[Site]) -> list[Site]:
    """`sites` with each depthwise Conv+HardSwish kernel's pre-activation (the HardSwish's input) in its
    `inner` tensors: the chip rounds it to int8 on its own grid before the HardSwish.

    Why: rknn-toolkit2 2.5.0 runs such a kernel as one ConvHardSwish layer, yet its simulator requantizes the
    Conv result on the pre-activation's calibrated grid (floored at -3) and looks the HardSwish up from those
    codes; dense Conv+HardSwish kernels have no such point. On PP-OCRv4 rec that second rounding is 2-5x the
    kernel's error: mixed plans (float sites around int8 depthwise kernels) were claimed 0.005-0.012 of output
    cosine above what RKNN gave them (issue 38)."""
    nodes = {n.name: n for n in model.graph.node}
    inits = {t.name: t for t in model.graph.initializer}
    out = []
    for site in sites:
        pre = _depthwise_hardswish_input(site, nodes, inits)
        out.append(replace(site, inner=[*site.inner, pre]) if pre and pre not in site.inner else site)
    return out


def _depthwise_hardswish_input(site: Site, nodes: Mapping[str, onnx.NodeProto],
                               inits: Mapping[str, onnx.TensorProto]) -> str | None:
    """The HardSwish input of a depthwise Conv kernel that ends in one (the op, x*HardSigmoid(x), or
    x*Clip(x+3, 0, 6)/6), when it is a tensor inside the kernel; else None."""
    if not site.nodes or site.op_type != "Conv":
        return None
    conv = nodes[site.nodes[0]]
    weight = inits.get(conv.input[1]) if len(conv.input) > 1 else None
    if weight is None or len(weight.dims) < 2 or weight.dims[1] != 1 or attr_int(conv, "group", 1) <= 1:
        return None
    kernel = [nodes[n] for n in site.nodes]
    made = {o for n in kernel for o in n.output}
    for node in kernel:
        if node.op_type == "HardSwish":
            pre = node.input[0]
        elif node.op_type == "HardSigmoid":  # x * HardSigmoid(x)
            pre = node.input[0] if _multiplied(kernel, node.input[0], made) else ""
        elif node.op_type == "Clip":  # x * Clip(x + 3, 0, 6) / 6 (a Relu6 alone has no x to multiply)
            shift = next((n for n in kernel if node.input[0] in n.output and n.op_type == "Add"), None)
            pre = next((i for i in shift.input if i in made), "") if shift is not None else ""
            pre = pre if _multiplied(kernel, pre, made) else ""
        else:
            continue
        return pre if pre in made and pre != site.output else None
    return None


def _multiplied(kernel: Iterable[onnx.NodeProto], x: str, made: set[str]) -> bool:
    """A Mul in the kernel multiplies `x` by another tensor the kernel computed (HardSwish's x times its gate,
    before or after the /6)."""
    return any(n.op_type == "Mul" and x in n.input and any(i != x and i in made for i in n.input) for n in kernel)


def carried(graph: onnx.GraphProto, tensor: str) -> list[str]:
    """`tensor` and every tensor holding its values moved, not recomputed: the outputs of scale-preserving
    ops (PASS_THROUGH_OPS, a Cast) that read it as their data input, a Concat of such tensors only (YOLOX's
    Focus: four Slices of the image concatenated), and so on."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        if node.input:
            readers.setdefault(node.input[0], []).append(node)
    found = [tensor]
    for current in found:  # grows while walked
        for node in readers.get(current, []):
            moves = node.op_type in (*PASS_THROUGH_OPS, "Cast") and node.op_type not in ("Concat", "Split")
            if moves or node.op_type == "Concat" and all(i in found for i in node.input):
                found.extend(o for o in node.output[:1] if o and o not in found)
    return found


# --- site building -------------------------------------------------------------------------------------


def find_sites(
    model: onnx.ModelProto,
    *,
    float_tensors: set[str],
    original_order: Mapping[str, int],
    bn_folded_into: Iterable[str] = (),
    fused_activations: frozenset[str] = DEFAULT_FUSED_ACTIVATIONS,
    cpu_nodes: Iterable[str] = (),
    shapes: Mapping[str, tuple[int, ...]] | None = None,
) -> list[Site]:
    """Group the prepared graph into kernels and describe where each one is quantized.

    `float_tensors` are the tensors the runtime produced as float (from a probe run): shape
    computations (int64) and booleans are never sites. `cpu_nodes` stay float (a profile's fallback).
    `shapes`: the probe's tensor shapes, where the graph declares none (they place channel axes).
    """
    index = GraphIndex(model.graph, float_tensors=float_tensors, initializers_are_weights=True)
    index.observe_shapes(shapes or {})
    dependent = data_dependent(model.graph)
    folded = set(bn_folded_into)
    skip = set(cpu_nodes)
    claimed: set[int] = set()
    sites: list[Site] = []
    node_pos = {id(n): i for i, n in enumerate(index.nodes)}
    channels_first = channels_first_tensors(index, shapes)
    for idx, node in enumerate(index.nodes):
        if idx in claimed or node.name in skip or not _is_compute(index, node):
            continue
        if main_output(node, index) not in dependent:
            continue
        kernel_nodes, output, labels = _grow_kernel(index, node, fused_activations)
        if any(node_pos[id(n)] in claimed or n.name in skip for n in kernel_nodes[1:]):
            # a part already taken, or a part the chip runs on the CPU: the node is a kernel alone
            kernel_nodes, output, labels = [node], main_output(node, index), [node.op_type]
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


def channels_first_tensors(index: GraphIndex, shapes: Mapping[str, tuple[int, ...]] | None = None) -> set[str]:
    """Tensors in the NCHW layout of a convolutional network: the channel axis is 1 (CONTRACT.md).

    Conv-like producers start the layout; elementwise ops, activations, padding and concatenation keep
    it; transposes end it, and so do reshapes, except one that keeps axes 0 and 1 and only merges or
    splits the spatial axes (`_keeps_channels`). So an SE block's Mul after a Conv has its channels on
    axis 1, not on the last (width) axis, and a YOLOv8 head's class scores ([N, C, H*W] after
    `view(N, C, -1)`, then a Sigmoid) have their C classes on axis 1, not thousands of anchors.
    """
    found: set[str] = set()
    for node in index.nodes:
        keeps = node.op_type in _LAYOUT_KEEPERS and any(i in found for i in node.input)
        flattens = node.op_type == "Reshape" and node.input[0] in found and _keeps_channels(index, node, shapes)
        if node.op_type in _LAYOUT_SOURCES or keeps or flattens:
            found.update(o for o in node.output if o)
    return found


def _keeps_channels(index: GraphIndex, reshape: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]] | None) -> bool:
    """A Reshape of an [N, C, ...] tensor to a constant [N, C, ...] shape of rank >= 3 (0 copies the
    input's dim, as the spec says unless `allowzero`): axis 1 still holds the same C channels."""
    target = index.constant(reshape.input[1]) if len(reshape.input) > 1 else None
    dims = index.info(reshape.input[0]).shape or (shapes or {}).get(reshape.input[0])
    if target is None or target.ndim != 1 or target.size < 3 or dims is None or len(dims) < 3:
        return False
    copies = not attr_int(reshape, "allowzero", 0)
    batch, channels = (int(t) for t in target[:2])
    same_batch = batch == dims[0] or (copies and batch == 0) or not isinstance(dims[0], int)  # symbolic N
    return same_batch and isinstance(dims[1], int) and (channels == dims[1] or (copies and channels == 0))


VALUE_FREE_OPS = frozenset({"Shape", "Size"})
"""Ops whose output depends on the shape of their input, never on its values."""


def data_dependent(graph: onnx.GraphProto) -> set[str]:
    """The tensors whose values depend on the values fed to a graph input.

    Why: the rest (ConstantOfShape zeros for an LSTM's h0/c0, a detector's anchor grid from Range over
    the input's size, a position embedding resized from weights alone) is the same on every sample:
    a compiler folds it to a constant, so it is no quantization site to blame, and its "zero range"
    or "dead channels" are its value, not a calibration fault. Random ops and nodes with bodies count
    as dependent (their values are not fixed).
    """
    inits = {t.name for t in graph.initializer}
    dependent = {i.name for i in graph.input if i.name not in inits}
    size = -1
    while size != len(dependent):  # one pass on a sorted graph; repeated passes never miss a late producer
        size = len(dependent)
        for node in graph.node:
            if node.op_type in VALUE_FREE_OPS and node.domain in ("", "ai.onnx"):
                continue
            body = any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute)
            if body or node.op_type.startswith("Random") or any(i in dependent for i in node.input):
                dependent.update(o for o in node.output if o)
    return dependent


def _is_compute(index: GraphIndex, node: onnx.NodeProto) -> bool:
    if node.op_type in PASS_THROUGH_OPS or node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type == "Cast" and node.input and index.is_float(node.input[0]):
        return False  # float-to-float cast: a no-op on the chip, same scale in and out
    out = main_output(node, index)
    return bool(out) and index.is_float(out)


def main_output(node: onnx.NodeProto, index: GraphIndex | None = None) -> str:
    """The output a kernel's quantization sits on: the first one the graph uses. An LSTM exported for
    its final state only leaves Y empty (`LSTM(...) -> ("", Y_h)`): Y_h is then its output. With the
    `index`, an output nobody reads is passed over too: a Loop's first outputs are often final states
    left unread (SLANet's decoder returns 23 values, the class scores the 7th), and a quantizer on a
    dead tensor would measure nothing the model's outputs see. No output read: the first one."""
    named = [o for o in node.output if o]
    if index is not None and len(named) > 1:
        return next((o for o in named if index.use_count(o)), named[0])
    return named[0] if named else ""


def _grow_kernel(
    index: GraphIndex, node: onnx.NodeProto, fused: frozenset[str]
) -> tuple[list[onnx.NodeProto], str, list[str]]:
    """Start at `node`, return the kernel's nodes, its output tensor and the parts of its name."""
    kernel = _pattern_kernel(index, node)
    if kernel is not None:
        in_order = sorted(kernel.nodes, key=lambda n: _graph_position(index, n))
        return in_order, kernel.output, [f"{kernel.kernel}[{kernel.op_types()}]"]
    nodes, out, labels = [node], main_output(node, index), [node.op_type]
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
    activation = fused_activation.match(index, out, fused) if node.op_type not in fused else None
    if isinstance(activation, Match):
        nodes.extend(activation.nodes)
        out = activation.output
        single = len(activation.nodes) == 1
        labels.append(activation.kernel if single else f"{activation.kernel}[{activation.op_types()}]")
    return nodes, out, labels


def _pattern_kernel(index: GraphIndex, node: onnx.NodeProto) -> Match | None:
    """The multi-node kernel (LayerNorm, GELU, Softmax, SiLU, HardSwish) that starts at `node`, if any.

    "Starts" is graph order, not the pattern's listing order: an exporter may write (0.5·x) of a GELU
    before or after its Erf branch, and the site is met at whichever comes first. That first node may
    read x as any operand (`Mul(0.5, x)`), so every computed input is tried as the kernel's x.
    """
    for x in dict.fromkeys(i for i in node.input if i and not index.is_const(i)):
        for found in (layernorm.match_from(index, x), layernorm_moments.match_from(index, x),
                      gelu.match_from(index, x), softmax.match_from(index, x)):
            if isinstance(found, Match) and not found.shared(index) and _first_in_graph(index, found) is node:
                return found
        for kernel in (silu.KERNEL, hardswish.KERNEL):
            found = fused_activation.decomposed(kernel, index, x)
            if isinstance(found, Match) and _first_in_graph(index, found) is node:
                return found
    return None


def _graph_position(index: GraphIndex, node: onnx.NodeProto) -> int:
    return index.producer.get(node.output[0], len(index.nodes)) if node.output else len(index.nodes)


def _first_in_graph(index: GraphIndex, found: Match) -> onnx.NodeProto:
    """The node of a match that comes first in the (topologically sorted) graph."""
    return min(found.nodes, key=lambda n: _graph_position(index, n))


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
    sensitive = bool(op_types & SENSITIVE_OPS) or any(lbl.startswith(SENSITIVE_KERNELS) for lbl in labels)
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
