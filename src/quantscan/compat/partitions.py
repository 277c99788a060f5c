"""Colour nodes NPU/CPU for one profile and find the islands and the bytes crossing between them.

Colouring: a live node is CPU when a finding forces it there (unsupported op, limit, dtype...) or
when it belongs to a shape chain that survives constant folding; otherwise NPU. Nodes removed by
constant folding (constants, shape chains that fold once dims are fixed) are not kernels: they join
no island and are reported as `npu` (compiled away) in node_placement. Identity/Dropout take their
producer's colour.

Islands are the connected groups of same-colour nodes (edges = tensors). Bytes crossing = size of
each tensor produced in one island and consumed in another, counted once per consuming island, at
the element type the ONNX graph gives it (float32 = 4 bytes; an int8 boundary moves a quarter of
that). Shapes come from the view with input dims fixed; a size that is unknown, or that rests on a
dim nobody gave (`ModelViews.guessed`), is not counted: such tensors are counted in bytes_unknown.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from quantscan.compat.analysis import ModelAnalysis
from quantscan.graph.index import IDENTITY_OPS
from quantscan.records import Finding


@dataclass(frozen=True)
class Island:
    id: int
    placement: str
    nodes: tuple[int, ...]
    bytes_in: int
    bytes_out: int
    unknown_in: int
    sources: tuple[int, ...]


@dataclass(frozen=True)
class Partitioning:
    colour: dict[int, str]
    island_of: dict[int, int]
    islands: tuple[Island, ...]


def colour(analysis: ModelAnalysis, findings: Iterable[Finding]) -> dict[int, str]:
    """node index -> "npu"/"cpu" for live nodes (removed nodes are absent)."""
    view = analysis.view
    forced = {f.node for f in findings if f.forces_cpu}
    chain_cpu = {m for c in analysis.chains if not c.folds_after_fix for m in c.members}
    removed = analysis.removed()
    out: dict[int, str] = {}
    for i, node in enumerate(view.nodes):
        if i in removed:
            continue
        if view.names[i] in forced or i in chain_cpu:
            out[i] = "cpu"
        elif node.op_type in IDENTITY_OPS:
            j = view.producer.get(node.input[0]) if node.input else None
            out[i] = out.get(j, "npu") if j is not None else "npu"
        else:
            out[i] = "npu"
    return out


def partition(analysis: ModelAnalysis, colours: dict[int, str]) -> Partitioning:
    view = analysis.view
    parent = {i: i for i in colours}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i in colours:
        for j in view.successors(i):
            if j in colours and colours[j] == colours[i]:
                parent[find(j)] = find(i)
    groups: dict[int, list[int]] = {}
    for i in sorted(colours):
        groups.setdefault(find(i), []).append(i)
    ordered = sorted(groups.values(), key=lambda g: g[0])
    island_of = {i: k for k, g in enumerate(ordered) for i in g}
    islands = tuple(_island(analysis, k, g, colours, island_of) for k, g in enumerate(ordered))
    return Partitioning(colours, island_of, islands)


def _island(
    analysis: ModelAnalysis, k: int, nodes: list[int], colours: dict[int, str], island_of: dict[int, int]
) -> Island:
    view = analysis.view
    bytes_in = bytes_out = unknown = 0
    sources: set[int] = set()
    members = set(nodes)
    seen: set[str] = set()
    for i in nodes:
        for t in view.node_outputs(i):
            dests = {island_of[c] for c in view.consumers.get(t, []) if c in island_of and c not in members}
            size = analysis.loaded.nbytes(t)
            bytes_out += (size or 0) * len(dests)
        for t in view.node_inputs(i):
            j = view.producer.get(t)
            if j is None or j not in island_of or j in members or t in seen:
                continue
            seen.add(t)
            sources.add(island_of[j])
            size = analysis.loaded.nbytes(t)
            bytes_in += size or 0
            unknown += size is None
    return Island(k, colours[nodes[0]], tuple(nodes), bytes_in, bytes_out, unknown, tuple(sorted(sources)))
