"""The bodies of If/Loop/Scan nodes, named by path, and each one as a standalone model a rule can read.

Why: a chip compiler that folds an If (constant condition) or unrolls a Loop compiles the nodes of the
body; an LSTM inside an If branch is as much the chip's problem as one at the top level. Every reader
of bodies (the compat check, freeze-input) walks them through here so a body has one name.

Path names: `<owner>/<attribute>` where owner is the node's stable name (`graph.index.stable_node_names`)
in its own graph, prefixed by the path of the body it sits in: `If_0/then_branch`,
`If_0/then_branch/decoder/If_1/else_branch`. A node inside a body is named `<body path>/<node name>`.

A body as a model: the body's own formal inputs, then every tensor it reads from an enclosing scope as
an extra graph input typed from the enclosing scopes' value infos (constants of the enclosing scopes
become initializers, so weights stay weights). Shapes and types are what onnx shape inference of the
whole model left in the bodies' value infos.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import onnx

from quantscan.graph.index import constant_node_value, is_op, stable_node_names


@dataclass(frozen=True)
class Body:
    """One subgraph: its path name, the path of the node owning it, and the graph itself."""

    path: str
    owner: str
    graph: onnx.GraphProto

    @property
    def top_owner(self) -> str:
        """The top-level node this body hangs under (the first component of the path)."""
        return self.owner.split("/", 1)[0]

    def node_name(self, name: str) -> str:
        return f"{self.path}/{name}"


def node_bodies(node: onnx.NodeProto) -> list[tuple[str, onnx.GraphProto]]:
    """(attribute label, graph) for every subgraph attribute of `node` (GRAPHS entries get `[k]`)."""
    out: list[tuple[str, onnx.GraphProto]] = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            out.append((attr.name, attr.g))
        elif attr.type == onnx.AttributeProto.GRAPHS:
            out.extend((f"{attr.name}[{k}]", g) for k, g in enumerate(attr.graphs))
    return out


def all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every subgraph under it (If/Loop/Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for _, body in node_bodies(node):
            yield from all_graphs(body)


def bodies(graph: onnx.GraphProto, prefix: str = "") -> Iterator[Body]:
    """Every body under `graph`, depth first in node order (an outer body before the ones inside it)."""
    for node, name in zip(graph.node, stable_node_names(list(graph.node)), strict=True):
        owner = f"{prefix}{name}"
        for label, g in node_bodies(node):
            body = Body(f"{owner}/{label}", owner, g)
            yield body
            yield from bodies(g, body.path + "/")


def defined_names(graph: onnx.GraphProto) -> set[str]:
    """Tensors a graph defines itself: formal inputs, initializers and node outputs."""
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    for node in graph.node:
        names.update(o for o in node.output if o)
    return names


def subgraph_defined(node: onnx.NodeProto) -> set[str]:
    """Every tensor defined inside the node's bodies, at any depth."""
    names: set[str] = set()
    for _, g in node_bodies(node):
        names |= defined_names(g)
        for inner in g.node:
            names |= subgraph_defined(inner)
    return names


def outer_reads(graph: onnx.GraphProto) -> list[str]:
    """Tensors `graph` (or a body nested in it) reads without defining: the enclosing scopes supply them."""
    defined = defined_names(graph)
    out: list[str] = []
    for node in graph.node:
        reads = [i for i in node.input if i]
        for _, g in node_bodies(node):
            reads += outer_reads(g)
        out.extend(r for r in reads if r not in defined and r not in out)
    out.extend(o.name for o in graph.output if o.name not in defined and o.name not in out)
    return out


@dataclass(frozen=True)
class Scope:
    """What every scope of a model declares, by tensor name: value infos and constant values."""

    types: Mapping[str, onnx.ValueInfoProto]
    constants: Mapping[str, onnx.TensorProto]


def scope_of(graph: onnx.GraphProto) -> Scope:
    """Value infos and constants of `graph` and of every body in it (names are unique across scopes in
    the models exporters write; a later, inner declaration does not replace an outer one)."""
    types: dict[str, onnx.ValueInfoProto] = {}
    constants: dict[str, onnx.TensorProto] = {}
    _collect(graph, types, constants)
    return Scope(types, constants)


def _collect(
    graph: onnx.GraphProto, types: dict[str, onnx.ValueInfoProto], constants: dict[str, onnx.TensorProto]
) -> None:
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        if vi.type.HasField("tensor_type"):
            types.setdefault(vi.name, vi)
    for t in graph.initializer:
        constants.setdefault(t.name, t)
    for node in graph.node:
        if is_op(node, "Constant") and node.output:
            value = constant_node_value(node)
            if value is not None:
                constants.setdefault(node.output[0], onnx.numpy_helper.from_array(value, node.output[0]))
        for _, g in node_bodies(node):
            _collect(g, types, constants)


