"""Validation before work: what a model file may hold before onnx, onnxruntime or numpy see it.

Why a module of its own: onnx.checker accepts things that later crash quantscan or the libraries it
calls (an element type outside the ONNX enum is a `KeyError` in numpy conversion, a name that is not
valid UTF-8 comes back from protobuf as `bytes`, a LayerNormalization `axis` of 2**31 segfaults onnx's
shape inference). Each check here turns one of those into one `ModelError` line that names the
node or tensor, before any of that code runs.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from onnx import numpy_helper

from quantscan.columns import Col
from quantscan.errors import ModelError
from quantscan.graph.subgraphs import all_graphs

MAX_AXIS = 64
"""Largest |axis| quantscan accepts in an axis-like attribute: no real tensor has more dimensions,
and far larger values crash onnx's shape inference (seen with LayerNormalization axis = 2**31)."""

AXIS_ATTRIBUTES = frozenset({"axis", "axes", "perm", "batch_axis", "time_axis"})
"""Integer attributes used as dimension indices."""

_VALID_ELEM_TYPES = frozenset(int(v) for v in onnx.TensorProto.DataType.values())


def validate_model(proto: onnx.ModelProto, where: str) -> None:
    """Raise one `ModelError` for the first thing in `proto` that would crash a later stage."""
    for graph in all_graphs(proto.graph):
        _check_names(graph, where)
    _check_text(proto, where)
    for graph in all_graphs(proto.graph):
        _check_elem_types(graph, where)
        _check_attributes(graph, where)
        _check_initializers(graph, where)


def _check_text(message: Message, where: str, path: str = "model") -> None:
    """Every string field anywhere in the model (graph name, doc strings, producer, metadata, attribute
    names, subgraphs...) is valid UTF-8: the names `_check_names` words better are only some of them, and
    any other one came back as `bytes` and failed later in a report or a JSON file (exit 3)."""
    for field, value in message.ListFields():
        if field.type == FieldDescriptor.TYPE_STRING:
            for k, text in enumerate(value if _repeated(field) else [value]):
                if not isinstance(text, str):
                    at = f"{path}.{field.name}" + (f"[{k}]" if _repeated(field) else "")
                    raise ModelError(f"expected UTF-8 text in {where}, found {at} = {_show(text)} "
                                     "that is not valid UTF-8")
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if _repeated(field):
                for k, item in enumerate(value):
                    _check_text(item, where, f"{path}.{field.name}[{k}]")
            else:
                _check_text(value, where, f"{path}.{field.name}")


def _repeated(field: FieldDescriptor) -> bool:
    """protobuf 6+ has `is_repeated`; older ones only `label`."""
    flag = getattr(field, "is_repeated", None)
    return bool(flag) if flag is not None else bool(field.label == FieldDescriptor.LABEL_REPEATED)


def check_finite_weights(proto: onnx.ModelProto, where: str) -> None:
    """Scan and bisect compute scales from weights: NaN weights give no scale, so name the tensor.

    ±inf is a value models use on purpose (the −inf identity of a max-reduction in jax2tf exports,
    additive attention masks): valid. A quantized site's weight must still be finite (make_plan)."""
    for graph in all_graphs(proto.graph):
        for tensor in graph.initializer:
            if tensor.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
                continue
            try:
                values = numpy_helper.to_array(tensor)
            except Exception:  # a broken initializer: onnxruntime will name it when it loads the model
                continue
            bad = int(np.count_nonzero(np.isnan(values))) if values.size else 0
            if bad:
                raise ModelError(f"expected weights without NaN in {where}, found {bad} NaN values in "
                                 f"initializer {tensor.name!r}")


