"""`opset-down`: lower the default-domain opset (e.g. to 11 or 10 for horizon-x3) where every op allows.

Why: converters such as Horizon's hb_mapper accept opset 10-11 only, and onnx.version_converter has no
down adapters for most ops (Transpose 13, BatchNormalization 15, Pow 15, Constant 12 ...), so the
suggested "convert to opset 11" could not be done. Between most opsets an op's schema changed only by
the types it admits (bfloat16, int8, ...): for the float models a chip runs, the node stays as it is.
Where the signature changed, the node is rewritten to the older spelling (`_ADAPTERS`):

- axes/split moved from attribute to input (Squeeze/Unsqueeze/Split 13, Reduce* 18): the constant
  input goes back into the attribute;
- Clip/Pad took min/max/pads as inputs at 11: back to attributes for 10 (constants only);
- Constant's value_float(s)/value_int(s) (12) become a `value` tensor;
- Softmax/LogSoftmax/Hardmax changed meaning at 13 (one axis vs flatten-to-2D): the same only when the
  axis is the last one, else refused;
- attributes added later with a default (Reshape allowzero, BN training_mode, RNN layout, Shape
  start/end, ArgMax select_last_index, AveragePool dilations, Cast saturate) are dropped when they hold
  the default and refused when not.

A node whose op did not exist at the target (HardSwish before 14, LayerNormalization before 17), a change
at opset 18+ with no adapter, or a node carrying subgraphs (If/Loop/Scan bodies) blocks the conversion:
the pass then changes nothing and the refusal names the op. The runner's proof checks the numbers.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from quantscan.graph.edit import copy_model, get_attr, node_label, prune_unused, unique_name
from quantscan.graph.index import GraphIndex, opset_version
from quantscan.graph.infer import infer_shapes
from quantscan.rewrites.base import Change, Refusal, RewriteResult

REWRITE_ID = "opset-down"
_DEFAULT_DOMAINS = ("", "ai.onnx")
_REDUCE_OPS = (
    "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceSumSquare",
)  # fmt: skip
_TYPE_ONLY_UP_TO = 17
"""Schema changes up to this opset not handled by an adapter are type/doc-only for float tensors; a
later unhandled change is refused (opset 18 moved axes to inputs, 19 added wrap/saturate modes)."""

Adapter = Callable[[onnx.NodeProto, "_Ctx"], str | None]


class _Ctx:
    """What adapters read: constants by name, ranks from shape inference, the orphaned constants."""

    def __init__(self, model: onnx.ModelProto, target: int) -> None:
        self.target = target
        self.index = GraphIndex.of(model)
        try:
            inferred = infer_shapes(model, strict_mode=False)
        except Exception:  # noqa: BLE001 - ranks stay unknown; the adapters that need one refuse
            inferred = model
        self.ranks = {n: len(i.shape) for n, i in GraphIndex.of(inferred).tensors.items() if i.shape is not None}
        self.orphaned: list[str] = []
        # Transposes around a node, keyed by the node's (renamed) output
        self.wrap: dict[str, tuple[onnx.NodeProto, onnx.NodeProto]] = {}
        self.taken = self.index.taken_names()

    def fresh(self, base: str) -> str:
        """A tensor/node name no other uses (Transposes an adapter adds)."""
        name = unique_name(base, self.taken)
        self.taken.add(name)
        return name

    def const_ints(self, name: str) -> list[int] | None:
        value = self.index.constant(name)
        return None if value is None else [int(v) for v in np.asarray(value).reshape(-1)]


def opset_down(model: onnx.ModelProto, target: int) -> RewriteResult:
    """A copy of `model` at default-domain opset `target` (< its own), or unchanged with the blocking refusals."""
    current = opset_version(model)
    out = copy_model(model)
    result = RewriteResult(model=out)
    if target >= current:
        result.refusals.append(Refusal(REWRITE_ID, "", f"model opset {current} is not above the target {target}"))
        return result
    ctx = _Ctx(out, target)
    changed = 0
    for node in out.graph.node:
        if node.domain not in _DEFAULT_DOMAINS:
            continue
        reason = _convert(node, current, ctx)
        if reason is not None:
            result.refusals.append(Refusal(REWRITE_ID, node_label(node), f"{node.op_type}: {reason}"))
        else:
            changed += 1
    if result.refusals:
        result.model = copy_model(model)
        return result
    if ctx.wrap:
        nodes: list[onnx.NodeProto] = []
        for node in out.graph.node:
            before, after = ctx.wrap.get(node.output[0] if node.output else "", (None, None))
            nodes += [n for n in (before, node, after) if n is not None]
        del out.graph.node[:]
        out.graph.node.extend(nodes)
    prune_unused(out.graph, ctx.orphaned)
    for imp in out.opset_import:
        if imp.domain in _DEFAULT_DOMAINS:
            imp.version = target
    result.changes.append(Change(REWRITE_ID, "", f"opset {current} -> {target} ({changed} nodes checked)"))
    return result


def blocking_ops(model: onnx.ModelProto, target: int) -> list[str]:
    """The op types that keep `model` from `target` (empty when opset-down would apply), for findings."""
    return sorted({op for _, op in blocking_nodes(model, target)})


def blocking_nodes(model: onnx.ModelProto, target: int) -> list[tuple[str, str]]:
    """(node label, op type) of every node that keeps `model` from `target`, in graph order."""
    res = opset_down(model, target)
    return [(r.node, r.reason.split(":", 1)[0]) for r in res.refusals if r.node]


def _convert(node: onnx.NodeProto, current: int, ctx: _Ctx) -> str | None:
    """Rewrite one node to its spelling at ctx.target, or say why it cannot be."""
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return "its subgraphs are not down-converted (fold the control flow first)"
    changes = _schema_changes(node.op_type, ctx.target, current)
    if changes is None:
        return f"does not exist at opset {ctx.target}"
    for version in sorted(changes, reverse=True):
        adapter = _ADAPTERS.get((node.op_type, version))
        if adapter is not None:
            reason = adapter(node, ctx)
            if reason is not None:
                return reason
        elif version > _TYPE_ONLY_UP_TO:
            return f"changed at opset {version}; no down-converter for it"
    return _attribute_unknown_at(node, ctx.target)


def _attribute_unknown_at(node: onnx.NodeProto, target: int) -> str | None:
    """An attribute the target opset's schema does not define (RoiAlign's coordinate_transformation_mode,
    added at 16): the lowered model would fail onnx.checker, so the node is refused instead."""
    known = onnx.defs.get_schema(node.op_type, target, "").attributes
    extra = [a.name for a in node.attribute if a.name not in known]
    return f"attribute {extra[0]!r} does not exist at opset {target}" if extra else None


def _schema_changes(op: str, target: int, current: int) -> set[int] | None:
    """The versions in (target, current] at which `op`'s schema changed; None when absent at target."""
    versions: set[int] = set()
    version = current
    while True:
        try:
            schema = onnx.defs.get_schema(op, version, "")
        except onnx.defs.SchemaError:
            return None
        if schema.since_version <= target:
            return versions
        versions.add(schema.since_version)
        version = schema.since_version - 1


