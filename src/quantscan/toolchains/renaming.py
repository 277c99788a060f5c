"""Vendor layer names back to ONNX: one renaming table per toolchain, and the two ways it is read.

The tools do not print ONNX node names consistently. RKNN's layer table names the node
(`Conv:Conv.0`) but its accuracy table names the output tensor, and both carry the names of nodes
its passes made (`MatMul.0#2`, `GlobalAveragePool.0_2conv0`, `Add.9-rs_sw`, `..._rs`,
`x_int8`, `..._sw__cvt_int8_float16`). tpu-mlir names each op by its output tensor and op
type (`/text_model/Flatten_output_0_Flatten`, `1197_MatMul`, outputs `..._f32`). hb_mapper keeps
ONNX node names but adds its own (`UNIT_CONV_FOR_<Add>`, `HZ_PREPROCESS_FOR_<input>`,
`<tensor>_calibrated_Requantize`, `<node>_reshape_output`) and cuts long names from the left
(`...ge1.0/nonlinearity/Relu`). Each renaming is one `Rename` in its toolchain's table
(`toolchains/<tool>/kit.py` `RENAMES`, reached through `TOOLCHAINS`), and this module maps names with
them (tpu-mlir's log reads its op type off the same two rules):

* `NameMapper` (`log`, `dumps`): every rule tried on what the previous ones left, breadth first, so
  `mapped_by` can say which conventions matched; a name no rule explains stays unmapped (and the
  command says so) instead of being guessed. It also finds nodes, weights, inputs and truncated names.
* `onnx_name` (`vendor`, the hybrid-quantization names): a tool's suffixes stripped one at a time, the
  longest first, until an ONNX tensor or node name is left (`suffix_pattern` makes the one regex).

Why one module: the two used to hold two tables for RKNN's names (`toolchains/align.py`'s regex and
`mapping.py`'s rules) that had drifted apart (`_mm`, `_2ln`, `_Conv<Op>` known to one only).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from quantscan.columns import Col
from quantscan.graph.index import GraphIndex
from quantscan.toolchains.folder import Rename
from quantscan.toolchains.rknn.kit import RENAMES as RKNN_RENAMES

_MAX_RENAMES = 4
_FOLDED_INTO = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


def compiled(rules: Iterable[Rename]) -> tuple[tuple[re.Pattern[str], str], ...]:
    """Each rule as the regex that strips it (anchored at the end, or at the start for a prefix) and its why."""
    return tuple((re.compile(f"^{r.pattern}" if r.prefix else f"{r.pattern}$"), r.why) for r in rules)


def suffix_pattern(rules: Iterable[Rename]) -> re.Pattern[str]:
    """One regex stripping whichever of the rules' suffixes starts first (the longest one at the end)."""
    return re.compile("(" + "|".join(r.pattern for r in rules if not r.prefix) + ")$")


RKNN_SUFFIX = suffix_pattern(RKNN_RENAMES)
"""RKNN's suffixes as one regex: `onnx_name`'s default (vendor.csv and hybrid names are RKNN's)."""


@dataclass(frozen=True)
class GraphNames:
    """The names of the ONNX model the vendor converted: tensor -> producer node, node -> op type."""

    producer: Mapping[str, str]
    op_type: Mapping[str, str]
    outputs: frozenset[str]
    readers: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    """Tensor -> (node, its first output) of every node that reads it (`align.swapped`)."""


@dataclass(frozen=True)
class Mapped:
    """Where a vendor name lands in the ONNX graph; `derived` when suffixes had to be stripped."""

    node: str
    tensor: str
    derived: bool


def onnx_name(name: str, graph: GraphNames, suffix: re.Pattern[str] = RKNN_SUFFIX) -> Mapped | None:
    """The ONNX tensor/node a vendor name stands for, stripping derived-name suffixes one at a time
    (`suffix`: the vendor's own, `suffix_pattern` of its table; RKNN's by default)."""
    current, derived = name, False
    while current:
        if current in graph.producer:
            return Mapped(graph.producer[current], current, derived)
        if current in graph.op_type:
            return Mapped(current, "", derived)
        stripped = suffix.sub("", current)
        if stripped == current:
            return None
        current, derived = stripped, True
    return None