def body_model(model: onnx.ModelProto, body: Body, scope: Scope) -> onnx.ModelProto:
    """`body` as a standalone model with the parent's opsets: outer reads become inputs or initializers."""
    graph = onnx.GraphProto()
    graph.CopyFrom(body.graph)
    graph.name = body.path
    have = {i.name for i in graph.input}
    for name in outer_reads(body.graph):
        if name in have:
            continue
        if name in scope.constants:
            graph.initializer.append(scope.constants[name])
        elif name in scope.types:
            graph.input.append(scope.types[name])
        else:
            graph.input.append(onnx.helper.make_empty_tensor_value_info(name))
    for out in graph.output:
        if not out.type.HasField("tensor_type") and out.name in scope.types:
            out.CopyFrom(scope.types[out.name])
    standalone = onnx.helper.make_model(graph, opset_imports=list(model.opset_import))
    standalone.ir_version = model.ir_version
    return standalone


NOT_KERNELS = frozenset({"Constant", "Identity"})


def body_node_count(node: onnx.NodeProto) -> int:
    """Nodes that compute something (not Constant/Identity) inside the node's bodies, at any depth."""
    n = 0
    for _, g in node_bodies(node):
        for inner in g.node:
            n += inner.op_type not in NOT_KERNELS
            n += body_node_count(inner)
    return n


def unquantized_bodies(model: onnx.ModelProto) -> list[tuple[str, int]]:
    """(node name, nodes inside) for every top-level If/Loop/Scan whose bodies compute something: the
    scan places fake quantization in the top-level graph only, so those nodes are not analysed."""
    names = stable_node_names(list(model.graph.node))
    out = []
    for node, name in zip(model.graph.node, names, strict=True):
        count = body_node_count(node)
        if count:
            out.append((name, count))
    return out


NOT_QUANTIZED = NOT_KERNELS | frozenset({
    "Shape", "Size", "Cast", "Equal", "Not", "And", "Or", "Greater", "Less", "GreaterOrEqual", "LessOrEqual",
    "ConstantOfShape", "Range", "NonZero", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice",
    "Gather", "Concat", "Split", "Dropout", "Expand", "Tile", "Pad", "If", "Loop", "Scan",
})  # fmt: skip
"""Nodes no recipe puts a quantization site on: shape arithmetic, control flow, and the ops that move
values without computing new ones (`sites.PASS_THROUGH_OPS`)."""


def quantizable_bodies(model: onnx.ModelProto) -> list[str]:
    """`If_0 (223 nodes)` for every top-level If/Loop/Scan whose bodies hold nodes a scan would quantize
    (an LSTM, a Conv): those stay float, so a scan's figures are of a partly quantized model. Bodies of
    shape tests alone (silero's "squeeze if dim == 1") lose nothing and are left out."""
    names = stable_node_names(list(model.graph.node))
    out = []
    for node, name in zip(model.graph.node, names, strict=True):
        count = sum(_quantizable(g) for _, g in node_bodies(node))
        if count:
            out.append(f"{name} ({count} nodes)")
    return out


def _quantizable(graph: onnx.GraphProto) -> int:
    n = 0
    for node in graph.node:
        n += node.op_type not in NOT_QUANTIZED
        n += sum(_quantizable(g) for _, g in node_bodies(node))
    return n


def unquantized_warning(model: onnx.ModelProto) -> str | None:
    """One line naming the control-flow nodes whose bodies the scan does not quantize, and the way out:
    an If on a setting input folds with a flag; no flag folds a Loop or Scan (a decoder's trip count is
    data), whose body is then float in every figure, as on an NPU, whose compiler leaves control flow to
    the CPU."""
    found = unquantized_bodies(model)
    if not found:
        return None
    listed = ", ".join(f"{name} ({count} nodes)" for name, count in found[:5])
    ops = {n.op_type for n, name in zip(model.graph.node, stable_node_names(list(model.graph.node)), strict=True)
           if name in dict(found)}
    ways = []
    if "If" in ops:
        ways.append("fold an If on a setting input with `--const NAME=VALUE` on the scan, or first with "
                    "`quantscan rewrite MODEL --freeze-input NAME=VALUE`")
    if ops - {"If"}:
        ways.append(f"no flag folds a {'/'.join(sorted(ops - {'If'}))}: every figure is of the model with its body "
                    "float (an NPU runs control flow on the CPU); the top-level sites are measured")
    return (f"not analysed: the nodes inside {listed} stay float (quantscan quantizes the top-level graph, "
            f"not If/Loop/Scan bodies); {'; '.join(ways)}")
