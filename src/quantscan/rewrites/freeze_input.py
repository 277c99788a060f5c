"""`freeze-input NAME=VALUE`: make a graph input a constant and fold what it decides (Shape, If, Where...).

Why: exporters keep settings as inputs. silero-vad takes its sample rate `sr` and branches on it with
an If whose two bodies each hold the whole network (an LSTM inside); no NPU compiles an If, and a scan
cannot quantize inside one. A deployment runs one sample rate: with `sr` frozen, `Equal(sr, 16000)` is a
constant, the If is replaced by the nodes of the branch it takes, and whatever else becomes constant
folds too (Shape of tensors whose shape is now static, Where on a constant condition, the Ifs nested in
the inlined branch on such conditions), until nothing changes.

The input is removed from the graph and the value becomes an initializer of the input's declared type
and shape (a scalar for `sr`; a symbolic dim must be fixed first with fix-dim). Inlining renames a branch
tensor only when its name is taken in the outer graph; branch outputs keep the If's output names. A Loop
whose trip count becomes constant is left as it is (unrolling is not done here) and listed as refused.
The proof runs the original with the input fed VALUE against the frozen model (`rewrites.pipeline`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from quantscan.errors import UsageError
from quantscan.graph.edit import add_initializer, copy_model, drop_value_info, node_label, prune_unused, splice
from quantscan.graph.fold import fold_constants
from quantscan.graph.index import GraphIndex, is_op, tensor_info
from quantscan.graph.subgraphs import defined_names, node_bodies
from quantscan.rewrites.base import Change, Refusal, RewriteResult
from quantscan.rewrites.fix_dim import fold_static_shapes

REWRITE_ID = "freeze-input"
MAX_ROUNDS = 16


@dataclass(frozen=True)
class FrozenInput:
    """One parsed `--freeze-input NAME=VALUE`."""

    name: str
    value: float


def parse_freeze_spec(text: str) -> FrozenInput:
    """`NAME=VALUE` with VALUE a finite number; UsageError saying what was expected otherwise."""
    name, sep, raw = text.strip().partition("=")
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not sep or not name or not np.isfinite(value):
        raise UsageError(f"--freeze-input: expected NAME=NUMBER, found {text!r}")
    return FrozenInput(name.strip(), value)


def frozen_values(model: onnx.ModelProto, specs: Sequence[str | FrozenInput]) -> dict[str, np.ndarray]:
    """The array each frozen input takes: its declared dtype and static shape, filled with VALUE.

    Raises UsageError for a name that is no graph input, a symbolic dim, or a value the dtype cannot hold.
    """
    inits = {t.name for t in model.graph.initializer}
    declared = {vi.name: vi for vi in model.graph.input if vi.name not in inits}
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        s = parse_freeze_spec(spec) if isinstance(spec, str) else spec
        if s.name not in declared:
            raise UsageError(f"--freeze-input: expected one of the inputs {sorted(declared)}, found {s.name!r}")
        info = tensor_info(declared[s.name].type)
        if info.shape is None or not info.is_static or not info.elem_type:
            raise UsageError(
                f"--freeze-input {s.name}: expected a static shape and a type, found shape "
                f"{list(info.shape) if info.shape is not None else 'unknown'} (fix its dims with --fix-dim first)"
            )
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(info.elem_type))
        value = np.full([int(d) for d in info.shape if isinstance(d, int)], s.value).astype(dtype)
        if not np.all(value.astype(np.float64) == s.value):
            raise UsageError(f"--freeze-input {s.name}: expected a value {dtype} can hold, found {s.value:g}")
        out[s.name] = value
    return out


def freeze_input(model: onnx.ModelProto, specs: Sequence[str | FrozenInput]) -> RewriteResult:
    """Freeze the named inputs to their values and fold the graph they decide; the input is not mutated."""
    values = frozen_values(model, specs)
    out = copy_model(model)
    result = RewriteResult(model=out)
    _replace_inputs(out, values, result)
    fold_decided(out, result, REWRITE_ID)
    result.refusals = [r for r in result.refusals if "still has a dynamic shape" not in r.reason]
    _refuse_constant_loops(out, result)
    return result


def fold_decided(model: onnx.ModelProto, result: RewriteResult, rewrite_id: str) -> None:
    """Fold constants, Shapes of static tensors and Ifs on constant conditions until nothing changes (in
    place). Shared with fix-dim: fixing a size decides the Ifs that test it, as freezing a setting does."""
    for _ in range(MAX_ROUNDS):
        before = len(result.changes)
        for label in fold_constants(model):
            result.changes.append(Change(rewrite_id, label, "folded to a constant"))
        _inline_constant_ifs(model, result, rewrite_id)
        fold_static_shapes(model, result, rewrite_id)
        if len(result.changes) == before:
            break


def _replace_inputs(model: onnx.ModelProto, values: Mapping[str, np.ndarray], result: RewriteResult) -> None:
    kept = [vi for vi in model.graph.input if vi.name not in values]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    for name, value in values.items():
        add_initializer(model, name, value)
        shown = value.reshape(-1)[0].item() if value.size else value.tolist()
        detail = f"input {name!r} frozen to {shown} ({value.dtype}, shape {list(value.shape)})"
        result.changes.append(Change(REWRITE_ID, name, detail))


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


def _inline_constant_ifs(model: onnx.ModelProto, result: RewriteResult, rewrite_id: str = REWRITE_ID) -> None:
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


def _refuse_constant_loops(model: onnx.ModelProto, result: RewriteResult) -> None:
    index = GraphIndex(model.graph, ir_version=model.ir_version)
    for node in model.graph.node:
        if is_op(node, "Loop") and node.input and index.constant(node.input[0]) is not None:
            result.refusals.append(
                Refusal(REWRITE_ID, node_label(node), "Loop with a constant trip count: unrolling is not done here")
            )
