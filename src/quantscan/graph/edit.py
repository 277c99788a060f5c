"""Graph editing helpers shared by the rewrite passes: fresh names, attributes, splicing, pruning.

Kept here so each pass stays one rule: making fresh names, adding initializers the way the model's IR
version wants them, replacing node ranges in one splice, and dropping constants a pass orphaned. Reading
the graph (producers, consumers, constants) is `quantscan.graph.index`'s job.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from quantscan.graph.index import GraphIndex, opset_version
from quantscan.graph.infer import infer_shapes


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A deep copy: passes edit the copy so the caller's model is never mutated."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def copy_without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every field of `model` copied except the main graph's initializers (left empty).

    Why: a protobuf message frees its memory only as a whole (onnx's upb protobuf allocates a
    message's fields in one arena), so a deep copy whose initializers are then deleted or pruned
    keeps every deleted weight alive until the copy itself goes. Graph builders that keep only some
    initializers copy the rest of the model with this and add the ones they keep.
    """
    out = onnx.ModelProto()
    copy_fields(model, out, skip="graph")
    copy_fields(model.graph, out.graph, skip="initializer")
    return out


def copy_fields(source: Any, target: Any, *, skip: str) -> None:
    """Copy every set field of a protobuf message but one (`skip`), without touching that one."""
    for field_desc, value in source.ListFields():
        if field_desc.name == skip:
            continue
        repeated = getattr(field_desc, "is_repeated", None)  # protobuf >= 5.28; `label` before
        if repeated if repeated is not None else field_desc.label == field_desc.LABEL_REPEATED:
            getattr(target, field_desc.name).extend(value)
        elif field_desc.message_type is not None:
            getattr(target, field_desc.name).CopyFrom(value)
        else:
            setattr(target, field_desc.name, value)


def node_label(node: onnx.NodeProto) -> str:
    """The node's name, or `<op_type>:<first output>` for the many exporters that leave names empty."""
    if node.name:
        return node.name
    return f"{node.op_type}:{node.output[0] if node.output else '?'}"


def unique_name(base: str, taken: set[str]) -> str:
    """`base`, or `base_1`, `base_2`... whichever is free; the result is added to `taken`."""
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def make_constant_node(name: str, value: np.ndarray, node_name: str) -> onnx.NodeProto:
    """A Constant node producing `value` as tensor `name`."""
    return onnx.helper.make_node(
        "Constant", [], [name], name=node_name, value=numpy_helper.from_array(value, name=name)
    )


def prune_unused(graph: onnx.GraphProto, candidates: Iterable[str]) -> list[str]:
    """Remove the candidate initializers / Constant nodes nobody reads any more; returns removed names.

    Only candidates are considered (tensors the pass itself orphaned), so a pass never deletes dead
    weights that were already in the user's model: that is `cleanup`'s job.
    """
    index = GraphIndex(graph)
    dead = {c for c in candidates if index.use_count(c) == 0}
    removed: list[str] = []
    keep_init = []
    for t in graph.initializer:
        if t.name in dead and t.name not in index.graph_input_names:
            removed.append(t.name)
        else:
            keep_init.append(t)
    if len(keep_init) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(keep_init)
    keep_nodes = []
    for n in graph.node:
        if n.op_type == "Constant" and n.output[0] in dead:
            removed.append(n.output[0])
        else:
            keep_nodes.append(n)
    if len(keep_nodes) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep_nodes)
    drop_vi = set(removed)
    if drop_vi:
        kept_vi = [v for v in graph.value_info if v.name not in drop_vi]
        del graph.value_info[:]
        graph.value_info.extend(kept_vi)
    return removed


def drop_value_info(graph: onnx.GraphProto, names: Iterable[str]) -> None:
    """Forget stale shape annotations for tensors that no longer exist (or changed meaning)."""
    drop = set(names)
    kept = [v for v in graph.value_info if v.name not in drop]
    del graph.value_info[:]
    graph.value_info.extend(kept)


def get_attr(node: onnx.NodeProto, name: str, default: object = None) -> object:
    """An attribute's Python value, or `default` when the node does not set it."""
    for attr in node.attribute:
        if attr.name == name:
            return onnx.helper.get_attribute_value(attr)
    return default


def set_attr(node: onnx.NodeProto, name: str, value: object) -> None:
    """Replace (or add) one attribute."""
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept)
    node.attribute.append(onnx.helper.make_attribute(name, value))


