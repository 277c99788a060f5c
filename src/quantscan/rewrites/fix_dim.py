"""`fix-dim`: set symbolic input dimensions, then fold the shape subgraphs that become static.

Why: NPU compilers want static shapes. Fixing the batch (or H/W) is only half the job: exporters compute
shapes at run time (Shape -> Gather/Slice -> Concat -> Reshape), and a converter that meets a Shape op
either rejects it or runs it on the CPU. Once every dim feeding such a chain is known, the chain is a
constant: this pass replaces Shape/Size of statically shaped tensors with their values (from onnx shape
inference) and constant-folds what follows, repeating until nothing changes.

Dimension syntax (the contract's, shared with `--input-shape`):
    INPUT:AXIS=V   axis AXIS of input INPUT (negative axes count from the end)
    DIMPARAM=V     every input dim whose symbolic name is DIMPARAM
    batch=V        axis 0 of every input whose axis 0 is symbolic
A symbolic name fixed on an input is substituted in the declared output and value_info shapes too.
Refused: unknown input/axis/name (with close names), a dim already fixed to another value. Shape ops that
still read a dynamic tensor afterwards are listed as refusals with the dims that keep them dynamic.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

import onnx

from quantscan.errors import UsageError
from quantscan.graph.edit import (
    copy_model,
    node_label,
)
from quantscan.graph.index import GraphIndex
from quantscan.rewrites.base import Change, Refusal, RewriteResult
from quantscan.rewrites.folding import fold_decided, fold_static_shapes, is_static_dim
from quantscan.rewrites.freeze_input import freeze_input
from quantscan.runner import load_error

REWRITE_ID = "fix-dim"


@dataclass(frozen=True)
class DimSetting:
    """One parsed `--fix-dim` / `--input-shape` dimension assignment."""

    text: str
    value: int
    input: str | None = None
    axis: int | None = None
    param: str | None = None
    batch: bool = False


def parse_dim_spec(text: str) -> DimSetting:
    """Parse `INPUT:AXIS=V`, `DIMPARAM=V` or `batch=V`; raise UsageError saying what was expected."""
    left, sep, right = text.strip().rpartition("=")
    expected = "expected INPUT:AXIS=V, DIMPARAM=V or batch=V with V a positive integer"
    if not sep or not left:
        raise UsageError(f"bad dimension {text!r}: {expected}")
    try:
        value = int(right)
    except ValueError:
        raise UsageError(f"bad dimension {text!r}: {expected}, found value {right!r}") from None
    if value <= 0:
        raise UsageError(f"bad dimension {text!r}: {expected}, found {value}")
    if left == "batch":
        return DimSetting(text, value, batch=True)
    name, colon, axis = left.rpartition(":")
    if colon and name:
        try:
            return DimSetting(text, value, input=name, axis=int(axis))
        except ValueError:
            pass  # not an axis: the whole left side is a symbolic name that contains ':'
    return DimSetting(text, value, param=left)


def _dim_text(dim: onnx.TensorShapeProto.Dimension) -> str:
    if dim.HasField("dim_param") and dim.dim_param:
        return repr(dim.dim_param)
    return "?" if not dim.HasField("dim_value") else str(dim.dim_value)


def fix_dim(
    model: onnx.ModelProto, dims: Sequence[str | DimSetting], frozen: Sequence[str] = (), check_load: bool = False
) -> RewriteResult:
    """Fix the requested dims and fold the shape chains they make static; new model + record. With
    `check_load` (the rewrite pipeline, whose result is handed on), a dim that would make the model
    unloadable through an If branch it cannot run is refused (see `_contradicting`; `frozen`: the
    freeze-input settings of the same request, applied after this pass), the others applied; in-memory
    planning leaves it out (it costs a session per dim)."""
    settings = [d if isinstance(d, DimSetting) else parse_dim_spec(d) for d in dims]
    refused = _contradicting(model, settings, frozen) if check_load else {}
    result = _fix_dims(model, [s for s in settings if s.text not in refused])
    result.refusals.extend(Refusal(REWRITE_ID, s.text, refused[s.text]) for s in settings if s.text in refused)
    return result


def _contradicting(model: onnx.ModelProto, settings: Sequence[DimSetting], frozen: Sequence[str]) -> dict[str, str]:
    """The settings that make onnxruntime refuse a model it loaded before, with the reason.

    Why: onnxruntime type-checks every If branch, taken or not. silero-vad's wheel model holds a 16 kHz
    and an 8 kHz branch chosen by its `sr` input; fixing the input length at 576 (16 kHz framing) makes
    the 8 kHz branch's Squeeze invalid, so the fixed model cannot be loaded at all until the If on `sr`
    is folded (`--freeze-input sr=16000`, which runs before fix-dim). Only models with a top-level If
    are tried (elsewhere a contradiction would sit in the graph that runs: the dims are simply wrong)."""
    if not settings or not any(n.op_type == "If" for n in model.graph.node) or load_error(model) is not None:
        return {}
    if load_error(_declared_only(model, settings, frozen)) is None:
        return {}
    hint = _freeze_hint(model)
    refused: dict[str, str] = {}
    for s in settings:
        error = load_error(_declared_only(model, [s], frozen))
        if error is not None:
            refused[s.text] = (f"{s.text} makes onnxruntime refuse the model through an If branch that "
                               f"this size never runs ({error[:160]}); {hint}")
    if not refused:  # only together: refuse them all, they cannot be applied as one
        error = load_error(_declared_only(model, settings, frozen)) or ""
        refused = {s.text: f"together these sizes make onnxruntime refuse the model ({error[:160]}); {hint}"
                   for s in settings}
    return refused


def _declared_only(model: onnx.ModelProto, settings: Sequence[DimSetting], frozen: Sequence[str]) -> onnx.ModelProto:
    """`model` with only the declared dims set (no folding), then the frozen inputs folded: what
    onnxruntime would be given once the request's later freeze-input has run."""
    declared = _set_dims(copy_model(model), settings, RewriteResult(model=model), {})
    if not frozen:
        return declared
    return freeze_input(declared, frozen).model


