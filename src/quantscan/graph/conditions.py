"""What each If's condition is computed from: graph-input values and graph-input dims, across scopes.

Why: an If no chip compiles folds away once its condition is a constant, and what makes it constant
is a flag the user can give: `--freeze-input sr=16000` for a setting input, `--fix-dim` for the input
dims a shape test reads (silero-vad's wheel model squeezes "if dim == 1" on tensors whose sizes come
from the input's batch and length, and from the state's batch). Saying "export with the condition
constant" sends the user back to the exporter; naming the inputs sends them to one rewrite.

How: facts flow forward through the whole model, bodies included (a body reads outer tensors by name).
A fact is ("value", INPUT) or ("dim", INPUT, AXIS) for a symbolic input dim. Per tensor, `values` are
the facts its value depends on and `shape` those its shape depends on:

- Shape/Size of X: its value is X's shape facts (all of them: the folding passes fold a Shape only
  when the whole shape is static, so one static axis does not fold a Gather on it), and so is the
  shape of the result (its length is X's rank, which an If with branches of two ranks decides);
- an op whose output shape reads an input's value (Reshape's shape, Slice's starts, ...), or whose
  output shape depends on its data (NonZero...): those values join the output's shape facts;
- If/Loop/Scan: the outputs carry the condition's value facts and every body output's facts.

It over-approximates (every input of an op counts), so a flag it names may be more than needed, never
less. Comparisons of a setting input with a constant (`Equal(sr, 16000)`) record that constant as the
value the user probably means (the branch it selects).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx

from quantscan.graph.index import SHAPE_SOURCE_OPS, constant_node_value, stable_node_names
from quantscan.graph.subgraphs import node_bodies

Fact = tuple[str, ...]
"""("value", input) or ("dim", input, axis as text)."""

SHAPE_PARAM_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Resize": (1, 2, 3),
    "Upsample": (1,), "Pad": (1, 2, 3), "ConstantOfShape": (0,), "Range": (0, 1, 2), "TopK": (1,),
    "OneHot": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,), "CenterCropPad": (1,),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,), "ReduceProd": (1,),
}  # fmt: skip
"""Inputs whose *values* decide the output's shape."""

DATA_SHAPED = frozenset({"NonZero", "Compress", "Unique", "NonMaxSuppression", "StringSplit"})
"""Ops whose output shape depends on their data values."""

COMPARISONS = frozenset({"Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"})


@dataclass(frozen=True)
class Condition:
    """One If's condition, traced: the setting inputs and symbolic input dims it reads, the large
    inputs whose values it reads (then no flag folds it), and constants settings are compared with."""

    settings: tuple[str, ...]
    dims: tuple[tuple[str, int], ...]
    data: tuple[str, ...]
    compared: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    params: Mapping[tuple[str, int], str] = field(default_factory=dict)
    """The dim_param of each symbolic dim in `dims` that has one (`N`, `sequence`)."""
    batch_like: frozenset[tuple[str, int]] = frozenset()
    """Dims in `dims` that are axis 0 or share their dim_param with some input's symbolic axis 0."""

    @property
    def foldable_by_flags(self) -> bool:
        return not self.data and bool(self.settings or self.dims)


@dataclass
class _Flow:
    values: dict[str, frozenset[Fact]] = field(default_factory=dict)
    shapes: dict[str, frozenset[Fact]] = field(default_factory=dict)
    compared: dict[str, set[float]] = field(default_factory=dict)
    conditions: dict[str, frozenset[Fact]] = field(default_factory=dict)

    def value(self, name: str) -> frozenset[Fact]:
        return self.values.get(name, frozenset())

    def shape(self, name: str) -> frozenset[Fact]:
        return self.shapes.get(name, frozenset())