def add_initializer(model: onnx.ModelProto, name: str, value: np.ndarray) -> None:
    """Append an initializer (also declared as a graph input before IR 4, where that was required)."""
    model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name=name))
    if model.ir_version < 4:
        model.graph.input.append(
            onnx.helper.make_tensor_value_info(
                name, onnx.helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype), list(np.shape(value))
            )
        )


def elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor shape inference can type (inputs, outputs, initializers, values)."""
    try:
        inferred = infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - a model inference cannot type still gets the declared types
        inferred = model
    g = inferred.graph
    types = {t.name: t.data_type for t in g.initializer}
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type.tensor_type.elem_type
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    types[n.output[0]] = a.t.data_type
    return types


def np_dtype(elem_type: int | None) -> np.dtype:
    """numpy dtype for an ONNX element type (float32 when unknown)."""
    if not elem_type:
        return np.dtype(np.float32)
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def splice(graph: onnx.GraphProto, remove: set[int], insert_before: dict[int, list[onnx.NodeProto]]) -> None:
    """Rebuild the node list: drop nodes at `remove` positions, insert new nodes before given positions.

    Passes compute positions on the original list and edit once at the end, so a topological order
    stays topological as long as each replacement goes where the last node it replaces was.
    """
    nodes: list[onnx.NodeProto] = []
    for k, n in enumerate(graph.node):
        nodes.extend(insert_before.get(k, []))
        if k not in remove:
            nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)


def clip_nodes(
    model: onnx.ModelProto,
    x: str,
    y: str,
    lo: float,
    hi: float,
    dtype: np.dtype,
    name: str,
    taken: set[str],
) -> list[onnx.NodeProto]:
    """Clip(x, lo, hi) -> y in the form the model's opset takes (attributes before 11, inputs since)."""
    if opset_version(model) < 11:
        return [onnx.helper.make_node("Clip", [x], [y], name=name, min=float(lo), max=float(hi))]
    lo_name = unique_name(f"{name}_min", taken)
    hi_name = unique_name(f"{name}_max", taken)
    add_initializer(model, lo_name, np.array(lo, dtype=dtype))
    add_initializer(model, hi_name, np.array(hi, dtype=dtype))
    return [onnx.helper.make_node("Clip", [x, lo_name, hi_name], [y], name=name)]


def scalar_input(model: onnx.ModelProto, base: str, value: float, dtype: np.dtype, taken: set[str]) -> str:
    """A new scalar initializer; returns its name."""
    name = unique_name(base, taken)
    add_initializer(model, name, np.array(value, dtype=dtype))
    return name


def attr_int(node: onnx.NodeProto, name: str, default: int) -> int:
    """An INT attribute, or `default`."""
    for attr in node.attribute:
        if attr.name == name:
            return int(attr.i)
    return default


def attr_float(node: onnx.NodeProto, name: str, default: float) -> float:
    """A FLOAT attribute, or `default`."""
    for attr in node.attribute:
        if attr.name == name:
            return float(attr.f)
    return default


class Replacements:
    """Matched node groups, each replaced by new nodes where its last node stood, edited in one splice.

    Why one place: every fusing rewrite (HardSwish, GELU's tanh form, LayerNorm, Softmax) edits so:
    positions taken on the original node list, one `splice` at the end (a topological order stays
    topological), then the constants only the removed nodes read are pruned."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self._position = {n.output[0]: k for k, n in enumerate(graph.node) if n.output}
        self._remove: set[int] = set()
        self._insert: dict[int, list[onnx.NodeProto]] = {}
        self._orphans: set[str] = set()

    def overlaps(self, old: Iterable[onnx.NodeProto]) -> bool:
        """True when a node of `old` is already replaced by an earlier group."""
        return any(self._position[n.output[0]] in self._remove for n in old)

    def replace(self, old: Iterable[onnx.NodeProto], new: list[onnx.NodeProto], keep: str) -> None:
        """`old` goes, `new` takes the place of its last node; the inputs of `old` other than `keep` (the
        data input the new nodes read) are pruned if nothing else reads them."""
        old = list(old)
        positions = [self._position[n.output[0]] for n in old]
        self._remove.update(positions)
        self._insert[max(positions)] = new
        self._orphans.update(i for n in old for i in n.input if i != keep)

    def apply(self) -> None:
        if self._remove:
            splice(self.graph, self._remove, self._insert)
            prune_unused(self.graph, self._orphans)
