"""Vendor layer names back to ONNX nodes: by node name, by output tensor, or through a vendor's renaming.

The tools do not print ONNX node names consistently. RKNN's layer table names the node
(`Conv:Conv.0`) but its accuracy table names the output tensor, and both carry the names of nodes
its passes made (`MatMul.0#2`, `GlobalAveragePool.0_2conv0`, `Add.9-rs_sw`, `..._rs`,
`x_int8`, `..._sw__cvt_int8_float16`). tpu-mlir names each op by its output tensor and op
type (`/text_model/Flatten_output_0_Flatten`, `1197_MatMul`, outputs `..._f32`). hb_mapper keeps
ONNX node names but adds its own (`UNIT_CONV_FOR_<Add>`, `HZ_PREPROCESS_FOR_<input>`,
`<tensor>_calibrated_Requantize`, `<node>_reshape_output`) and cuts long names from the left
(`...ge1.0/nonlinearity/Relu`). Each renaming is one rule below, so `mapped_by` can say which
convention matched, and a name no rule explains stays unmapped (and the command says so) instead of
being guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from quantscan.columns import Col
from quantscan.graph.index import GraphIndex

# (pattern, what it undoes): applied repeatedly, each on what the previous ones left.
RENAMES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^UNIT_CONV_FOR_"), "hb_mapper UNIT_CONV_FOR_ prefix"),
    (re.compile(r"^HZ_PREPROCESS_FOR_"), "hb_mapper HZ_PREPROCESS_FOR_ prefix"),
    (re.compile(r"_calibrated_(?:Requantize|pad)$"), "hb_mapper _calibrated_ suffix"),
    (re.compile(r"_Hz(?:Dequantize|Quantize)$"), "hb_mapper quantize-node suffix"),
    (re.compile(r"_(?:pre_)?reshape(?:_output|_\d+)?$"), "hb_mapper reshape suffix"),
    (re.compile(r"__cvt_\w+$"), "RKNN data-convert suffix"),
    (re.compile(r"__float16$"), "RKNN __float16 suffix"),
    (re.compile(r"_(?:int8|float16)$"), "RKNN dtype suffix"),
    (re.compile(r"_sw$"), "RKNN _sw suffix"),
    (re.compile(r"[-_]rs$"), "RKNN reshape suffix"),
    (re.compile(r"_(?:mm_)?tp$"), "RKNN transpose suffix"),
    (re.compile(r"#\d+$"), "RKNN #N suffix"),
    (re.compile(r"_2conv\d*$"), "RKNN _2conv suffix"),
    (re.compile(r"_sdpa$"), "RKNN fused-attention suffix"),
    (re.compile(r"_(?:f32|f16|bf16)$"), "tpu-mlir dtype suffix"),
    (re.compile(r"_[A-Z][A-Za-z0-9]*$"), "tpu-mlir _OpType suffix"),
)
_MAX_RENAMES = 4
_FOLDED_INTO = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})


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
    """Answers "which ONNX node is this vendor name?" for one model (one GraphIndex)."""

    def __init__(self, index: GraphIndex) -> None:
        self.index = index
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
                following.extend((pattern.sub("", name), (*rules, why)) for pattern, why in RENAMES
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
