"""The kernels a chip runs, with the sizes a cost model needs: MACs, elementwise work, tensor sizes.

A kernel is a quantization site (`quantscan.sites`, after the profile's fusions) or a live node no site
claims (a Concat, a Transpose, a MaxPool: they pass their input's scale through but still move data).
Nodes constant folding removes (`compat.analysis`) are no kernels. Sites are found on the graph as the
scan's analysis copy has it (`scanning/analysis_copy.py`: Constant weights as initializers, Identity and
Dropout gone, constant subgraphs folded), so the pricer's sites are bisect's and layers.csv's: a Paddle
bias written `Add(conv, Reshape(Constant))` or an `Add -> Identity -> Relu` fuses into its Conv here as
there (ppocr_mobile_v2_cls had 18 such Add kernels the scan did not have). A BatchNormalization right after a
Conv joins the Conv (the converter folds it into the weights). Sizes come from the view with the input
dims fixed; an unknown size counts as zero (said in the estimate's notes).

Pure graph logic over onnx protos: no onnxruntime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx

from quantscan.compat.analysis import ModelAnalysis
from quantscan.graph.index import GraphIndex
from quantscan.sites import ANCHOR_OPS, PARAMETER_INPUTS, Site, find_sites

FREE_OPS = frozenset({"Identity", "Dropout"})
"""Ops a converter removes: no kernel runs."""
RESHAPE_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
"""Free on a feature map with one pixel (after a global pool); elsewhere a re-layout: an NPU stores feature
maps channel-blocked (RKNN's NC1HWC2), so a Reshape that moves pixels into channels moves data."""
MOVEMENT_OPS = frozenset(
    {"Transpose", "Concat", "Split", "Slice", "Gather", "Pad", "Tile", "Expand", "DepthToSpace",
     "SpaceToDepth", "GatherElements", "GatherND", "ScatterND"}
)
"""Ops that only move data: priced by the bytes they read and write."""
ROLES = ("matmul", "elementwise", "movement", "free")
"""matmul: MAC-array work (Conv, Gemm, MatMul); elementwise: per-element work (activations, Add/Mul,
pools, Resize, Softmax...); movement: bytes only; free: a view, no kernel."""


@dataclass(frozen=True)
class Kernel:
    """One kernel and the sizes its time depends on (elements, not bytes: bytes follow its precision)."""

    node: str
    kernel: str
    op: str
    nodes: tuple[str, ...]
    role: str
    site: bool
    """True when it is a quantization site (a layers.csv row); pass-through kernels are not."""
    device: str
    macs: int = 0
    ops: int = 0
    """Elementwise work: the elements the kernel streams (inputs read + output written, `streamed`)."""
    input_elems: tuple[int, ...] = ()
    output_elems: int = 0
    weight_elems: int = 0
    depthwise: bool = False
    cin: int = 0
    """Input channels per group (matmul kernels), 0 when not known."""
    cout: int = 0
    inputs: tuple[str, ...] = ()
    output: str = ""

    def to_json(self) -> dict[str, object]:
        """The compact form benchmarks/cost_zoo_layers.json keeps (names dropped: sizes only)."""
        return {
            "op": self.op, "role": self.role, "site": self.site, "macs": self.macs, "ops": self.ops,
            "in": list(self.input_elems), "out": self.output_elems, "w": self.weight_elems,
            "dw": self.depthwise, "cin": self.cin, "cout": self.cout,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, object], name: str = "", device: str = "npu") -> Kernel:
        return cls(
            node=name, kernel=str(raw["op"]), op=str(raw["op"]), nodes=(name,), role=str(raw["role"]),
            site=bool(raw["site"]), device=device, macs=int(raw["macs"]),  # type: ignore[call-overload]
            ops=int(raw["ops"]), input_elems=tuple(int(x) for x in raw["in"]),  # type: ignore[call-overload,attr-defined]
            output_elems=int(raw["out"]), weight_elems=int(raw["w"]),  # type: ignore[call-overload]
            depthwise=bool(raw["dw"]), cin=int(raw["cin"]), cout=int(raw["cout"]),  # type: ignore[call-overload]
        )


