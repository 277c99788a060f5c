"""The folding fix-dim and freeze-input share: Shape/Size of statically shaped tensors to constants, Ifs on
constant conditions to the branch they take, constants folded, until nothing changes.

Why its own module: freeze-input folds what a frozen setting decides, fix-dim what a fixed size decides,
and `check` asks fix-dim what onnxruntime would be given once a later freeze-input ran. With the folding
inside one of them, the two imported each other (closed only by imports inside functions).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx

from quantscan.graph.edit import (
    add_initializer,
    attr_int,
    drop_value_info,
    make_constant_node,
    node_label,
    prune_unused,
    splice,
)
from quantscan.graph.fold import fold_constants
from quantscan.graph.index import GraphIndex, is_op, opset_version
from quantscan.graph.infer import infer_shapes
from quantscan.graph.subgraphs import defined_names, node_bodies
from quantscan.rewrites.base import Change, Refusal, RewriteResult

SHAPE_ROUNDS = 32
"""Rounds of Shape-to-constant and constant folding (each round can make more shapes static)."""
DECIDE_ROUNDS = 16
"""Rounds of the whole fold (constants, decided Ifs, static shapes) in `fold_decided`."""


def is_static_dim(dim: onnx.TensorShapeProto.Dimension) -> bool:
    """A dimension with a known positive size (0 or a symbolic name is not one a converter can use)."""
    return dim.HasField("dim_value") and dim.dim_value > 0


def fold_decided(model: onnx.ModelProto, result: RewriteResult, rewrite_id: str) -> None:
    """Fold constants, Shapes of static tensors and Ifs on constant conditions until nothing changes (in
    place). Shared with fix-dim: fixing a size decides the Ifs that test it, as freezing a setting does."""
    for _ in range(DECIDE_ROUNDS):
        before = len(result.changes)
        for label in fold_constants(model):
            result.changes.append(Change(rewrite_id, label, "folded to a constant"))
        _inline_constant_ifs(model, result, rewrite_id)
        fold_static_shapes(model, result, rewrite_id)
        if len(result.changes) == before:
            break


def fold_static_shapes(model: onnx.ModelProto, result: RewriteResult, rewrite_id: str) -> None:
    """Replace Shape/Size of static tensors by constants and fold what follows, until a fixpoint (in
    place; changes and the Shape ops left dynamic are recorded in `result` under `rewrite_id`)."""
    opset = opset_version(model)
    for _ in range(SHAPE_ROUNDS):
        graph = model.graph
        index = GraphIndex(graph, ir_version=model.ir_version)
        shapes = _static_shapes(model)
        remove: set[int] = set()
        insert: dict[int, list[onnx.NodeProto]] = {}
        replaced: list[str] = []
        for pos, node in enumerate(graph.node):
            if node.op_type not in ("Shape", "Size") or node.domain not in ("", "ai.onnx"):
                continue
            shape = shapes.get(node.input[0])
            if shape is None:
                continue
            if node.op_type == "Size":
                value = np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
            else:
                start, end = 0, len(shape)
                if opset >= 15:
                    start = attr_int(node, "start", 0)
                    end = attr_int(node, "end", len(shape))
                value = np.array(shape[slice(start, end)], dtype=np.int64)
            name = node.output[0]
            if name in index.graph_outputs:
                insert[pos] = [make_constant_node(name, value, f"{name}_static")]
            else:
                add_initializer(model, name, value)
            remove.add(pos)
            replaced.append(name)
            result.changes.append(
                Change(rewrite_id, node_label(node), f"{node.op_type} of static tensor -> {value.tolist()}")
            )
        if remove:
            splice(graph, remove, insert)
            drop_value_info(graph, replaced)
        folded = fold_constants(model)
        for label in folded:
            result.changes.append(Change(rewrite_id, label, "shape computation folded to a constant"))
        if not remove and not folded:
            break
    index = GraphIndex(model.graph, ir_version=model.ir_version)
    for node in model.graph.node:
        if node.op_type in ("Shape", "Size") and index.use_count(node.output[0]):
            result.refusals.append(
                Refusal(rewrite_id, node_label(node), f"{node.input[0]!r} still has a dynamic shape")
            )
def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    """Fully static shapes shape inference can prove (with data propagation through shape chains)."""
    try:
        inferred = infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - no inference means nothing provably static
        return {}
    g = inferred.graph
    shapes: dict[str, list[int]] = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        if (
            vi.type.HasField("tensor_type")
            and tt.HasField("shape")
            and all(is_static_dim(d) for d in tt.shape.dim)
        ):
            shapes[vi.name] = [int(d.dim_value) for d in tt.shape.dim]
    for t in g.initializer:
        shapes[t.name] = list(t.dims)
    return shapes


def all_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name used anywhere in `graph`, its bodies included (new names must avoid them all)."""
    names = {i.name for i in graph.input} | {o.name for o in graph.output} | {t.name for t in graph.initializer}
    names |= {v.name for v in graph.value_info}
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
        for _, g in node_bodies(node):
            names |= all_names(g)
    names.discard("")
    return names