@dataclass(frozen=True)
class NameMatch:
    """Where one vendor name lands in the ONNX graph; `node` empty when it is a graph input or unmapped."""

    layer: str
    node: str = ""
    op_type: str = ""
    tensor: str = ""
    mapped_by: str = "unmapped"
    """"node", "tensor", "input", "weight" (the node reading it), each optionally followed by "; " and the
    renaming rules used, or "unmapped"."""

    @property
    def mapped(self) -> bool:
        return self.mapped_by != "unmapped"


class NameMapper:
    """Answers "which ONNX node is this vendor name?" for one model (one GraphIndex), by the `rules` of
    the toolchains that may have named it (every toolchain's when the tool is not known)."""

    def __init__(self, index: GraphIndex, rules: Iterable[Rename]) -> None:
        self.index = index
        self.rules = compiled(rules)
        self.node_at = {name: i for i, name in enumerate(index.names)}
        self.node_at.update({n.name: i for i, n in enumerate(index.nodes) if n.name and n.name not in self.node_at})

    def match(self, layer: str) -> NameMatch:
        """The first of: the name as given, then the names the renaming rules give, breadth first."""
        truncated = layer.startswith("...")
        frontier: list[tuple[str, tuple[str, ...]]] = [(layer[3:] if truncated else layer, ())]
        seen: set[str] = set()
        for _ in range(_MAX_RENAMES + 1):
            following: list[tuple[str, tuple[str, ...]]] = []
            for name, rules in frontier:
                if name in seen or not name:
                    continue
                seen.add(name)
                found = self._lookup(layer, name, truncated, rules)
                if found is not None:
                    return found
                following.extend((pattern.sub("", name), (*rules, why)) for pattern, why in self.rules
                                 if pattern.search(name))
            frontier = following
        return NameMatch(layer=layer)

    def _lookup(self, layer: str, name: str, truncated: bool, rules: tuple[str, ...]) -> NameMatch | None:
        how = ("; truncated name" if truncated else "") + "".join(f"; {r}" for r in rules)
        node = self._node_named(name, truncated)
        if node is not None:
            return NameMatch(layer, self.index.names[node], self.index.nodes[node].op_type, "", Col.NODE + how)
        tensor = self._tensor_named(name, truncated)
        if tensor is None:
            return None
        if self.index.is_const(tensor) and self.index.consumers.get(tensor):
            reader = self.index.consumers[tensor][0]  # a weight names the node that reads it
            return NameMatch(layer, self.index.names[reader], self.index.nodes[reader].op_type, tensor,
                             "weight" + how)
        if tensor in self.index.graph_inputs:
            return NameMatch(layer, "", "", tensor, "input" + how)
        producer = self._kernel_head(self.index.producer[tensor])
        return NameMatch(layer, self.index.names[producer], self.index.nodes[producer].op_type, tensor,
                         "tensor" + how)

    def _node_named(self, name: str, truncated: bool) -> int | None:
        if not truncated:
            return self.node_at.get(name)
        hits = {i for n, i in self.node_at.items() if n.endswith(name)}
        return hits.pop() if len(hits) == 1 else None

    def _tensor_named(self, name: str, truncated: bool) -> str | None:
        known = self.index.graph_inputs | set(self.index.producer) | set(self.index.initializers)
        if not truncated:
            return name if name in known else None
        hits = [t for t in known if t.endswith(name)]
        return hits[0] if len(hits) == 1 else None

    def _kernel_head(self, position: int) -> int:
        """A BatchNormalization's output names its Conv's kernel: the vendor folded the BN (as sites do)."""
        node = self.index.nodes[position]
        if node.op_type != "BatchNormalization" or not node.input:
            return position
        before = self.index.producer.get(node.input[0])
        if before is not None and self.index.nodes[before].op_type in _FOLDED_INTO:
            return before
        return position