def find_kernels(
    analysis: ModelAnalysis, fused_activations: frozenset[str], placement: Mapping[str, str],
    float16_nodes: frozenset[str] = frozenset(),
) -> list[Kernel]:
    """Every kernel of the model in graph order. `placement`: node name -> "npu"/"cpu" (compat's colouring);
    `float16_nodes`: nodes the toolkit runs in float16 (compat's `float16` rule): no sites, as in the scan."""
    view = analysis.view
    proto = _site_view(view)
    live = set(analysis.live())
    cpu = {n for n, where in placement.items() if where == "cpu"}
    floats = ({t for t, info in view.tensors.items() if info.elem_type in _FLOAT_TYPES} | set(view.initializers)
              | {t.name for t in proto.graph.initializer})
    order = {name: i for i, name in enumerate(view.names)}
    sites = find_sites(proto, float_tensors=floats, original_order=order, fused_activations=fused_activations,
                       cpu_nodes=cpu | set(float16_nodes))
    by_first = {s.nodes[0]: s for s in sites if s.nodes}
    position = {name: i for i, name in enumerate(view.names)}
    claimed = {n for s in sites for n in s.nodes}
    kernels: list[Kernel] = []
    for i in sorted(live):
        name = view.names[i]
        device = placement.get(name, "npu")
        if name in by_first:
            kernels.append(_site_kernel(view, view.nodes[position[name]], by_first[name], device))
        elif name not in claimed:
            kernels.append(_node_kernel(view, i, device))
    return _fold_batchnorm(view, kernels)


_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                          onnx.TensorProto.DOUBLE})


def _named_copy(view: GraphIndex) -> onnx.ModelProto:
    """The fixed view's model with every node named as compat names it (sites are found by name)."""
    proto = onnx.ModelProto()
    assert view.model is not None
    proto.CopyFrom(view.model)
    for node, name in zip(proto.graph.node, view.names, strict=True):
        node.name = name
    return proto


def _site_view(view: GraphIndex) -> onnx.ModelProto:
    """The named copy as the scan's analysis copy sees it (module docstring): node names kept, and the
    tensors downstream of a removed Identity keep their names (cleanup renames the producer's output)."""
    from quantscan.model import constants_to_initializers
    from quantscan.rewrites.cleanup import cleanup

    proto = _named_copy(view)
    constants_to_initializers(proto)
    return cleanup(proto).model


def _numel(view: GraphIndex, tensor: str) -> int:
    n = view.info(tensor).numel() if tensor else None
    return int(n or 0)


def _shape(view: GraphIndex, tensor: str) -> tuple[int, ...] | None:
    info = view.info(tensor)
    if not info.is_static or info.shape is None:
        return None
    return tuple(int(d) for d in info.shape if isinstance(d, int))


def _site_kernel(view: GraphIndex, first: onnx.NodeProto, site: Site, device: str) -> Kernel:
    out = _numel(view, site.output)
    ins = tuple(_numel(view, t) for t in site.inputs)
    weights = sum(_numel(view, t) for t in (site.weight, site.bias) if t)
    if site.op_type in ANCHOR_OPS:
        macs, depthwise, cin, cout = _anchor_work(view, first, out)
        return Kernel(site.node, site.kernel, site.op_type, tuple(site.nodes), "matmul", True, device, macs=macs,
                      input_elems=ins, output_elems=out, weight_elems=weights, depthwise=depthwise, cin=cin,
                      cout=cout, inputs=tuple(site.inputs), output=site.output)
    work = streamed(out, ins)
    return Kernel(site.node, site.kernel, site.op_type, tuple(site.nodes), "elementwise", True, device, ops=work,
                  input_elems=ins, output_elems=out, weight_elems=weights, inputs=tuple(site.inputs),
                  output=site.output)


