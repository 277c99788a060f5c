"""A read-only view of an ONNX graph that the rules share: names, producers, consumers, shapes.

Node names: ONNX allows empty (and, in practice, duplicate) node names, but every finding must name
a real node. Unnamed nodes are called `<op_type>_<index>` where index is the node's position in
`graph.node` (its topological order in the file); a name that would collide with an existing one
gets `_<k>` appended (k = 1, 2, ...). Duplicated names keep the first occurrence and the later ones
get the same `_<k>` suffix. The scheme only depends on the file, so it is stable across runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

Shape = tuple[int | str | None, ...]

PASS_THROUGH_OPS = frozenset({"Identity", "Dropout"})
SHAPE_SOURCE_OPS = frozenset({"Shape", "Size"})
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})


@dataclass(frozen=True)
class TensorInfo:
    """Element type (onnx TensorProto enum, 0 = unknown) and shape (None = unknown rank)."""

    elem_type: int
    shape: Shape | None

    @property
    def is_static(self) -> bool:
        return self.shape is not None and all(isinstance(d, int) and d >= 0 for d in self.shape)

    def numel(self) -> int | None:
        if not self.is_static or self.shape is None:
            return None
        return int(np.prod([d for d in self.shape if isinstance(d, int)], dtype=np.int64))

    def nbytes(self) -> int | None:
        n = self.numel()
        size = elem_size(self.elem_type)
        return None if n is None or size is None else n * size


def elem_size(elem_type: int) -> int | None:
    """Bytes per element for an onnx element type (None for strings/unknown)."""
    if elem_type in (0, onnx.TensorProto.STRING):
        return None
    try:
        return int(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize)
    except (KeyError, TypeError, ValueError):
        return None


def dtype_name(elem_type: int) -> str:
    """`float32`, `int64`, ... (`unknown` when the type was not inferred)."""
    if elem_type == 0:
        return "unknown"
    try:
        return str(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)))
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(elem_type).lower()


def stable_node_names(nodes: Sequence[onnx.NodeProto]) -> list[str]:
    """Unique, stable names for `nodes` (see the module docstring for the scheme)."""
    taken = {n.name for n in nodes if n.name}
    seen: set[str] = set()
    names: list[str] = []
    for i, node in enumerate(nodes):
        base = node.name or f"{node.op_type}_{i}"
        name = base
        k = 0
        while name in seen or (not node.name and name in taken and name != node.name):
            k += 1
            name = f"{base}_{k}"
        seen.add(name)
        names.append(name)
    return names


def _shape_of(type_proto: onnx.TypeProto) -> TensorInfo:
    if not type_proto.HasField("tensor_type"):
        return TensorInfo(0, None)
    tt = type_proto.tensor_type
    if not tt.HasField("shape"):
        return TensorInfo(tt.elem_type, None)
    dims: list[int | str | None] = []
    for d in tt.shape.dim:
        if d.HasField("dim_value") and d.dim_value >= 0:
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return TensorInfo(tt.elem_type, tuple(dims))


@dataclass
class GraphView:
    """Top-level graph of an (already shape-inferred) model, indexed for the rules.

    Subgraphs of If/Loop/Scan are not descended into: the control-flow rule reports them.
    """

    model: onnx.ModelProto
    names: list[str] = field(init=False)
    producer: dict[str, int] = field(init=False)
    consumers: dict[str, list[int]] = field(init=False)
    tensors: dict[str, TensorInfo] = field(init=False)
    const_protos: dict[str, onnx.TensorProto] = field(init=False)
    const_attrs: dict[str, onnx.AttributeProto] = field(init=False)
    inputs: list[str] = field(init=False)
    outputs: list[str] = field(init=False)

    def __post_init__(self) -> None:
        g = self.model.graph
        self.names = stable_node_names(g.node)
        self.producer, self.consumers = {}, {}
        for i, node in enumerate(g.node):
            for t in node.output:
                if t:
                    self.producer[t] = i
            for t in node.input:
                if t:
                    self.consumers.setdefault(t, []).append(i)
        self.const_protos = {t.name: t for t in g.initializer}
        self.const_attrs = {}
        for node in g.node:
            if node.op_type == "Constant" and node.output and node.attribute:
                self.const_attrs[node.output[0]] = node.attribute[0]
        self.tensors = {}
        for vi in [*g.input, *g.value_info, *g.output]:
            self.tensors[vi.name] = _shape_of(vi.type)
        for t in g.initializer:
            self.tensors[t.name] = TensorInfo(t.data_type, tuple(int(d) for d in t.dims))
        self.inputs = [i.name for i in g.input if i.name not in self.const_protos]
        self.outputs = [o.name for o in g.output]

    @property
    def nodes(self) -> Sequence[onnx.NodeProto]:
        return self.model.graph.node

    def opset(self) -> int:
        """The default-domain opset the model imports (0 when it imports none)."""
        for o in self.model.opset_import:
            if o.domain in ("", "ai.onnx"):
                return int(o.version)
        return 0

    def info(self, tensor: str) -> TensorInfo:
        return self.tensors.get(tensor, TensorInfo(0, None))

    def is_const(self, tensor: str) -> bool:
        """True for initializers and Constant outputs (not for values folding would compute)."""
        return tensor in self.const_protos or tensor in self.const_attrs

    def const_value(self, tensor: str) -> np.ndarray | None:
        """The value of an initializer or Constant output; None if the tensor is computed."""
        if tensor in self.const_protos:
            return numpy_helper.to_array(self.const_protos[tensor])
        attr = self.const_attrs.get(tensor)
        if attr is None:
            return None
        value = onnx.helper.get_attribute_value(attr)
        if isinstance(value, onnx.TensorProto):
            return numpy_helper.to_array(value)
        if isinstance(value, onnx.SparseTensorProto):
            return None
        return np.asarray(value)

    def node_inputs(self, i: int) -> list[str]:
        return [t for t in self.nodes[i].input if t]

    def node_outputs(self, i: int) -> list[str]:
        return [t for t in self.nodes[i].output if t]

    def attr(self, i: int, name: str, default: Any = None) -> Any:
        for a in self.nodes[i].attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def successors(self, i: int) -> list[int]:
        out: list[int] = []
        for t in self.node_outputs(i):
            out.extend(self.consumers.get(t, []))
        return out

    def predecessor(self, tensor: str) -> int | None:
        return self.producer.get(tensor)
