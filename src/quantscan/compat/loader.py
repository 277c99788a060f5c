"""The structural check's two pictures of a model: shapes inferred as shipped, and with input dims fixed.

The file itself is read by `quantscan.model.read_model_file`, the one place that reads ONNX files.

The check needs two pictures of the graph: the model as shipped (which dims are symbolic) and the
model once its input dims are fixed, as a converter sees it after `--input-shape`/`fix-dim`. Shape
chains that are still dynamic in the second picture survive constant folding; the others don't.
Symbolic dims the caller did not fix are filled with FILL_BATCH on axis 0 and DEFAULT_DIM
elsewhere, so shape inference can run and limits that do not depend on those dims have numbers.
Byte counts do not rest on DEFAULT_DIM: the fixed view is inferred a second time with every guessed
non-batch dim one larger, and a tensor whose size changes depends on a guess (`ModelViews.guessed`):
its bytes are unknown. Batch 1 stays (a count per inference of one sample), flagged as estimated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from quantscan.errors import UsageError
from quantscan.graph.index import GraphIndex
from quantscan.graph.infer import infer_shapes
from quantscan.model import read_model_file

FILL_BATCH = 1
DEFAULT_DIM = 224


@dataclass(frozen=True)
class DimFill:
    """One symbolic input dim and the value the fixed view gave it."""

    input: str
    axis: int
    symbol: str
    value: int
    from_user: bool


@dataclass(frozen=True)
class ModelViews:
    original: GraphIndex
    fixed: GraphIndex
    fills: tuple[DimFill, ...]
    guessed: frozenset[str] = frozenset()
    """Tensors whose size in the fixed view depends on a guessed (not given) non-batch dim."""
    moved: GraphIndex | None = None
    """The fixed view again with every guessed non-batch dim one larger (None when nothing was guessed):
    a value that differs between the two views rests on a guess."""

    @property
    def estimated(self) -> bool:
        """True when byte counts assume batch 1 on an input whose batch the caller did not give."""
        return any(not f.from_user and f.axis == 0 for f in self.fills)

    def nbytes(self, tensor: str) -> int | None:
        """Bytes of `tensor` in the fixed view; None when unknown or resting on a guessed dim."""
        return None if tensor in self.guessed else self.fixed.info(tensor).nbytes()


def read_model(model: onnx.ModelProto | str | Path) -> onnx.ModelProto:
    """The ModelProto for a proto, or read from a path by the model loader (`quantscan.model`)."""
    if isinstance(model, onnx.ModelProto):
        return model
    return read_model_file(model)


def infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shapes inferred leniently: a node shape inference cannot handle stays unknown."""
    try:
        return infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # e.g. a declared output shape that contradicts inference
        return model


def load(
    model: onnx.ModelProto | str | Path, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> ModelViews:
    proto = read_model(model)
    original = GraphIndex.of(infer(proto), initializers_are_weights=True)
    _check_input_shapes(original, input_shapes or {})
    fills = _fills(proto, input_shapes or {})
    if not fills and not input_shapes:
        return ModelViews(original, original, ())
    fixed = _fixed_view(proto, fills, input_shapes or {})
    moved = _moved_view(proto, fills, input_shapes or {})
    guessed = frozenset() if moved is None else _guessed(fixed, moved)
    return ModelViews(original, fixed, tuple(fills), guessed, moved)


def _fixed_view(proto: onnx.ModelProto, fills: Sequence[DimFill], shapes: Mapping[str, Sequence[int]]) -> GraphIndex:
    fixed_proto = onnx.ModelProto()
    fixed_proto.CopyFrom(proto)
    _apply(fixed_proto, list(fills), shapes)
    return GraphIndex.of(infer(fixed_proto), initializers_are_weights=True)


def _moved_view(
    proto: onnx.ModelProto, fills: Sequence[DimFill], shapes: Mapping[str, Sequence[int]]
) -> GraphIndex | None:
    guesses = [f for f in fills if not f.from_user and f.axis != 0]
    if not guesses:
        return None
    return _fixed_view(proto, [replace(f, value=f.value + 1) if f in guesses else f for f in fills], shapes)


def _guessed(fixed: GraphIndex, moved: GraphIndex) -> frozenset[str]:
    """Tensors whose size moves when the guessed non-batch dims move by one: their size is a guess."""
    return frozenset(t for t, info in fixed.tensors.items() if info.nbytes() != moved.info(t).nbytes())


def _check_input_shapes(view: GraphIndex, shapes: Mapping[str, Sequence[int]]) -> None:
    for name, dims in shapes.items():
        if name not in view.inputs:
            raise UsageError(f"expected an input shape for one of {view.inputs}, found input '{name}'")
        rank = view.info(name).shape
        if rank is not None and len(rank) != len(dims):
            raise UsageError(
                f"expected {len(rank)} dims for input '{name}', found {len(dims)} ({list(dims)})"
            )


def _graph_inputs(proto: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {t.name for t in proto.graph.initializer}
    return [i for i in proto.graph.input if i.name not in inits]


def _fills(proto: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> list[DimFill]:
    fills: list[DimFill] = []
    for vi in _graph_inputs(proto):
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                continue
            symbol = d.dim_param or "?"
            if vi.name in shapes:
                fills.append(DimFill(vi.name, axis, symbol, int(shapes[vi.name][axis]), True))
            else:
                value = FILL_BATCH if axis == 0 else DEFAULT_DIM
                fills.append(DimFill(vi.name, axis, symbol, value, False))
    return fills


def _apply(proto: onnx.ModelProto, fills: list[DimFill], shapes: Mapping[str, Sequence[int]]) -> None:
    by_input = {vi.name: vi for vi in _graph_inputs(proto)}
    for name, dims in shapes.items():
        shape = by_input[name].type.tensor_type.shape
        for axis, value in enumerate(dims):
            shape.dim[axis].Clear()
            shape.dim[axis].dim_value = int(value)
    for f in fills:
        dim = by_input[f.input].type.tensor_type.shape.dim[f.axis]
        dim.Clear()
        dim.dim_value = f.value
    del proto.graph.value_info[:]
    for out in proto.graph.output:
        if out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
