"""Where a chip quantizes on its own after a float region, and the layers it splits: names a plan must add.

Why: a toolchain's hybrid quantization runs every layer the user did not name at int8. The ops quantscan
does not count as sites (Reshape, Transpose, Concat: they pass their input's scale through) are such
layers too, so after a float16 region RKNN puts its result back to int8 there: PicoDet's eight output
paths (head -> Reshape -> Transpose -> graph output) ran INT8 after a float16 head (issue 38: 0.97088 where
the plan claimed 0.99391, 0.99429 with those tensors named float16 too). The chip profile lists those ops
(`[requantize] ops`, recorded from RKNN's layer tables); `float_tails` gives, per float site, the tensors of
that kind its float output flows into, so an export names them and the chip runs what quantscan simulated
(a float region ends at the next site, which quantizes its input, as the simulation does).

`split_parts`: RKNN runs a Conv whose only reader is a channel Split as one Conv per part, named after the
Split's outputs (PicoDet's head conv `conv2d_153.tmp_0` becomes `split_0.tmp_0` and `split_0.tmp_1`), so the
Conv's own output is no name its hybrid step 2 takes (`Invalid operands name 'conv2d_153.tmp_0'`).

Pure graph logic on (op type, inputs, outputs) per node: no onnxruntime, no toolchain.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

NodeInfo = tuple[str, Sequence[str], Sequence[str]]
"""An ONNX node's op type, inputs and outputs, by node name."""

_SPLIT_PRODUCERS = frozenset({"Conv", "ConvTranspose"})
_NO_DATA = frozenset({"Constant", "ConstantOfShape", "Shape"})
"""Producers of a shape or other constant operand: not a value the float region must reach."""


def _producers(graph: Mapping[str, NodeInfo]) -> dict[str, str]:
    return {t: node for node, (_, _, outs) in graph.items() for t in outs if t}


def _readers(graph: Mapping[str, NodeInfo]) -> dict[str, list[str]]:
    readers: dict[str, list[str]] = {}
    for node, (_, ins, _) in graph.items():
        for t in dict.fromkeys(i for i in ins if i):
            readers.setdefault(t, []).append(node)
    return readers


def split_parts(tensor: str, graph: Mapping[str, NodeInfo]) -> tuple[str, ...]:
    """The outputs of the Split that is a Conv output's only reader (module docstring), else ()."""
    producer = _producers(graph).get(tensor)
    if producer is None or graph[producer][0] not in _SPLIT_PRODUCERS:
        return ()
    readers = _readers(graph).get(tensor, [])
    if len(readers) != 1 or graph[readers[0]][0] != "Split":
        return ()
    return tuple(t for t in graph[readers[0]][2] if t)


def float_tails(float_tensors: Iterable[str], graph: Mapping[str, NodeInfo],
                ops: frozenset[str]) -> dict[str, tuple[str, ...]]:
    """Float tensor -> the outputs of `ops` nodes it flows into whose every data input is float (a float
    site's output, a part of a split float Conv, or another such output), following chains of them
    (Reshape -> Transpose). Each tail output is credited to the first float tensor that reaches it, so
    a name is written once."""
    if not ops:
        return {}
    producer, readers = _producers(graph), _readers(graph)
    start = list(dict.fromkeys(float_tensors))
    owner = {t: t for t in start}
    tails: dict[str, list[str]] = {t: [] for t in start}
    frontier = list(start)
    while frontier:
        tensor = frontier.pop(0)
        for node in readers.get(tensor, []):
            op, ins, outs = graph[node]
            if op not in ops or any(o in owner for o in outs if o):
                continue
            data = [i for i in ins if i and graph.get(producer.get(i, ""), ("",))[0] not in _NO_DATA
                    and i in producer]
            if not all(i in owner for i in data):
                continue
            for out in (o for o in outs if o):
                owner[out] = owner[tensor]
                tails[owner[tensor]].append(out)
                frontier.append(out)
    return {t: tuple(v) for t, v in tails.items() if v}
