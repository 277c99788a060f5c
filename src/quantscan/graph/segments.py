"""Split an analysis graph into consecutive segments that run as separate sessions.

Why: when even one sample's analysis does not fit the memory budget in one session, the sites are
split into runs of consecutive FP32 nodes; each segment holds those nodes' FP32, cumulative and
isolated copies and their reductions, and reads the tensors earlier segments wrote (FP32 and
cumulative boundary tensors) as graph inputs. The segments compute exactly the nodes of the whole
graph on exactly the same values, so a segmented run gives the same figures as one session.

The split follows graph/schedule.py's keys (the FP32 node each analysis node belongs to): a node
never reads from a later key, so a cut at FP32 position p sends every tensor across in one direction.
Nodes that read only initializers (key -1) are copied into every segment that needs them.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from quantscan.graph.index import subgraph_inputs
from quantscan.graph.schedule import node_keys


@dataclass
class Segment:
    """One segment: its graph (inputs declared when their dtypes are known), what it reads and writes."""

    model: onnx.ModelProto
    inputs: list[str]
    outputs: list[str]


def balanced_cuts(sizes: Sequence[int], segments: int) -> list[int]:
    """FP32 node positions where segments 2.. start, so each holds about the same activation bytes."""
    total = sum(sizes)
    if segments <= 1 or total <= 0 or len(sizes) < 2:
        return []
    cuts: list[int] = []
    running = 0
    for position, size in enumerate(sizes):
        if running >= total * (len(cuts) + 1) / segments and position > (cuts[-1] if cuts else 0):
            cuts.append(position)
            if len(cuts) == segments - 1:
                break
        running += size
    return cuts


def split(model: onnx.ModelProto, fp32_nodes: Sequence[str], cuts: Sequence[int]) -> list[Segment]:
    """The segments of `model` (an analysis graph over `fp32_nodes`), cut before each FP32 position in `cuts`."""
    nodes = list(model.graph.node)
    keys = node_keys(model, fp32_nodes)
    bounds = [0, *sorted(set(cuts))]
    owner = [bisect.bisect_right(bounds, k) - 1 if k >= 0 else -1 for k in keys]
    producer = {o: p for p, n in enumerate(nodes) for o in n.output if o}
    wanted = [o.name for o in model.graph.output]
    members = [[p for p, s in enumerate(owner) if s == j] for j in range(len(bounds))]
    # a reduction of a graph input alone (a model input's site, sites.input_sites) belongs to no FP32 node
    # and no segment reads it: the first segment computes it
    wanted_set = set(wanted)
    members[0] += [p for p, s in enumerate(owner) if s == -1 and any(o in wanted_set for o in nodes[p].output)]
    members = [_with_constants(sorted(set(m)), nodes, producer, owner) for m in members]
    produced = [{o for p in m for o in nodes[p].output if o} for m in members]
    inits = {t.name: t for t in model.graph.initializer}
    known = set(producer) | set(inits) | {i.name for i in model.graph.input}
    reads = [{i for p in m for i in _reads(nodes[p]) if i in known} - produced[j] for j, m in enumerate(members)]
    segments = []
    for j, m in enumerate(members):
        later = set().union(*reads[j + 1:]) if j + 1 < len(reads) else set()
        outputs = [o for o in dict.fromkeys([*wanted, *sorted(later)]) if o in produced[j]]
        inputs = sorted(t for t in reads[j] if t not in inits)
        segments.append(Segment(_graph(model, [nodes[p] for p in m], inits, reads[j], outputs, j), inputs, outputs))
    return segments


def _reads(node: onnx.NodeProto) -> set[str]:
    """A node's inputs, with the outer-scope names its subgraphs (If/Loop/Scan) read."""
    return set(node.input) | subgraph_inputs(node)


def _with_constants(member: list[int], nodes: Sequence[onnx.NodeProto], producer: Mapping[str, int],
                    owner: Sequence[int]) -> list[int]:
    """The segment's nodes plus the initializer-only nodes (key -1) they read, transitively, in order."""
    chosen = set(member)
    stack = [i for p in member for i in _reads(nodes[p])]
    while stack:
        name = stack.pop()
        p = producer.get(name)
        if p is not None and owner[p] == -1 and p not in chosen:
            chosen.add(p)
            stack.extend(_reads(nodes[p]))
    return sorted(chosen)


def _graph(model: onnx.ModelProto, nodes: list[onnx.NodeProto], inits: Mapping[str, onnx.TensorProto],
           reads: Iterable[str], outputs: Sequence[str], j: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, f"{model.graph.name}_segment{j}", [],
        [onnx.ValueInfoProto(name=o) for o in outputs],
        initializer=[inits[t] for t in sorted(set(reads)) if t in inits],
    )
    out = helper.make_model(graph, opset_imports=list(model.opset_import))
    out.ir_version = model.ir_version
    return out


def declare_inputs(segment: Segment, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """The segment's model with its inputs declared from the arrays that will feed it (every dim free)."""
    model = onnx.ModelProto()
    model.CopyFrom(segment.model)
    for name in segment.inputs:
        value = np.asarray(values[name])
        elem = helper.np_dtype_to_tensor_dtype(value.dtype)
        model.graph.input.append(helper.make_tensor_value_info(name, elem, [f"d{i}" for i in range(value.ndim)]))
    return model