def _node_kernel(view: GraphIndex, i: int, device: str) -> Kernel:
    node = view.nodes[i]
    params = PARAMETER_INPUTS.get(node.op_type, frozenset())
    inputs = tuple(t for pos, t in enumerate(node.input) if t and pos not in params and not view.is_const(t))
    output = node.output[0] if node.output else ""
    out = sum(_numel(view, t) for t in node.output if t)
    ins = tuple(_numel(view, t) for t in inputs)
    role = _node_role(view, node, out)
    ops = 0 if role != "elementwise" else streamed(out, ins)
    return Kernel(view.names[i], node.op_type, node.op_type, (view.names[i],), role, False, device, ops=ops,
                  input_elems=ins, output_elems=out, inputs=inputs, output=output)


def _node_role(view: GraphIndex, node: onnx.NodeProto, out: int) -> str:
    if node.op_type in FREE_OPS:
        return "free"
    if node.op_type in RESHAPE_OPS:
        return "movement" if _has_pixels(view, node.input[0]) or _has_pixels(view, node.output[0]) else "free"
    return "movement" if node.op_type in MOVEMENT_OPS else "elementwise"


def _has_pixels(view: GraphIndex, tensor: str) -> bool:
    """True for a rank >= 3 tensor with more than one element past its channel axis (a feature map)."""
    shape = _shape(view, tensor)
    return shape is not None and len(shape) >= 3 and int(np.prod(shape[2:])) > 1


def _anchor_work(view: GraphIndex, node: onnx.NodeProto, out: int) -> tuple[int, bool, int, int]:
    """(MACs, depthwise, input channels per group, output channels) of a Conv/ConvTranspose/Gemm/MatMul."""
    w = _shape(view, node.input[1]) if len(node.input) > 1 else None
    a = _shape(view, node.input[0])
    if node.op_type == "Conv" and w is not None and len(w) >= 2:
        group = _attr(node, "group", 1)
        depthwise = group > 1 and w[1] == 1
        return out * int(np.prod(w[1:])), depthwise, int(w[1]), int(w[0])
    if node.op_type == "ConvTranspose" and w is not None and a is not None and len(w) >= 2:
        group = _attr(node, "group", 1)
        return int(np.prod(a)) * int(np.prod(w[1:])), False, int(w[0]) // max(group, 1), int(w[1]) * group
    if node.op_type == "Gemm" and a is not None and len(a) == 2:
        k = a[0] if _attr(node, "transA", 0) else a[1]
        return out * int(k), False, int(k), out // max(a[1 if _attr(node, "transA", 0) else 0], 1)
    if a is not None and a:
        k = a[-1]
        n = w[-1] if w else 0
        return out * int(k), False, int(k), int(n)
    return 0, False, 0, 0


def streamed(out: int, ins: Sequence[int]) -> int:
    """An elementwise kernel's work: every element it streams through the vector unit, each input read and
    the output written. Why not the outputs alone: a binary Add reads twice what a Sigmoid reads, and the
    fit (benchmarks/cost_fit.py) prefers this count on all three Rockchip chips (lower loss on the fitted
    rows, equal or better held-out rank); a pool's window and a decomposed kernel's node count do not
    enter (the same fit did not need them)."""
    return int(sum(ins)) + int(out)


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for a in node.attribute:
        if a.name == name:
            return int(a.i)
    return default


def _fold_batchnorm(view: GraphIndex, kernels: list[Kernel]) -> list[Kernel]:
    """A BatchNormalization reading a Conv kernel's output (its only reader) is folded into the Conv."""
    by_output = {k.output: j for j, k in enumerate(kernels) if k.role == "matmul"}
    result = list(kernels)
    dropped: set[int] = set()
    for i, k in enumerate(kernels):
        j = by_output.get(k.inputs[0]) if k.op == "BatchNormalization" and k.inputs else None
        if j is None or view.use_count(k.inputs[0]) != 1:
            continue
        host = result[j]
        result[j] = replace(host, kernel=host.kernel + "+BatchNormalization", nodes=(*host.nodes, *k.nodes),
                            output=k.output)
        dropped.add(i)
    return [k for i, k in enumerate(result) if i not in dropped]
