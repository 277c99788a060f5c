"""`freeze-input NAME=VALUE`: make a graph input a constant and fold what it decides (Shape, If, Where...).

Why: exporters keep settings as inputs. silero-vad takes its sample rate `sr` and branches on it with
an If whose two bodies each hold the whole network (an LSTM inside); no NPU compiles an If, and a scan
cannot quantize inside one. A deployment runs one sample rate: with `sr` frozen, `Equal(sr, 16000)` is a
constant, the If is replaced by the nodes of the branch it takes, and whatever else becomes constant
folds too (Shape of tensors whose shape is now static, Where on a constant condition, the Ifs nested in
the inlined branch on such conditions), until nothing changes.

The input is removed from the graph and the value becomes an initializer of the input's declared type
and shape (a scalar for `sr`; a symbolic dim must be fixed first with fix-dim). Inlining renames a branch
tensor only when its name is taken in the outer graph; branch outputs keep the If's output names. A Loop
whose trip count becomes constant is left as it is (unrolling is not done here) and listed as refused.
The proof runs the original with the input fed VALUE against the frozen model (`rewrites.pipeline`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from quantscan.errors import UsageError
from quantscan.graph.edit import add_initializer, copy_model, node_label
from quantscan.graph.index import GraphIndex, is_op, tensor_info
from quantscan.rewrites.base import Change, Refusal, RewriteResult
from quantscan.rewrites.folding import fold_decided

REWRITE_ID = "freeze-input"


@dataclass(frozen=True)
class FrozenInput:
    """One parsed `--freeze-input NAME=VALUE`."""

    name: str
    value: float


def parse_freeze_spec(text: str) -> FrozenInput:
    """`NAME=VALUE` with VALUE a finite number; UsageError saying what was expected otherwise."""
    name, sep, raw = text.strip().partition("=")
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not sep or not name or not np.isfinite(value):
        raise UsageError(f"--freeze-input: expected NAME=NUMBER, found {text!r}")
    return FrozenInput(name.strip(), value)


def frozen_values(model: onnx.ModelProto, specs: Sequence[str | FrozenInput]) -> dict[str, np.ndarray]:
    """The array each frozen input takes: its declared dtype and static shape, filled with VALUE.

    Raises UsageError for a name that is no graph input, a symbolic dim, or a value the dtype cannot hold.
    """
    inits = {t.name for t in model.graph.initializer}
    declared = {vi.name: vi for vi in model.graph.input if vi.name not in inits}
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        s = parse_freeze_spec(spec) if isinstance(spec, str) else spec
        if s.name not in declared:
            raise UsageError(f"--freeze-input: expected one of the inputs {sorted(declared)}, found {s.name!r}")
        info = tensor_info(declared[s.name].type)
        if info.shape is None or not info.is_static or not info.elem_type:
            raise UsageError(
                f"--freeze-input {s.name}: expected a static shape and a type, found shape "
                f"{list(info.shape) if info.shape is not None else 'unknown'} (fix its dims with --fix-dim first)"
            )
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(info.elem_type))
        value = np.full([int(d) for d in info.shape if isinstance(d, int)], s.value).astype(dtype)
        if not np.all(value.astype(np.float64) == s.value):
            raise UsageError(f"--freeze-input {s.name}: expected a value {dtype} can hold, found {s.value:g}")
        out[s.name] = value
    return out


def freeze_input(model: onnx.ModelProto, specs: Sequence[str | FrozenInput]) -> RewriteResult:
    """Freeze the named inputs to their values and fold the graph they decide; the input is not mutated."""
    values = frozen_values(model, specs)
    out = copy_model(model)
    result = RewriteResult(model=out)
    _replace_inputs(out, values, result)
    fold_decided(out, result, REWRITE_ID)
    result.refusals = [r for r in result.refusals if "still has a dynamic shape" not in r.reason]
    _refuse_constant_loops(out, result)
    return result


def _replace_inputs(model: onnx.ModelProto, values: Mapping[str, np.ndarray], result: RewriteResult) -> None:
    kept = [vi for vi in model.graph.input if vi.name not in values]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    for name, value in values.items():
        add_initializer(model, name, value)
        shown = value.reshape(-1)[0].item() if value.size else value.tolist()
        detail = f"input {name!r} frozen to {shown} ({value.dtype}, shape {list(value.shape)})"
        result.changes.append(Change(REWRITE_ID, name, detail))


def _refuse_constant_loops(model: onnx.ModelProto, result: RewriteResult) -> None:
    index = GraphIndex(model.graph, ir_version=model.ir_version)
    for node in model.graph.node:
        if is_op(node, "Loop") and node.input and index.constant(node.input[0]) is not None:
            result.refusals.append(
                Refusal(REWRITE_ID, node_label(node), "Loop with a constant trip count: unrolling is not done here")
            )
