"""One read-only index of an ONNX graph: producers, consumers, constants, tensor types and node names.

Every package that reads a graph (the site grouping, the kernel patterns, the rewrite passes, the
compatibility rules) builds this index once and asks it, so "is this a constant?" and "who reads this
tensor?" have one answer.

Conventions:
- `producer`/`consumers` map a tensor to node *positions* in `graph.node` (explicit inputs only);
  `producer_node`/`readers` return the nodes, and `readers`/`use_count` also count implicit reads from
  inside If/Loop/Scan bodies, so a rewrite never deletes a tensor a subgraph reads.
- A *constant* is an initializer or the output of a default-domain `Constant` node (Paddle exports keep
  weights in Constant nodes). `is_const`/`const_value` answer "does the file store its value";
  `is_constant`/`constant` additionally exclude initializers that are also graph inputs (IR >= 4), whose
  value the user may override at run time, which is what a rewrite must respect; an index built with
  `initializers_are_weights=True` (how a chip compiler reads the file) counts them as constants.
- Node names: ONNX allows empty and duplicate node names, but every finding must name a real node.
  Unnamed nodes are called `<op_type>_<index>` (position in `graph.node`); a name that would collide
  gets `_<k>` appended (k = 1, 2, ...), and later duplicates get the same suffix. The scheme only depends
  on the file, so it is stable across runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

Shape = tuple[int | str | None, ...]

IDENTITY_OPS = frozenset({"Identity", "Dropout"})
"""Ops that hand their input on unchanged at inference time."""
SHAPE_SOURCE_OPS = frozenset({"Shape", "Size"})
CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan"})
DEFAULT_DOMAINS = ("", "ai.onnx")


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


def tensor_info(type_proto: onnx.TypeProto) -> TensorInfo:
    """Element type and shape declared by a value info's type (unknown parts left unknown)."""
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


def constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    """Value of a Constant node for its dense forms (value, value_float(s), value_int(s))."""
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name == "value_float":
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), dtype=np.float32)
        if attr.name == "value_int":
            return np.array(attr.i, dtype=np.int64)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), dtype=np.int64)
    return None


def subgraph_inputs(node: onnx.NodeProto) -> set[str]:
    """Every tensor name read anywhere inside the node's subgraphs (over-approximation of implicit inputs)."""
    names: set[str] = set()
    for attr in node.attribute:
        graphs: list[onnx.GraphProto] = []
        if attr.type == onnx.AttributeProto.GRAPH:
            graphs = [attr.g]
        elif attr.type == onnx.AttributeProto.GRAPHS:
            graphs = list(attr.graphs)
        for g in graphs:
            for n in g.node:
                names.update(i for i in n.input if i)
                names |= subgraph_inputs(n)
            names.update(o.name for o in g.output)
    return names


def opset_version(model: onnx.ModelProto, domain: str = "") -> int:
    """The opset the model imports for `domain` ("" and "ai.onnx" are the same domain; 0 when none)."""
    for imp in model.opset_import:
        if imp.domain == domain or (domain == "" and imp.domain == "ai.onnx"):
            return int(imp.version)
    return 0


def other_input(node: onnx.NodeProto, name: str) -> str | None:
    """For a binary op with `name` as one operand, the other operand."""
    ins = [i for i in node.input if i]
    if len(ins) != 2 or name not in ins:
        return None
    return ins[1] if ins[0] == name else ins[0]


def is_op(node: onnx.NodeProto | None, op: str) -> bool:
    """True when `node` is the default-domain operator `op`."""
    return node is not None and node.op_type == op and node.domain in DEFAULT_DOMAINS


