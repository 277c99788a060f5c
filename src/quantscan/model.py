"""Load and validate ONNX models, and the model-level edits the analysis copy is made with.

Loading turns every way a model file can be wrong (missing, truncated, not ONNX, external data
missing, already quantized) into one `ModelError` line. The analysis copy itself (the rewrite passes
applied in the chip compiler's order) is `quantscan.scanning.analysis_copy`: this module sits below
the rewrite passes and imports none of them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from quantscan.errors import ModelError
from quantscan.graph.index import constant_node_value
from quantscan.graph.infer import check_model, convert_version
from quantscan.specs import Dim, InputSpec
from quantscan.validate import check_finite_weights, validate_model

QUANTIZED_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "QLinearAdd",
        "QLinearMul",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
        "QLinearConcat",
        "QLinearGlobalAveragePool",
        "QLinearAveragePool",
        "QLinearSoftmax",
        "ConvInteger",
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul",
        "QGemm",
        "QAttention",
        "DynamicQuantizeLSTM",
        "MatMulNBits",
        "QEmbedLayerNormalization",
    }
)
"""Op types only a quantized model holds; any `QLinear*` op counts too (onnxruntime adds them over time)."""
MIN_ANALYSIS_OPSET = 13
"""Per-channel QuantizeLinear/DequantizeLinear (the `axis` attribute) exists from opset 13."""


ModelArg = str | Path | onnx.ModelProto
"""A model as the API takes it: a path, or a proto already in memory."""



@dataclass
class LoadedModel:
    """A validated model as the user gave it. `proto` is never modified by quantscan."""

    path: Path
    proto: onnx.ModelProto
    sha256: str
    opset: int
    inputs: list[InputSpec]
    outputs: list[str]
    warnings: list[str] = field(default_factory=list)

    @property
    def stem(self) -> str:
        return self.path.stem


@dataclass
class PreparedModel:
    """The analysis copy: folded, upgraded, with fixed input shapes, plus what was done to it."""

    proto: onnx.ModelProto
    opset_from: int
    opset_to: int
    changes: list[str]
    bn_folded_into: set[str]
    """Names of the Conv/ConvTranspose/Gemm nodes that absorbed a BatchNormalization."""


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_model_file(path: str | Path) -> onnx.ModelProto:
    """The one place quantscan reads an ONNX file: the proto with its external data, or one `ModelError`."""
    p = Path(path)
    if not p.exists():
        raise ModelError(f"expected an ONNX model file, found nothing at {p}")
    if p.is_dir():
        raise ModelError(f"expected an ONNX model file, found a directory: {p}")
    if p.stat().st_size == 0:
        raise ModelError(f"expected an ONNX model, found an empty file: {p}")
    proto = _parse(p)
    if proto.graph.node:
        _load_external(proto, p)
    return proto


def load_model(path: str | Path) -> LoadedModel:
    """Read, check and describe a model; every failure is one `ModelError` line."""
    p = Path(path)
    proto = read_model_file(p)
    if not proto.graph.node:
        raise ModelError(f"expected an ONNX model with a graph, found no nodes in {p} (is it an ONNX file?)")
    validate_model(proto, str(p))
    _check(proto, p)
    name_unnamed_nodes(proto)
    inputs = graph_inputs(proto)
    outputs = [o.name for o in proto.graph.output]
    return LoadedModel(p, proto, file_sha256(p), onnx_opset(proto), inputs, outputs)


def _parse(path: Path) -> onnx.ModelProto:
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf raises DecodeError and friends
        size = path.stat().st_size
        raise ModelError(
            f"expected an ONNX protobuf in {path}, found {size} bytes that do not parse "
            f"(truncated or not ONNX: {type(exc).__name__})"
        ) from exc


def _load_external(proto: onnx.ModelProto, path: Path) -> None:
    external = [t for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    if not external:
        return
    for tensor in external:
        location = next((e.value for e in tensor.external_data if e.key == "location"), None)
        if location is None or not (path.parent / location).is_file():
            raise ModelError(
                f"expected external data file {location!r} beside {path} for tensor {tensor.name!r}, found none"
            )
    try:
        onnx.load_external_data_for_model(proto, str(path.parent))
    except Exception as exc:
        raise ModelError(f"could not read external data of {path}: {exc}") from exc


def _check(proto: onnx.ModelProto, path: Path) -> None:
    try:
        check_model(proto)
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid graph"
        raise ModelError(f"expected a valid ONNX model in {path}, onnx.checker found: {first}") from exc
    except ValueError:
        # Models over 2 GB cannot be checked in memory; checking by path would need the file layout.
        pass


def onnx_opset(proto: onnx.ModelProto) -> int:
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    return 1


def graph_inputs(proto: onnx.ModelProto) -> list[InputSpec]:
    """Inputs the caller must feed (inputs that are also initializers have defaults)."""
    inits = {t.name for t in proto.graph.initializer}
    specs = []
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt.elem_type else np.dtype(np.float32)
        dims: list[Dim] = []
        for d in tt.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param:
                dims.append(d.dim_param)
            else:
                dims.append(None)
        specs.append(InputSpec(vi.name, np.dtype(dtype), tuple(dims)))
    return specs


def ensure_float_model(model: LoadedModel) -> None:
    """Scan and bisect measure int8 against FP32: a model that is already quantized has no FP32 reference."""
    ensure_not_quantized(model.proto, model.path.name)
    check_finite_weights(model.proto, model.path.name)


def ensure_not_quantized(proto: onnx.ModelProto, name: str) -> None:
    """Every command reads the float model the chip's toolchain will quantize. An already-quantized one
    (QDQ pairs, QLinear*, *Integer ops) is the toolchain's output, not its input: check would flag its
    QuantizeLinear/DequantizeLinear pairs as hundreds of unsupported ops, and a rewrite would prove
    itself against int8 arithmetic. One line says so instead."""
    found = sorted({n.op_type for n in proto.graph.node
                    if n.op_type in QUANTIZED_OPS or n.op_type.startswith("QLinear")})
    if found:
        raise ModelError(
            f"expected a float model, found an already-quantized one ({', '.join(found)} in {name}); "
            "give quantscan the FP32 model it came from"
        )


# --- preparation -------------------------------------------------------------------------------------


def constants_to_initializers(proto: onnx.ModelProto) -> int:
    """Move tensor-valued `Constant` nodes into initializers, so weights look the same in every export."""
    graph = proto.graph
    keep, moved = [], 0
    for node in graph.node:
        value = constant_node_value(node) if node.op_type == "Constant" and node.domain in ("", "ai.onnx") else None
        if value is None:
            keep.append(node)
            continue
        graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
        moved += 1
    del graph.node[:]
    graph.node.extend(keep)
    return moved


INITIALIZERS_NEED_NO_INPUT_IR = 4
"""From IR version 4 an initializer need not be listed among the graph inputs (onnx IR.md)."""


def allow_unlisted_initializers(proto: onnx.ModelProto) -> str | None:
    """Raise a copy's IR version to 4 when it is below, and say so (None when nothing changed).

    Why: before IR 4 every initializer must also be a graph input, and the analysis copy adds
    initializers everywhere (moved Constant weights, folded BatchNorm weights, QDQ scales);
    onnxruntime refused quantscan's own graph for an IR 3 model whose weights were Constant nodes.
    Nothing else changed between IR 3 and 4, so the copy computes what the user's model computes."""
    if proto.ir_version >= INITIALIZERS_NEED_NO_INPUT_IR:
        return None
    before, proto.ir_version = proto.ir_version, INITIALIZERS_NEED_NO_INPUT_IR
    return f"IR version raised from {before} to {INITIALIZERS_NEED_NO_INPUT_IR} (initializers need not be inputs)"