def _check_names(graph: onnx.GraphProto, where: str) -> None:
    """protobuf hands back a string field that is not valid UTF-8 as `bytes`; nothing downstream expects it."""
    for index, node in enumerate(graph.node):
        for name in _node_names(node):
            if not isinstance(name, str):
                raise ModelError(f"expected UTF-8 names in {where}, found node #{index} ({node.op_type}) with the "
                                 f"name or tensor name {_show(name)} that is not valid UTF-8")
    for kind, names in (("initializer", (t.name for t in graph.initializer)),
                        ("input", (v.name for v in graph.input)),
                        (Col.OUTPUT, (v.name for v in graph.output)),
                        ("value_info", (v.name for v in graph.value_info))):
        for name in names:
            if not isinstance(name, str):
                raise ModelError(f"expected UTF-8 names in {where}, found a graph {kind} named {_show(name)} "
                                 "that is not valid UTF-8")


def _node_names(node: onnx.NodeProto) -> Iterable[object]:
    yield node.name
    yield node.op_type
    yield node.domain
    yield from node.input
    yield from node.output


def _show(name: object) -> str:
    raw = name if isinstance(name, bytes) else str(name).encode("utf-8", "replace")
    return repr(raw.decode("utf-8", "replace")[:60])


def _check_elem_types(graph: onnx.GraphProto, where: str) -> None:
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if vi.type.HasField("tensor_type"):
            _elem_type(vi.type.tensor_type.elem_type, f"tensor {vi.name!r}", where)
    for tensor in graph.initializer:
        _tensor_type(tensor.data_type, f"initializer {tensor.name!r}", where)
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                _tensor_type(attr.t.data_type, f"attribute {attr.name!r} of node {node.name!r}", where)


def _tensor_type(value: int, what: str, where: str) -> None:
    """A tensor holds data, so its type is a real one: UNDEFINED (0) is in the enum but types nothing."""
    _elem_type(value, what, where)
    if value == onnx.TensorProto.UNDEFINED:
        raise ModelError(f"expected a data type for {what} in {where}, found 0 (UNDEFINED)")


def _elem_type(value: int, what: str, where: str) -> None:
    if value not in _VALID_ELEM_TYPES:
        raise ModelError(f"expected an ONNX element type for {what} in {where}, found {value} "
                         "(outside the TensorProto.DataType enum)")


_PACKED = frozenset(int(getattr(onnx.TensorProto, n)) for n in ("INT4", "UINT4", "FLOAT4E2M1", "STRING")
                    if hasattr(onnx.TensorProto, n))


def _check_initializers(graph: onnx.GraphProto, where: str) -> None:
    """Dims that are non-negative and raw bytes that match them: numpy reshapes fail on anything else."""
    for t in graph.initializer:
        if any(d < 0 for d in t.dims):
            raise ModelError(f"expected non-negative dims for initializer {t.name!r} in {where}, found {list(t.dims)}")
        if t.data_location == onnx.TensorProto.EXTERNAL or t.data_type in _PACKED or not t.HasField("raw_data"):
            continue
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        expected = int(np.prod(t.dims, dtype=np.float64)) * itemsize
        if expected != len(t.raw_data):
            raise ModelError(f"expected {expected} bytes of data for initializer {t.name!r} "
                             f"({onnx.TensorProto.DataType.Name(t.data_type)} {list(t.dims)}) in {where}, "
                             f"found {len(t.raw_data)}")


def _check_attributes(graph: onnx.GraphProto, where: str) -> None:
    for node in graph.node:
        for attr in node.attribute:
            if attr.name not in AXIS_ATTRIBUTES:
                continue
            values = [attr.i] if attr.type == onnx.AttributeProto.INT else list(attr.ints)
            if attr.name == "perm":
                bad = [v for v in values if v < 0 or v > MAX_AXIS]
            else:
                bad = [v for v in values if abs(v) > MAX_AXIS]
            if bad:
                raise ModelError(f"expected attribute {attr.name!r} of node {node.name!r} ({node.op_type}) in "
                                 f"{where} within [-{MAX_AXIS}, {MAX_AXIS}], found {bad[0]}")