def _names_besides(graph: onnx.GraphProto, pos: int) -> set[str]:
    """Every name in `graph` (bodies included) except the ones only node `pos` and its bodies use."""
    others = onnx.GraphProto()
    others.CopyFrom(graph)
    del others.node[pos]
    return all_names(others) | set(graph.node[pos].input) | set(graph.node[pos].output)


def _inline_constant_ifs(model: onnx.ModelProto, result: RewriteResult, rewrite_id: str) -> None:
    """Replace each top-level If whose condition is constant by the nodes of the branch it takes."""
    graph = model.graph
    index = GraphIndex(graph, ir_version=model.ir_version)
    remove: set[int] = set()
    insert: dict[int, list[onnx.NodeProto]] = {}
    orphans: set[str] = set()
    introduced: set[str] = set()
    for pos, node in enumerate(graph.node):
        if not is_op(node, "If") or not node.input:
            continue
        cond = index.constant(node.input[0])
        if cond is None or cond.size != 1:
            continue
        taken_branch = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
        branch = dict(node_bodies(node))[taken_branch]
        outer = _names_besides(graph, pos) | introduced
        insert[pos] = _inlined(model, branch, list(node.output), outer)
        introduced |= {o for n in insert[pos] for o in n.output} | {t.name for t in model.graph.initializer}
        remove.add(pos)
        orphans.add(node.input[0])
        result.changes.append(
            Change(rewrite_id, node_label(node),
                   f"If on a constant condition ({bool(cond.reshape(-1)[0])}): {taken_branch} inlined, "
                   f"{len(branch.node)} nodes")
        )
    if remove:
        splice(graph, remove, insert)
        prune_unused(graph, orphans)


def _inlined(
    model: onnx.ModelProto, branch: onnx.GraphProto, if_outputs: list[str], outer: set[str]
) -> list[onnx.NodeProto]:
    """The branch's nodes ready for the outer graph: its outputs renamed to the If's, clashing names made
    unique, its initializers and value infos moved out; an Identity where a branch output is not produced
    by one of its own nodes (an outer tensor or a constant passed through)."""
    produced = {o for n in branch.node for o in n.output if o}
    out_names = [o.name for o in branch.output]
    rename: dict[str, str] = {}
    for src, dst in zip(out_names, if_outputs, strict=True):
        if dst and src in produced and out_names.count(src) == 1:
            rename[src] = dst
    taken = set(outer) | set(if_outputs)
    for name in sorted(defined_names(branch) - set(rename)):
        if name in taken:
            k = 1
            while f"{name}__inlined_{k}" in taken:
                k += 1
            rename[name] = f"{name}__inlined_{k}"
            taken.add(rename[name])
    nodes: list[onnx.NodeProto] = []
    for n in branch.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(n)
        _rename(copy, rename)
        nodes.append(copy)
    for t in branch.initializer:
        value = onnx.numpy_helper.to_array(t)
        add_initializer(model, rename.get(t.name, t.name), value)
    for vi in branch.value_info:
        moved = onnx.ValueInfoProto()
        moved.CopyFrom(vi)
        moved.name = rename.get(vi.name, vi.name)
        model.graph.value_info.append(moved)
    drop_value_info(model.graph, [])
    for src, dst in zip(out_names, if_outputs, strict=True):
        if dst and rename.get(src) != dst:
            nodes.append(onnx.helper.make_node("Identity", [rename.get(src, src)], [dst], name=f"{dst}_inlined"))
    return nodes


def _rename(node: onnx.NodeProto, rename: Mapping[str, str]) -> None:
    """Apply `rename` to a node's inputs and outputs, and to what its bodies read from outside them."""
    for k, name in enumerate(node.input):
        node.input[k] = rename.get(name, name)
    for k, name in enumerate(node.output):
        node.output[k] = rename.get(name, name)
    for _, g in node_bodies(node):
        inner = {k: v for k, v in rename.items() if k not in defined_names(g)}
        for n in g.node:
            _rename(n, inner)
        for o in g.output:
            o.name = inner.get(o.name, o.name)