def if_conditions(model: onnx.ModelProto, small: int = 16) -> dict[str, Condition]:
    """Every If's traced condition, keyed by its path name as `graph.subgraphs.bodies` names it
    (`If_0`, `If_0/then_branch/If_3`). Inputs with at most `small` elements are settings, not data."""
    graph = model.graph
    inits = {t.name for t in graph.initializer}
    flow = _Flow()
    sizes: dict[str, int | None] = {}
    params: dict[tuple[str, int], str] = {}
    for vi in graph.input:
        if vi.name in inits:
            continue
        dims = vi.type.tensor_type.shape.dim
        params.update({(vi.name, k): d.dim_param for k, d in enumerate(dims) if d.dim_param and not d.dim_value})
        flow.values[vi.name] = frozenset({("value", vi.name)})
        flow.shapes[vi.name] = frozenset(("dim", vi.name, str(k)) for k, d in enumerate(dims) if not d.dim_value)
        known = [d.dim_value for d in dims]
        sizes[vi.name] = int(np.prod(known)) if all(known) else None
    _walk(graph, "", flow)
    out: dict[str, Condition] = {}
    for path, facts in flow.conditions.items():
        values = sorted({f[1] for f in facts if f[0] == "value"})
        settings = tuple(v for v in values if sizes.get(v) is not None and sizes[v] <= small)  # type: ignore[operator]
        data = tuple(v for v in values if v not in settings)
        dims = tuple(sorted({(f[1], int(f[2])) for f in facts if f[0] == "dim"}))
        compared = {s: tuple(sorted(flow.compared.get(s, ()))) for s in settings if flow.compared.get(s)}
        batch = {p for (_, axis), p in params.items() if axis == 0}
        like = frozenset(d for d in dims if d[1] == 0 or params.get(d) in batch)
        out[path] = Condition(settings, dims, data, compared, {d: params[d] for d in dims if d in params}, like)
    return out


def _walk(graph: onnx.GraphProto, prefix: str, flow: _Flow) -> None:
    """Propagate facts through `graph`'s nodes in order; record each If's condition under its path."""
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    for node, name in zip(graph.node, stable_node_names(list(graph.node)), strict=True):
        if node.op_type == "Constant":
            value = constant_node_value(node)
            if value is not None and node.output:
                consts[node.output[0]] = value
            continue
        reads = [i for i in node.input if i]
        values = frozenset().union(*(flow.value(i) for i in reads))
        shapes = frozenset().union(*(flow.shape(i) for i in reads))
        if node.op_type in COMPARISONS:
            _record_comparison(node, consts, flow)
        bodies = node_bodies(node)
        if bodies:
            if node.op_type == "If" and reads:
                flow.conditions[f"{prefix}{name}"] = flow.value(node.input[0])
            inner = values | shapes
            for label, body in bodies:
                for vi in body.input:  # Loop/Scan formal inputs: whatever the node feeds in
                    flow.values[vi.name], flow.shapes[vi.name] = inner, inner
                _walk(body, f"{prefix}{name}/{label}/", flow)
                for out in body.output:
                    values |= flow.value(out.name)
                    shapes |= flow.shape(out.name)
            shapes |= flow.value(node.input[0]) if node.op_type == "If" and reads else frozenset()
        elif node.op_type in SHAPE_SOURCE_OPS:  # the value is the shape; its length is the rank (an If
            values = shapes                      # with branches of two ranks makes that a fact too)
        else:
            params = [node.input[k] for k in SHAPE_PARAM_INPUTS.get(node.op_type, ()) if k < len(node.input)]
            if node.op_type in DATA_SHAPED:
                params = reads
            shapes = shapes.union(*(flow.value(p) for p in params if p))
        for out in node.output:
            if out:
                flow.values[out], flow.shapes[out] = values, shapes


def _record_comparison(node: onnx.NodeProto, consts: Mapping[str, np.ndarray], flow: _Flow) -> None:
    """`Equal(sr, 16000)`: remember 16000 for the setting sr (a scalar constant against one setting)."""
    if len(node.input) != 2:
        return
    for this, other in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
        facts = flow.value(this)
        const = consts.get(other)
        if const is None or np.asarray(const).size != 1 or len(facts) != 1:
            continue
        (fact,) = facts
        if fact[0] == "value":
            flow.compared.setdefault(fact[1], set()).add(float(np.asarray(const).reshape(-1)[0]))