def _freeze_hint(model: onnx.ModelProto) -> str:
    """The flag that folds the top-level Ifs on setting inputs first (they decide which branch runs)."""
    from quantscan.graph.conditions import if_conditions

    settings = sorted({s for path, c in if_conditions(model).items() if "/" not in path for s in c.settings})
    if not settings:
        return "fold the If that holds the branch first"
    flags = " ".join(f"--freeze-input {s}=VALUE" for s in settings)
    return f"fold the If first: add {flags} (the value you deploy with)"


def _fix_dims(model: onnx.ModelProto, settings: Sequence[DimSetting]) -> RewriteResult:
    out = copy_model(model)
    result = RewriteResult(model=out)
    graph = out.graph
    fixed_params: dict[str, int] = {}
    _set_dims(out, settings, result, fixed_params)
    if not result.changes:
        return result
    unknowns: list[str] = []
    init_names = {t.name for t in graph.initializer}
    inputs = [vi for vi in graph.input if vi.name not in init_names]
    for vi in list(graph.output) + list(graph.value_info) + inputs:
        for dim in vi.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in fixed_params:
                dim.dim_value = fixed_params[dim.dim_param]
            elif dim.HasField("dim_value") and dim.dim_value < 0:
                # Paddle writes -1 for "dynamic": not a valid ONNX dim, and once an input dim is fixed it
                # contradicts shape inference. Unknown is what it meant.
                dim.Clear()
                unknowns.append(vi.name)
    if unknowns:
        names = ", ".join(sorted(set(unknowns)))
        result.changes.append(Change(REWRITE_ID, names, "declared -1 dims made unknown (invalid in ONNX)"))
    _fold_static_shapes(out, result)
    _fold_decided_ifs(out, result)
    return result