# --- adapters (one per schema change whose spelling differs) ----------------------------------------


def _input_to_attr(attr: str, pos: int) -> Adapter:
    """Move a constant int input (axes, split) back into the attribute the older opset read."""

    def adapt(node: onnx.NodeProto, ctx: _Ctx) -> str | None:
        if len(node.input) <= pos or not node.input[pos]:
            return None
        values = ctx.const_ints(node.input[pos])
        if values is None:
            return f"{attr} input {node.input[pos]!r} is computed; older opsets take it as an attribute"
        ctx.orphaned.append(node.input[pos])
        del node.input[pos:]
        node.attribute.append(onnx.helper.make_attribute(attr, values))
        return None

    return adapt


def _drop_default(attr: str, default: object) -> Adapter:
    """Drop an attribute added later when it holds its default value (else the meaning changed)."""

    def adapt(node: onnx.NodeProto, ctx: _Ctx) -> str | None:
        value = get_attr(node, attr, default)
        if value != default:
            return f"{attr}={value!r} has no spelling at opset {ctx.target}"
        kept = [a for a in node.attribute if a.name != attr]
        del node.attribute[:]
        node.attribute.extend(kept)
        return None

    return adapt


def _drop_noop_when_axes_given(node: onnx.NodeProto, ctx: _Ctx) -> str | None:
    """`noop_with_empty_axes` (opset 13/18) only decides what empty or absent axes mean; once constant,
    non-empty axes sit in the attribute (`_input_to_attr` runs first) it changes nothing and is dropped.
    tf2onnx writes noop_with_empty_axes=1 on its ReduceSums (basic-pitch's CQT magnitude)."""
    if get_attr(node, "noop_with_empty_axes", 0) == 1 and not get_attr(node, "axes", None):
        return f"noop_with_empty_axes=1 without axes (an identity) has no spelling at opset {ctx.target}"
    kept = [a for a in node.attribute if a.name != "noop_with_empty_axes"]
    del node.attribute[:]
    node.attribute.extend(kept)
    return None