def upgrade_opset(proto: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """Raise the default-domain opset to `target` (never lowers it)."""
    current = onnx_opset(proto)
    if current >= target:
        return proto
    try:
        upgraded = convert_version(proto, target)
    except Exception as exc:
        raise ModelError(
            f"expected a model onnx.version_converter can raise from opset {current} to {target}, "
            f"found: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from exc
    return upgraded


def set_input_dims(proto: onnx.ModelProto, shapes: dict[str, tuple[Dim, ...]]) -> None:
    """Write concrete (or symbolic) dims on graph inputs; other inputs are left as they are."""
    for vi in proto.graph.input:
        if vi.name not in shapes:
            continue
        dims = vi.type.tensor_type.shape.dim
        new = shapes[vi.name]
        del dims[:]
        for d in new:
            dim = onnx.TensorShapeProto.Dimension()
            if isinstance(d, int):
                dim.dim_value = d
            elif isinstance(d, str):
                dim.dim_param = d
            dims.append(dim)


def forget_declared_shapes(proto: onnx.ModelProto) -> None:
    """Declared output shapes and value_info can be wrong (a YOLOX export declares one): drop them."""
    del proto.graph.value_info[:]
    for out in proto.graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")


def name_unnamed_nodes(proto: onnx.ModelProto) -> None:
    """Reports name nodes; exporters sometimes leave names empty. `<op_type>_<index>` is stable."""
    seen: set[str] = set()
    for index, node in enumerate(proto.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{index}"
        seen.add(node.name)