class GraphIndex:
    """Producers, consumers, constants, tensor infos and stable names of one (top-level) graph.

    Built once per reader; the graph must not be edited while an index over it is in use. Subgraphs of
    If/Loop/Scan are not indexed except as implicit reads (see the module docstring).
    """

    def __init__(
        self,
        graph: onnx.GraphProto,
        *,
        ir_version: int = 99,
        model: onnx.ModelProto | None = None,
        float_tensors: set[str] | None = None,
        initializers_are_weights: bool = False,
    ) -> None:
        self.graph = graph
        self.model = model
        self.nodes: list[onnx.NodeProto] = list(graph.node)
        self.float_tensors = float_tensors
        # Before IR 4 every initializer had to be listed as a graph input too: those are weights. A chip
        # compiler (what the site grouping and the compat rules model) treats every initializer as one.
        self.inputs_override = ir_version >= 4 and not initializers_are_weights
        self.initializers: dict[str, onnx.TensorProto] = {t.name: t for t in graph.initializer}
        self.constant_nodes: dict[str, onnx.NodeProto] = {}
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        self.implicit: dict[str, list[int]] = {}
        for idx, node in enumerate(self.nodes):
            for out in node.output:
                if out:
                    self.producer[out] = idx
            for inp in node.input:
                if inp:
                    self.consumers.setdefault(inp, []).append(idx)
            for inp in subgraph_inputs(node):
                self.implicit.setdefault(inp, []).append(idx)
            if is_op(node, "Constant") and node.output:
                self.constant_nodes[node.output[0]] = node
        self.graph_outputs = {o.name for o in graph.output}
        self.graph_input_names = {i.name for i in graph.input}
        self.inputs = [i.name for i in graph.input if i.name not in self.initializers]
        self.outputs = [o.name for o in graph.output]
        self.graph_inputs = set(self.inputs)
        self.names = stable_node_names(self.nodes)
        self.tensors: dict[str, TensorInfo] = {}
        for vi in [*graph.input, *graph.value_info, *graph.output]:
            self.tensors[vi.name] = tensor_info(vi.type)
        for t in graph.initializer:
            self.tensors[t.name] = TensorInfo(t.data_type, tuple(int(d) for d in t.dims))

    @classmethod
    def of(
        cls, model: onnx.ModelProto, *, float_tensors: set[str] | None = None, initializers_are_weights: bool = False
    ) -> GraphIndex:
        """The index of a model's top-level graph, aware of its IR version and opset."""
        return cls(
            model.graph,
            ir_version=model.ir_version,
            model=model,
            float_tensors=float_tensors,
            initializers_are_weights=initializers_are_weights,
        )

    # --- structure -------------------------------------------------------------------------------

    def opset(self) -> int:
        """The default-domain opset the model imports (0 when it imports none or no model was given)."""
        return opset_version(self.model) if self.model is not None else 0

    def producer_node(self, name: str) -> onnx.NodeProto | None:
        """The node writing `name`, or None for graph inputs, constants and unknown names."""
        idx = self.producer.get(name)
        return None if idx is None else self.nodes[idx]

    def users(self, name: str) -> list[onnx.NodeProto]:
        """Nodes reading `name` as an explicit input, in graph order."""
        return [self.nodes[i] for i in self.consumers.get(name, [])]

    def readers(self, name: str) -> list[onnx.NodeProto]:
        """Nodes reading `name`, explicitly or from inside one of their subgraphs."""
        positions = list(self.consumers.get(name, []))
        positions += [i for i in self.implicit.get(name, []) if i not in positions]
        return [self.nodes[i] for i in positions]

    def use_count(self, name: str) -> int:
        """How many nodes read `name` (explicitly or in a subgraph), plus one if it is a graph output."""
        return len(self.readers(name)) + (1 if name in self.graph_outputs else 0)

    def single_user(self, name: str) -> onnx.NodeProto | None:
        """The only consumer of `name`, when it has exactly one and is not a graph output."""
        users = self.consumers.get(name, [])
        if len(users) != 1 or name in self.graph_outputs:
            return None
        return self.nodes[users[0]]

    def successors(self, i: int) -> list[int]:
        """Positions of the nodes reading any output of node i."""
        out: list[int] = []
        for t in self.node_outputs(i):
            out.extend(self.consumers.get(t, []))
        return out

    def predecessor(self, tensor: str) -> int | None:
        return self.producer.get(tensor)

    def node_inputs(self, i: int) -> list[str]:
        return [t for t in self.nodes[i].input if t]

    def node_outputs(self, i: int) -> list[str]:
        return [t for t in self.nodes[i].output if t]

    def attr(self, i: int, name: str, default: Any = None) -> Any:
        """Attribute `name` of node i as a Python value, or `default`."""
        for a in self.nodes[i].attribute:
            if a.name == name:
                return onnx.helper.get_attribute_value(a)
        return default

    def taken_names(self) -> set[str]:
        """Every tensor name in use, to make new names that collide with none."""
        taken = set(self.initializers) | self.graph_input_names | self.graph_outputs
        for node in self.graph.node:
            taken.update(node.input)
            taken.update(node.output)
        taken.update(v.name for v in self.graph.value_info)
        return taken

    # --- values and types --------------------------------------------------------------------------

    def info(self, tensor: str) -> TensorInfo:
        """Declared (or inferred) element type and shape; unknown when nothing declares it."""
        return self.tensors.get(tensor, TensorInfo(0, None))

    def observe_shapes(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """Take the shapes a run observed for tensors nothing declares a shape for. The kernel patterns
        check constants against extents (a mean's 1/C) that exports leave undeclared, and a probe run
        knows them; a declared shape, even a symbolic one, is kept (its symbols say which dims vary)."""
        for name, shape in shapes.items():
            known = self.tensors.get(name)
            if known is None or known.shape is None:
                self.tensors[name] = TensorInfo(known.elem_type if known else 0, tuple(int(d) for d in shape))

    def is_float(self, name: str) -> bool:
        """True when the probe run saw `name` as float (every tensor counts when no probe was given)."""
        if self.float_tensors is None:
            return True
        return name in self.float_tensors

    def is_const(self, name: str) -> bool:
        """True for initializers and Constant outputs (not for values folding would compute)."""
        return name in self.initializers or name in self.constant_nodes

    def const_value(self, name: str) -> np.ndarray | None:
        """The stored value of an initializer or Constant output; None if the tensor is computed."""
        if name in self.initializers:
            return numpy_helper.to_array(self.initializers[name])
        node = self.constant_nodes.get(name)
        return None if node is None else constant_node_value(node)

    def is_constant(self, name: str) -> bool:
        """A constant whose value the user cannot override by feeding a graph input of that name."""
        if name in self.constant_nodes:
            return True
        if name not in self.initializers:
            return False
        return not (self.inputs_override and name in self.graph_input_names)

    def constant(self, name: str) -> np.ndarray | None:
        """The value of a non-overridable constant, or None when `name` is not one."""
        if not name or not self.is_constant(name):
            return None
        return self.const_value(name)

    def scalar(self, name: str) -> float | None:
        """The value of a one-element non-overridable constant, else None."""
        value = self.constant(name)
        return None if value is None or value.size != 1 else float(value.reshape(()))