def _all(*adapters: Adapter) -> Adapter:
    def adapt(node: onnx.NodeProto, ctx: _Ctx) -> str | None:
        for a in adapters:
            reason = a(node, ctx)
            if reason is not None:
                return reason
        return None

    return adapt


def _max_inputs(n: int, what: str) -> Adapter:
    def adapt(node: onnx.NodeProto, ctx: _Ctx) -> str | None:
        if len([i for i in node.input if i]) > n:
            return f"{what} has no spelling at opset {ctx.target}"
        del node.input[n:]
        return None

    return adapt


def _softmax_13(node: onnx.NodeProto, ctx: _Ctx) -> str | None:
    """Before 13 Softmax flattened from `axis` to 2-D: the same as per-axis only for the last axis, so
    another axis is swapped to the end and back (Transpose, Softmax on the last axis, Transpose)."""
    axis = int(get_attr(node, "axis", -1))  # type: ignore[call-overload]
    rank = ctx.ranks.get(node.input[0])
    if axis != -1 and rank is None:
        return f"axis={axis} on an input of unknown rank: before opset 13 it meant flatten-to-2D"
    if rank is not None and axis % rank != rank - 1:
        _swap_to_last(node, axis % rank, rank, ctx)
    kept = [a for a in node.attribute if a.name != "axis"]
    del node.attribute[:]
    node.attribute.extend([*kept, onnx.helper.make_attribute("axis", -1 if rank is None else rank - 1)])
    return None


def _swap_to_last(node: onnx.NodeProto, axis: int, rank: int, ctx: _Ctx) -> None:
    """Wrap `node` in Transposes that move `axis` to the end and back (the swap is its own inverse)."""
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    base = node.name or node.output[0]
    inner_in, inner_out = ctx.fresh(f"{base}/to_last"), ctx.fresh(f"{base}/last")
    before = onnx.helper.make_node("Transpose", [node.input[0]], [inner_in], name=ctx.fresh(f"{base}/Transpose"),
                                   perm=perm)
    after = onnx.helper.make_node("Transpose", [inner_out], [node.output[0]], name=ctx.fresh(f"{base}/Transpose"),
                                  perm=perm)
    node.input[0], node.output[0] = inner_in, inner_out
    ctx.wrap[inner_out] = (before, after)


def _constant_12(node: onnx.NodeProto, ctx: _Ctx) -> str | None:
    """value_float(s)/value_int(s) appeared at 12: write the same value as a `value` tensor."""
    attr = node.attribute[0] if len(node.attribute) == 1 else None
    if attr is None or attr.name in ("value", "sparse_value"):
        return None
    value = onnx.helper.get_attribute_value(attr)
    if attr.name in ("value_float", "value_floats"):
        arr = np.asarray(value, dtype=np.float32)
    elif attr.name in ("value_int", "value_ints"):
        arr = np.asarray(value, dtype=np.int64)
    else:
        return f"{attr.name} has no spelling at opset {ctx.target}"
    del node.attribute[:]
    node.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(arr)))
    return None


def _clip_11(node: onnx.NodeProto, ctx: _Ctx) -> str | None:
    """Clip-11 read min/max from inputs; Clip-6 from attributes (constants only)."""
    attrs = []
    for pos, name in ((1, "min"), (2, "max")):
        if len(node.input) > pos and node.input[pos]:
            value = ctx.index.constant(node.input[pos])
            if value is None or value.size != 1:
                return f"{name} input is computed; opset {ctx.target} takes it as an attribute"
            ctx.orphaned.append(node.input[pos])
            attrs.append(onnx.helper.make_attribute(name, float(value.reshape(()))))
    del node.input[1:]
    node.attribute.extend(attrs)
    return None