def _set_dims(
    out: onnx.ModelProto, settings: Sequence[DimSetting], result: RewriteResult, fixed_params: dict[str, int]
) -> onnx.ModelProto:
    """Set the declared input dims (in place), recording changes, refusals and the dim_params fixed."""
    init_names = {t.name for t in out.graph.initializer}
    inputs = [vi for vi in out.graph.input if vi.name not in init_names]
    for s in settings:
        for vi, axis in _targets(s, inputs, result):
            shape_dims = vi.type.tensor_type.shape.dim
            dim = shape_dims[axis]
            where = f"{vi.name} axis {axis}"
            if is_static_dim(dim):
                if dim.dim_value != s.value:
                    result.refusals.append(
                        Refusal(REWRITE_ID, vi.name, f"{where} is fixed at {dim.dim_value}, asked {s.value}")
                    )
                continue
            before = _dim_text(dim)
            if dim.HasField("dim_param") and dim.dim_param:
                fixed_params[dim.dim_param] = s.value
            dim.dim_value = s.value
            result.changes.append(Change(REWRITE_ID, vi.name, f"{where}: {before} -> {s.value} ({s.text})"))
    return out


def _fold_decided_ifs(model: onnx.ModelProto, result: RewriteResult) -> None:
    """Inline the Ifs whose conditions the fixed sizes decided (silero's "squeeze if dim == 1"), so the
    flags `check` names for them fold them with fix-dim alone. Only when one exists: a graph without If
    keeps exactly the fold it had."""
    if not any(n.op_type == "If" for n in model.graph.node):
        return
    dynamic = "still has a dynamic shape"
    fold_decided(model, result, REWRITE_ID)
    index = GraphIndex(model.graph, ir_version=model.ir_version)
    live = {node_label(n) for n in model.graph.node if n.op_type in ("Shape", "Size") and index.use_count(n.output[0])}
    kept = [r for r in result.refusals if dynamic not in r.reason]  # each round re-listed them: once, if live
    seen: set[str] = set()
    for r in result.refusals:
        if dynamic in r.reason and r.node in live and r.node not in seen:
            kept.append(r)
            seen.add(r.node)
    result.refusals = kept


def _targets(
    s: DimSetting, inputs: list[onnx.ValueInfoProto], result: RewriteResult
) -> list[tuple[onnx.ValueInfoProto, int]]:
    """The (input, axis) pairs a setting addresses; records a refusal when it addresses none."""
    names = [vi.name for vi in inputs]
    if s.input is not None and s.axis is not None:
        match = [vi for vi in inputs if vi.name == s.input]
        if not match:
            close = difflib.get_close_matches(s.input, names, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else f"; inputs: {', '.join(names)}"
            result.refusals.append(Refusal(REWRITE_ID, s.input, f"no input named {s.input!r}{hint}"))
            return []
        rank = len(match[0].type.tensor_type.shape.dim)
        axis = s.axis + rank if s.axis < 0 else s.axis
        if not 0 <= axis < rank:
            result.refusals.append(
                Refusal(REWRITE_ID, s.input, f"{s.input} has rank {rank}, no axis {s.axis}")
            )
            return []
        return [(match[0], axis)]
    found: list[tuple[onnx.ValueInfoProto, int]] = []
    for vi in inputs:
        shape_dims = vi.type.tensor_type.shape.dim
        for axis, dim in enumerate(shape_dims):
            if s.batch and axis == 0 and not is_static_dim(dim):
                found.append((vi, 0))
            elif not s.batch and dim.HasField("dim_param") and dim.dim_param == s.param:
                found.append((vi, axis))
    if not found:
        if s.batch:
            reason = "no input has a symbolic axis 0"
        else:
            params = sorted(
                {d.dim_param for vi in inputs for d in vi.type.tensor_type.shape.dim if d.dim_param}
            )
            close = difflib.get_close_matches(s.param or "", params, n=3)
            listing = ", ".join(close or params) or "none"
            reason = f"no input dim is named {s.param!r} (symbolic dims: {listing})"
        result.refusals.append(Refusal(REWRITE_ID, s.text, reason))
    return found


def _fold_static_shapes(model: onnx.ModelProto, result: RewriteResult) -> None:
    fold_static_shapes(model, result, REWRITE_ID)


