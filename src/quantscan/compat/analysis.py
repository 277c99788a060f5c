"""Profile-independent facts about a model, computed once and shared by every profile's rules.

Two kinds of nodes are not kernels a chip runs: nodes constant folding removes (every input is a
constant or computed from constants), and shape computations (Shape/Size and the arithmetic on their
results). A shape chain whose Shape inputs become static once the input dims are fixed folds away
too; one that stays dynamic has to run at inference time, usually on the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from quantscan.compat.loader import ModelViews, load
from quantscan.compat.params import Params, node_params
from quantscan.graph.conditions import Condition, if_conditions
from quantscan.graph.index import SHAPE_SOURCE_OPS, GraphIndex, subgraph_inputs
from quantscan.graph.subgraphs import subgraph_defined
from quantscan.sites import channels_first_tensors

NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)


@dataclass(frozen=True)
class ShapeChain:
    """Connected shape-computing nodes: their Shape roots, all members and the consumers fed."""

    roots: tuple[int, ...]
    members: tuple[int, ...]
    sinks: tuple[int, ...]
    folds_after_fix: bool


@dataclass(frozen=True)
class ModelAnalysis:
    loaded: ModelViews
    foldable: frozenset[int]
    chains: tuple[ShapeChain, ...]
    params: tuple[Params, ...]
    conditions: Mapping[str, Condition] = field(default_factory=dict)
    """Every If's traced condition in the whole model, by path name (`graph.conditions`); a body's
    analysis carries its model's map, since only the whole model knows what an outer tensor reads."""
    path: str = ""
    """The body path prefix of this analysis's node names (`If_0/then_branch/`; "" at the top level)."""
    given_dims: Mapping[tuple[str, int], int] = field(default_factory=dict)
    """Symbolic (input, axis) dims of the whole model the caller sized (`--input-shape`)."""

    def condition(self, name: str) -> Condition | None:
        """The traced condition of the If named `name` in this (sub)graph."""
        return self.conditions.get(self.path + name)

    @property
    def view(self) -> GraphIndex:
        """The view with input dims fixed: shapes, limits and bytes are read here."""
        return self.loaded.fixed

    @property
    def original(self) -> GraphIndex:
        return self.loaded.original

    def chain_of(self) -> dict[int, ShapeChain]:
        return {m: c for c in self.chains for m in c.members}

    def removed(self) -> frozenset[int]:
        """Nodes no chip runs: constant-foldable nodes and shape chains that fold after fixing dims."""
        folded = {m for c in self.chains if c.folds_after_fix for m in c.members}
        return self.foldable | frozenset(folded)

    def live(self) -> list[int]:
        removed = self.removed()
        chain_members = {m for c in self.chains for m in c.members}
        return [i for i in range(len(self.view.nodes)) if i not in removed and i not in chain_members]


def analyse(
    model: onnx.ModelProto | str | Path, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> ModelAnalysis:
    loaded = load(model, input_shapes)
    view = loaded.original
    foldable = _foldable(view)
    chains = _chains(view, loaded.fixed, foldable)
    layout = frozenset(channels_first_tensors(view))
    params = tuple(_given_params(loaded, i, layout) for i in range(len(view.nodes)))
    proto = loaded.original.model
    conditions = if_conditions(proto) if proto is not None else {}
    given = {(f.input, f.axis): f.value for f in loaded.fills if f.from_user}
    return ModelAnalysis(loaded, foldable, chains, params, conditions, given_dims=given)


def _given_params(loaded: ModelViews, i: int, layout: frozenset[str]) -> Params:
    """Node i's parameters minus those resting on a guessed input dim (a global pool's kernel over an
    unsized H x W): a limit finding on a number nobody gave would be invented."""
    params = _safe_params(loaded.fixed, i, layout)
    if loaded.moved is None:
        return params
    moved = _safe_params(loaded.moved, i, layout)
    return {k: v for k, v in params.items() if moved.get(k) == v}


def _safe_params(view: GraphIndex, i: int, layout: frozenset[str]) -> Params:
    """Parameters of node i; an odd node (bad attribute types) yields none rather than a crash."""
    try:
        return node_params(view, i, layout)
    except (TypeError, ValueError, IndexError, KeyError, AttributeError):
        return {}


def _foldable(view: GraphIndex) -> frozenset[int]:
    known: set[str] = set(view.initializers)
    out: set[int] = set()
    for i, node in enumerate(view.nodes):
        if node.op_type in NONDETERMINISTIC or node.domain not in ("", "ai.onnx"):
            continue
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            continue
        if all(t in known for t in view.node_inputs(i)):
            out.add(i)
            known.update(view.node_outputs(i))
    return frozenset(out)


def _shape_nodes(view: GraphIndex, foldable: frozenset[int]) -> set[int]:
    const = {t for i in foldable for t in view.node_outputs(i)} | set(view.initializers)
    derived: set[str] = set()
    members: set[int] = set()
    for i, node in enumerate(view.nodes):
        if i in foldable:
            continue
        # A control-flow node's body reads data too: its outputs are shape values only if those are.
        reads = [*view.node_inputs(i), *sorted(subgraph_inputs(node) - subgraph_defined(node))]
        inputs = [t for t in reads if t not in const]
        if node.op_type in SHAPE_SOURCE_OPS or (inputs and all(t in derived for t in inputs)):
            members.add(i)
            derived.update(view.node_outputs(i))
    return members


def _chains(view: GraphIndex, fixed: GraphIndex, foldable: frozenset[int]) -> tuple[ShapeChain, ...]:
    members = _shape_nodes(view, foldable)
    parent = {m: m for m in members}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for m in members:
        for s in view.successors(m):
            if s in members:
                parent[find(s)] = find(m)
    groups: dict[int, list[int]] = {}
    for m in sorted(members):
        groups.setdefault(find(m), []).append(m)
    chains = []
    for group in groups.values():
        gset = set(group)
        roots = tuple(m for m in group if view.nodes[m].op_type in SHAPE_SOURCE_OPS)
        sinks = sorted({s for m in group for s in view.successors(m) if s not in gset})
        folds = all(fixed.info(view.node_inputs(r)[0]).is_static for r in roots if view.node_inputs(r))
        chains.append(ShapeChain(roots, tuple(group), tuple(sinks), folds))
    return tuple(chains)