def _pad_11(node: onnx.NodeProto, ctx: _Ctx) -> str | None:
    """Pad-11 read pads/constant_value from inputs; Pad-2 from attributes (constants only)."""
    pads = ctx.const_ints(node.input[1]) if len(node.input) > 1 else None
    if pads is None:
        return f"pads input is computed; opset {ctx.target} takes it as an attribute"
    attrs = [onnx.helper.make_attribute("pads", pads)]
    if len(node.input) > 2 and node.input[2]:
        value = ctx.index.constant(node.input[2])
        if value is None:
            return f"constant_value input is computed; opset {ctx.target} takes it as an attribute"
        attrs.append(onnx.helper.make_attribute("value", float(np.asarray(value).reshape(-1)[0])))
        ctx.orphaned.append(node.input[2])
    ctx.orphaned.append(node.input[1])
    del node.input[1:]
    node.attribute.extend(attrs)
    return None


def _resize_13(node: onnx.NodeProto, ctx: _Ctx) -> str | None:
    """Resize-13 may leave roi and scales out (`Resize(x, "", "", sizes)`); Resize-11 requires both inputs,
    an empty tensor meaning "not given" (its spec: "If 'sizes' is needed, the user must set 'scales' to an
    empty tensor"). An empty name where 11 needs a tensor fails the checker, so each becomes one."""
    for pos, what in ((1, "roi"), (2, "scales")):
        if len(node.input) > pos and not node.input[pos]:
            name = ctx.fresh(f"{node.name or node.output[0]}/{what}_empty")
            ctx.index.graph.initializer.append(numpy_helper.from_array(np.zeros(0, np.float32), name=name))
            node.input[pos] = name
    return None


def _refuse(why: str) -> Adapter:
    def adapt(node: onnx.NodeProto, ctx: _Ctx) -> str | None:
        return why

    return adapt


_ADAPTERS: dict[tuple[str, int], Adapter] = {
    ("Squeeze", 13): _input_to_attr("axes", 1),
    ("Unsqueeze", 13): _input_to_attr("axes", 1),
    ("Split", 13): _input_to_attr("split", 1),
    ("Split", 18): _drop_default("num_outputs", None),
    ("ReduceSum", 13): _all(_input_to_attr("axes", 1), _drop_noop_when_axes_given),
    **{(op, 18): _all(_input_to_attr("axes", 1), _drop_noop_when_axes_given) for op in _REDUCE_OPS},
    ("Softmax", 13): _softmax_13,
    ("LogSoftmax", 13): _softmax_13,
    ("Hardmax", 13): _softmax_13,
    ("Constant", 12): _constant_12,
    ("Clip", 11): _clip_11,
    ("Pad", 11): _pad_11,
    ("Pad", 18): _max_inputs(3, "an axes input"),
    ("Pad", 19): lambda node, ctx: _pad_mode(node, ctx),
    ("Resize", 11): _refuse("Resize before opset 11 is a different op (scales only, no modes)"),
    ("Resize", 13): _resize_13,
    ("Resize", 18): _all(
        _drop_default("antialias", 0), _drop_default("axes", None), _drop_default("keep_aspect_ratio_policy", None)
    ),
    ("Resize", 19): lambda node, ctx: _resize_19(node, ctx),
    ("Reshape", 14): _drop_default("allowzero", 0),
    ("BatchNormalization", 14): _all(_drop_default("training_mode", 0), _max_inputs(5, "training outputs")),
    ("LSTM", 14): _drop_default("layout", 0),
    ("GRU", 14): _drop_default("layout", 0),
    ("RNN", 14): _drop_default("layout", 0),
    ("Shape", 15): _all(_drop_default("start", None), _drop_default("end", None)),
    ("ArgMax", 12): _drop_default("select_last_index", 0),
    ("ArgMin", 12): _drop_default("select_last_index", 0),
    ("AveragePool", 19): _drop_default("dilations", None),
    ("Cast", 19): _drop_default("saturate", None),
    ("Dropout", 12): _max_inputs(1, "ratio/training_mode inputs"),
}


def _pad_mode(node: onnx.NodeProto, ctx: _Ctx) -> str | None:
    mode = get_attr(node, "mode", b"constant")
    if mode in (b"wrap", "wrap"):
        return f"mode=wrap has no spelling at opset {ctx.target}"
    return None


def _resize_19(node: onnx.NodeProto, ctx: _Ctx) -> str | None:
    mode = get_attr(node, "coordinate_transformation_mode", b"half_pixel")
    if mode in (b"half_pixel_symmetric", "half_pixel_symmetric"):
        return f"coordinate_transformation_mode=half_pixel_symmetric has no spelling at opset {ctx.target}"
    return None
