"""What every kernel pattern returns: a `Match` (typed per pattern) or a `NoMatch` with its reason.

A match is structural: it says the nodes compute the kernel. Whether those nodes may be treated as one
(no intermediate tensor read elsewhere) is the caller's question, answered by `Match.shared`: the site
grouping requires none, a rewrite refuses and says which.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import onnx

from quantscan.graph.index import GraphIndex


@dataclass(frozen=True)
class NoMatch:
    """The pattern does not apply here, and why (for tests and refusal messages)."""

    reason: str


@dataclass(frozen=True)
class Match:
    """Nodes computing one kernel from input `x` to tensor `output` (written by the last node)."""

    kernel: str
    x: str
    nodes: tuple[onnx.NodeProto, ...]
    output: str

    def shared(self, index: GraphIndex) -> list[str]:
        """Intermediate tensors also read outside the match (or graph outputs): none for a private match."""
        inside = {id(n) for n in self.nodes}
        found: list[str] = []
        for node in self.nodes:
            for t in node.output:
                if not t or t == self.output:
                    continue
                outside = any(id(r) not in inside for r in index.readers(t))
                if outside or t in index.graph_outputs:
                    found.append(t)
        return found

    def op_types(self) -> str:
        """`Add+Clip+Mul+Div`: the spelling as it appears in kernel labels and change records."""
        return "+".join(n.op_type for n in self.nodes)


M = TypeVar("M", bound=Match)


def near(value: float | None, target: float, rtol: float = 1e-5) -> bool:
    """True when a scalar constant equals `target` up to float32 export rounding."""
    return value is not None and bool(np.isclose(value, target, rtol=rtol))


def nodes_near(index: GraphIndex, x: str, hops: int) -> Iterator[onnx.NodeProto]:
    """Nodes reachable downstream of tensor `x` within `hops` edges, nearest first, each once."""
    seen: set[int] = set()
    frontier = [x]
    for _ in range(hops):
        nxt: list[str] = []
        for t in frontier:
            for pos in index.consumers.get(t, []):
                if pos in seen:
                    continue
                seen.add(pos)
                node = index.nodes[pos]
                yield node
                nxt.extend(o for o in node.output if o)
        frontier = nxt


def match_from(
    index: GraphIndex, x: str, match_at: Callable[[GraphIndex, onnx.NodeProto], M | NoMatch], hops: int, kernel: str
) -> M | NoMatch:
    """The first match anchored near `x` whose input is `x` (how the site grouping asks)."""
    for node in nodes_near(index, x, hops):
        found = match_at(index, node)
        if isinstance(found, Match) and found.x == x:
            return found
    return NoMatch(f"no {kernel} reads {x!r}")
