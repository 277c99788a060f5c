"""What a plan export reads besides the plan (`records.Plan`), in a module bisect/ and toolchains/ both import.

Why: each toolchain's plan file is written in its own folder (`toolchains/<tool>/export.py`, listed by
`ToolchainFolder.exports`) and bisect writes them all through `toolchains.TOOLCHAINS`; the writers need the
user's model as names and the names the toolchain that ran keeps, so those are plain records here, not
bisect's types. `PlanExport` is one file a plan is written as; `ExportInputs` is what its writer reads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantscan.graph.requantize import NodeInfo
from quantscan.records import Plan, PlanSite, Precision

if TYPE_CHECKING:
    import onnx

__all__ = ["ExportInputs", "ModelNodes", "NodeInfo", "PlanExport", "float_nodes", "unique"]


def unique(items: Iterable[str]) -> list[str]:
    """The non-empty names of `items`, each once, in order."""
    return list(dict.fromkeys(i for i in items if i))


def float_nodes(plan: Plan) -> list[str]:
    """The user-model node names of every float site, each once."""
    return unique(n for s in plan.sites_at(Precision.FLOAT) for n in s.node_names)


@dataclass(frozen=True)
class ModelNodes:
    """What the chip exports read of the user's model: nodes in graph order, constants, depthwise convs.

    Built once from the model the plan was measured on (node names as quantscan's loader gives them)."""

    nodes: Mapping[str, NodeInfo]
    constants: frozenset[str]
    depthwise: frozenset[str]

    @classmethod
    def of(cls, proto: onnx.ModelProto) -> ModelNodes:
        shapes = {t.name: list(t.dims) for t in proto.graph.initializer}
        constants = set(shapes)
        constants |= {o for n in proto.graph.node if n.op_type == "Constant" for o in n.output}
        depthwise = {n.name for n in proto.graph.node if n.op_type == "Conv" and _is_depthwise(n, shapes)}
        nodes = {n.name: (n.op_type, list(n.input), list(n.output)) for n in proto.graph.node}
        return cls(nodes, frozenset(constants), frozenset(depthwise))

    def kernel(self, site: PlanSite) -> list[str]:
        """The site's nodes that the model holds, in the plan's order."""
        return [n for n in site.node_names if n in self.nodes]

    def kernel_inputs(self, site: PlanSite) -> list[str]:
        """Activation tensors the kernel reads from outside itself (not its weights)."""
        kernel = self.kernel(site)
        made = {o for n in kernel for o in self.nodes[n][2]}
        return unique(i for n in kernel for i in self.nodes[n][1] if i not in made and i not in self.constants)


def _is_depthwise(node: onnx.NodeProto, shapes: Mapping[str, list[int]]) -> bool:
    """group == input channels == output channels (weight [C, 1, k, k]): Hailo's `dw` layer."""
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    weight = shapes.get(node.input[1]) if len(node.input) > 1 else None
    return group > 1 and weight is not None and len(weight) >= 2 and weight[1] == 1 and weight[0] == group


@dataclass(frozen=True)
class ExportInputs:
    """What a plan writer may read besides the plan; each is None when not known (a plan exported without
    its model, or no toolchain ran)."""

    graph: Mapping[str, NodeInfo] | None = None
    """The user's model: node -> (op type, inputs, outputs)."""
    nodes: ModelNodes | None = None
    """The user's model as the chip exports read it (constants, depthwise convs)."""
    tool_names: Mapping[str, Sequence[str]] | None = None
    """Site node -> the names the toolchain that ran keeps for it (RKNN step 1's, tpu-mlir's top MLIR ops)."""


@dataclass(frozen=True)
class PlanExport:
    """One file a plan is written as (`bisect --export NAME`)."""

    name: str
    file_name: str
    """Its name in the run folder."""
    write: Callable[[Plan, ExportInputs], str]
    default: bool = True
    """Written by every bisect without `--export`; else only when asked for or when one of `profiles` ran."""
    profiles: tuple[str, ...] = ()
    """Chip profiles whose bisect writes it beside the default ones."""
    weight_bits: bool = False
    """Whether it can say a site keeps 8-bit weights under a 4-bit-weight scheme (a per-layer weight type)."""
