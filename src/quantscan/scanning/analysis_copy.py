"""The analysis copy: what the chip's compiler would run, in float, made from the user's model.

Preparation works on a copy, never on the user's model: weights held in `Constant` nodes become
initializers (Paddle exports), Identity and Dropout go and constant subgraphs are folded (the `cleanup`
rewrite), BatchNormalization is folded into its Conv/Gemm (the same pass `rewrite --fold-bn` uses), the
opset is raised to what per-channel QDQ needs, and declared output shapes are dropped because at least
one real exporter writes wrong ones; the runtime is trusted instead.
"""

from __future__ import annotations

import copy

from quantscan.graph.float32 import WIDENED, non_float32_types, to_float32
from quantscan.model import (
    MIN_ANALYSIS_OPSET,
    LoadedModel,
    PreparedModel,
    allow_unlisted_initializers,
    constants_to_initializers,
    forget_declared_shapes,
    name_unnamed_nodes,
    onnx_opset,
    set_input_dims,
    upgrade_opset,
)
from quantscan.rewrites.cleanup import cleanup
from quantscan.rewrites.fold_bn import fold_batchnorm
from quantscan.specs import Dim


def prepare_for_analysis(
    model: LoadedModel, input_dims: dict[str, tuple[Dim, ...]], *, min_opset: int = MIN_ANALYSIS_OPSET
) -> PreparedModel:
    """The copy quantscan measures: what the chip's compiler would run, in float."""
    proto = copy.deepcopy(model.proto)
    changes: list[str] = []
    raised = allow_unlisted_initializers(proto)
    if raised:
        changes.append(raised)
    moved = constants_to_initializers(proto)
    if moved:
        changes.append(f"{moved} Constant nodes turned into initializers")
    tidy = cleanup(proto)
    proto = tidy.model
    if tidy.changes:
        changes.append(f"{len(tidy.changes)} Identity/Dropout removals, constant folds and dead-node drops (cleanup)")
    result = fold_batchnorm(proto)
    proto = result.model
    if result.changes:
        changes.append(f"{len(result.changes)} BatchNormalization folded into their producers")
    opset_from = onnx_opset(proto)
    proto = upgrade_opset(proto, min_opset)
    opset_to = onnx_opset(proto)
    if opset_to != opset_from:
        changes.append(f"opset raised from {opset_from} to {opset_to} with onnx.version_converter")
    widened = non_float32_types(proto)
    if widened:  # QuantizeLinear takes no double (nor float16 below opset 19): measure as the chip computes
        changed = to_float32(proto, widened)
        names = " and ".join(WIDENED[t] for t in sorted(widened, key=WIDENED.__getitem__))
        changes.append(f"{names} computed as float32 ({changed} initializers, attributes and edge Casts)")
    forget_declared_shapes(proto)
    set_input_dims(proto, input_dims)
    name_unnamed_nodes(proto)  # the opset converter and the folds may add unnamed nodes
    return PreparedModel(proto, opset_from, opset_to, changes, {c.node for c in result.changes})
