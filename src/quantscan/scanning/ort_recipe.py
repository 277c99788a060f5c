"""The `onnxruntime` profile's recipe: quantize_static's placement and scales, as quantscan sites.

Why not quantscan's kernels: quantize_static puts QDQ pairs per ONNX node, by op type
(onnxruntime/quantization/registry.py `QDQRegistry`; every other op type of `QLinearOpsRegistry`
gets `QDQOperatorBase`, i.e. all its float inputs and outputs), between a Conv and its unfused
BatchNormalization, on weights held in `Constant` nodes (as activations), never on HardSwish; it shares
scales through Reshape/Transpose/MaxPool/... (`QDQDirect8BitOp.quantize_output_same_as_input`) and
removes a Relu/Clip after a quantized output (`QDQRemovableActivation`). A bisection plan measured on
quantscan's kernels does not transfer (issue 12: 0.9951 claimed, 0.9750 applied).

How: the prepared FP32 model (the user's graph, unfolded: only free dims fixed and unnamed nodes named)
goes through the real `quantize_static` once (runner.quantize_static_model, same samples in the same
order), and the model it writes is read back (graph.placement) into one site per node it
quantizes and the plan of its scales, int8 weights and int32 biases. Rebuilding the QDQ model from
those gives quantize_static's model (tests: same tensors, scales, outputs on the public assets).
The cost is quantize_static's own calibration pass, beside quantscan's (which still feeds the
per-channel statistics and int16 ranges).

Precision changes follow quantize_static's rules too: an excluded node drops its own QDQ requests,
and a node that quantizes only when its input already is (`Site.quantized_if`) follows suit, in
graph order (gain.MixedBuilder), so `nodes_to_exclude` reproduces what bisect measured.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx

from quantscan import graph as qgraph
from quantscan.errors import UsageError
from quantscan.graph.placement import NodePlacement, QdqPlacement, read_placement
from quantscan.model import (
    LoadedModel,
    PreparedModel,
    allow_unlisted_initializers,
    forget_declared_shapes,
    name_unnamed_nodes,
    onnx_opset,
    set_input_dims,
    upgrade_opset,
)
from quantscan.records import ActivationScheme, CalibMethod
from quantscan.sites import SENSITIVE_OPS, Site
from quantscan.specs import Dim

RECIPE = "onnxruntime"

CONDITIONAL_OPS = frozenset(
    {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "AveragePool", "Slice", "TopK", "Resize",
     "MaxPool", "Relu", "Clip", "Gather", "GatherElements"}
)
"""Op types quantize_static quantizes only when their data input is already quantized by an earlier
node: QDQDirect8BitOp / QDQResize / QDQMaxPool (operators/direct_q8.py, resize.py, maxpool.py),
QDQRemovableActivation (operators/activation.py), QDQGather on a non-weight input (operators/gather.py)."""


REMOVABLE_OPS = frozenset({"Relu", "Clip"})
"""The activations quantize_static removes after a quantized output (QDQRemovableActivation)."""

RANGE_SETTING_OPS = frozenset({"Relu", "Clip", "Softmax"})
"""Op types whose node, when quantize_static quantizes it, rewrites a tensor's calibrated range before
any scale is computed (base_quantizer.calculate_quantization_params): a Relu/Clip gives its input (when
the node is that input's only reader) its own output's range, so the producer's QDQ pair clamps as the
activation did; a Softmax gives its output [0, 1]. `nodes_to_exclude` skips that rewrite, so excluding
such a node changes a tensor that is not its own (issue 38: ppocr_mobile_v2_cls `Clip@5` measured +0.00000
while quantize_static with it excluded gives -0.01521: the Conv before it quantizes its unclipped range)."""

ORT_CALIBRATORS = {CalibMethod.MINMAX: "MinMax", CalibMethod.ENTROPY: "Entropy", CalibMethod.PERCENTILE: "Percentile"}
"""quantscan's --calib-method -> quantize_static's CalibrationMethod name (it has no MSE calibrator)."""


def quantize_static_call(scheme: ActivationScheme, method: CalibMethod = CalibMethod.MINMAX) -> dict[str, Any]:
    """quantize_static's keyword arguments for a scheme, enum values by name (ort_quant_config.json).

    uint8: QUInt8 asymmetric activations (quantize_static's `ActivationSymmetric` default False);
    int8: QInt8 with `ActivationSymmetric`, which is quantscan's int8 (symmetric, zero point 0); int16:
    QInt16 with `ActivationSymmetric` (quantscan's int16, the W8A16 scheme).
    Weights QInt8 symmetric (`WeightSymmetric` default True), per channel; the calibrator of `method`
    (MinMax by default, and for mse, which quantize_static lacks: callers that simulate refuse it).
    """
    return {
        "quant_format": "QDQ",
        "activation_type": ORT_ACTIVATION_TYPES.get(scheme, "QInt8"),
        "weight_type": "QInt8",
        "per_channel": True,
        "calibrate_method": ORT_CALIBRATORS.get(method, "MinMax"),
        "extra_options": {"ActivationSymmetric": scheme != ActivationScheme.UINT8},
    }


ORT_ACTIVATION_TYPES = {ActivationScheme.UINT8: "QUInt8", ActivationScheme.INT8: "QInt8",
                        ActivationScheme.INT16: "QInt16"}
"""quantscan's activation scheme -> quantize_static's `activation_type`; the signed ones symmetric, as
quantscan's int8 / int16 are (W8A16 under the recipe: QInt16 with ActivationSymmetric)."""


INT16_ACTIVATIONS: dict[str, tuple[str, str, bool]] = {
    "QUInt8": ("uint16", "QUInt16", False),
    "QInt8": ("int16", "QInt16", True),
}
"""quantize_static's 8-bit activation type -> its 16-bit counterpart: (quantscan scheme, QuantType name,
symmetric). Why not always symmetric QInt16: quantize_static removes a Relu/Clip after a quantized output
when `ActivationSymmetric` is off (QDQRemovableActivation reads the global flag, not the tensor's
override), leaving the QDQ pair to clamp; a symmetric int16 override on that tensor keeps negatives, so
the Relu is lost (measured: a tiny chain's plan claimed 0.9999, applied 0.79). Asymmetric QUInt16 keeps
the zero point at the range's low end, as the uint8 pair it replaces did."""


def int16_activations(activation_type: str) -> tuple[str, str, bool]:
    """The 16-bit activation form for a quantize_static call's `activation_type` (a QuantType name)."""
    return INT16_ACTIVATIONS.get(activation_type, INT16_ACTIVATIONS["QInt8"])


def check_calib_method(method: CalibMethod) -> None:
    """The onnxruntime recipe calibrates with quantize_static's own calibrators: mse is not one."""
    if method not in ORT_CALIBRATORS:
        raise UsageError(
            f"--calib-method {method}: expected minmax, entropy or percentile with --profile onnxruntime "
            "(quantize_static has no MSE calibrator)"
        )


def prepare_unfolded(model: LoadedModel, input_dims: dict[str, tuple[Dim, ...]], min_opset: int = 0
                     ) -> PreparedModel:
    """The copy quantize_static is given: the user's graph as it is (no BN folding, no Constant
    moves: quantize_static quantizes what the user has), free dims fixed from the data and unnamed
    nodes named (placement is read back by node name). The opset is kept unless int16 activations
    need `min_opset` 21, to which quantize_static (1.32) raises an older model itself before writing
    16-bit Q/DQ (quant_utils: "Automatically update the model to opset 21"); raised here first, the
    analysis graph can hold those Q/DQ pairs too (tests/scanning/test_ort_recipe.py compares both)."""
    proto = copy.deepcopy(model.proto)
    raised = allow_unlisted_initializers(proto)  # the QDQ scales are initializers too
    forget_declared_shapes(proto)
    set_input_dims(proto, input_dims)
    name_unnamed_nodes(proto)
    opset_from = onnx_opset(proto)
    proto = upgrade_opset(proto, min_opset)
    opset = onnx_opset(proto)
    changes = ["graph kept as quantize_static receives it (recipe onnxruntime)", *([raised] if raised else [])]
    if opset != opset_from:
        changes.append(f"opset raised from {opset_from} to {opset} for 16-bit QuantizeLinear")
    return PreparedModel(proto, opset_from, opset, changes, set())


@dataclass
class RecipeResult:
    """quantize_static's placement as quantscan sites, its plan, and the QDQ model it wrote."""

    sites: list[Site]
    origins: dict[str, str]
    plan: qgraph.QuantPlan
    qdq: onnx.ModelProto
    call: dict[str, Any]
    own_ranges: list[str]
    """Tensors calibration also observes though the plan may not quantize them: those whose range a
    range-setting node sets (range_settings), wanted at their own range when that node is excluded."""


def sites_from_placement(fp32: onnx.ModelProto, placement: QdqPlacement, op_types: frozenset[str]) -> list[Site]:
    """One site per node quantize_static quantizes, in graph order (the order its rules depend on).

    `op_types` are the ones quantize_static quantizes (runner.quantize_static_op_types): a node of
    another type (HardSwish, HardSigmoid) reads a DequantizeLinear output only because a neighbour
    asked for the pair, and excluding it changes nothing, so it is no site.
    """
    sites: list[Site] = []
    removed = set(placement.removed)
    for node in fp32.graph.node:
        place = placement.nodes.get(node.name)
        if node.name in removed and node.op_type in REMOVABLE_OPS:
            sites.append(_removed_site(node))
        elif place is not None and node.op_type in op_types and (
            place.inputs or place.outputs or place.weights or place.bias
        ):
            sites.append(_node_site(node, place))
    return sites


def _node_site(node: onnx.NodeProto, place: NodePlacement) -> Site:
    own = [o for o in place.outputs if o in node.output]
    weights = dict(place.weights)
    weight = node.input[1] if len(node.input) > 1 and node.input[1] in weights else None
    return Site(
        node=node.name,
        op_type=node.op_type,
        kernel=node.op_type,
        nodes=[node.name],
        inputs=[i for i in place.inputs if i in node.input],
        output=own[0] if own else node.output[0],
        weight=weight,
        weight_axis=weights.get(weight) if weight else None,
        bias=place.bias,
        extra_weights=[(w, axis or 0) for w, axis in place.weights if w != weight],
        conv_like=node.op_type in ("Conv", "ConvTranspose"),
        sensitive=node.op_type in SENSITIVE_OPS,
        quantized_if=node.input[0] if node.op_type in CONDITIONAL_OPS and node.input else None,
    )


def _removed_site(node: onnx.NodeProto) -> Site:
    """A Relu/Clip quantize_static removed: its producer writes its output through the QDQ pair, which
    clamps as the activation did (zero point at the range's low end), so keeping the node and
    quantizing its output is the same arithmetic."""
    output = node.output[0]
    return Site(
        node=node.name, op_type=node.op_type, kernel=node.op_type, nodes=[node.name], inputs=[],
        output=output, quantized_if=node.input[0],
    )


def range_settings(fp32: onnx.ModelProto, sites: Sequence[Site]) -> dict[str, str]:
    """Site node -> the tensor whose quantize_static range that node sets while it is quantized
    (RANGE_SETTING_OPS); the tensor keeps its own calibrated range when the node is excluded."""
    readers: dict[str, int] = {}
    for node in fp32.graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    nodes = {n.name: n for n in fp32.graph.node}
    out: dict[str, str] = {}
    for site in sites:
        node = nodes.get(site.node)
        if node is None or node.op_type not in RANGE_SETTING_OPS or not node.input:
            continue
        if node.op_type == "Softmax":
            out[site.node] = node.output[0]
        elif readers.get(node.input[0], 0) == 1:
            out[site.node] = node.input[0]
    return out


def recipe_sites(
    prepared: PreparedModel, qdq: onnx.ModelProto, op_types: frozenset[str], call: Mapping[str, Any]
) -> RecipeResult:
    """Read quantize_static's model back into sites, origins (every tensor its own) and the plan."""
    placement = read_placement(qdq, prepared.proto)
    sites = sites_from_placement(prepared.proto, placement, op_types)
    origins = {t: t for t in placement.plan.activations}
    own = sorted(set(range_settings(prepared.proto, sites).values()))
    return RecipeResult(sites, origins, placement.plan, qdq, dict(call), own)
