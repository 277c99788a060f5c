"""`--const` on a setting input (one that decides an If): the scan folds the If as `rewrite --freeze-input` does.

Why: silero-vad as its wheel ships it takes its sample rate `sr` and branches on it with an If whose two
bodies each hold the whole network. With `--const sr=16000` the branch taken is known, but scanned as it
was, the If stayed: onnxruntime infers types and shapes inside *both* bodies of the analysis copy, whose
input dims are fixed from the data, and the 8 kHz body's Squeeze cannot take the 16 kHz window (exit 3,
an invalid graph quantscan built); and even where it loads, nothing inside an If body is quantized. A
value the user fixes for every sample is a frozen input: the scan measures the model `rewrite
--freeze-input NAME=VALUE` writes (same graph, same node and tensor names), so both routes give the same
layers.csv.

Only consts that reach an If's condition are folded: freezing a const that feeds data alone changes
nothing numerically and would only turn tensors the scan measures today into constants. The user's
input contract is kept (`LoadedModel.inputs`, run.json's inputs and consts still list the setting; its
const array is still fed and onnxruntime's sessions drop it), only `proto` is the folded graph.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from quantscan.calib.calibset import CalibSet
from quantscan.graph.edit import copy_model
from quantscan.graph.index import GraphIndex, is_op, tensor_info
from quantscan.model import LoadedModel, name_unnamed_nodes, set_input_dims
from quantscan.rewrites.base import Change
from quantscan.rewrites.freeze_input import FrozenInput, freeze_input
from quantscan.specs import Dim


@dataclass(frozen=True)
class FoldedSettings:
    """The model the scan measures and what was folded to get it (`frozen` empty: `loaded` unchanged)."""

    loaded: LoadedModel
    dims: dict[str, tuple[Dim, ...]]
    """The scan's input dims, the frozen inputs left out (the folded graph has no such input)."""
    frozen: dict[str, float]
    warning: str | None


def fold_setting_consts(
    loaded: LoadedModel, consts: Mapping[str, float], dims: Mapping[str, tuple[Dim, ...]],
    carried: Iterable[str] = (),
) -> FoldedSettings:
    """Freeze the `--const` inputs that decide an If and fold what they decide (rewrites.freeze_input).

    `carried` are the `--state` inputs: their const is only the first sample's value, never frozen.

    `dims` are the input dims the scan runs (the data's, `--input-shape`): written on the inputs first,
    as `rewrite --fix-dim` would, so the Ifs nested in the branch taken that test a shape (silero's
    decoder squeezes a time axis of 1, its LSTM tests the state's size) fold as well, and the LSTM inside
    them becomes a top-level node the scan quantizes.
    """
    names = [n for n in setting_inputs(loaded, consts) if n not in set(carried)]
    if not names:
        return FoldedSettings(loaded, dict(dims), {}, None)
    frozen = {name: float(consts[name]) for name in names}
    kept = {k: v for k, v in dims.items() if k not in frozen}
    sized = copy_model(loaded.proto)
    set_input_dims(sized, kept)
    result = freeze_input(sized, [FrozenInput(n, v) for n, v in frozen.items()])
    proto = result.model
    name_unnamed_nodes(proto)  # as load_model names the nodes of a model written by `rewrite`
    given = " ".join(f"{n}={v:g}" for n, v in frozen.items())
    return FoldedSettings(replace(loaded, proto=proto), kept, frozen, _folded_warning(loaded, result.changes, given))


def _folded_warning(loaded: LoadedModel, changes: Sequence[Change], given: str) -> str:
    """One line for the report: the user's Ifs the consts decided, how many nested ones folded with them."""
    folded = [c.node for c in changes if c.detail.startswith("If on a constant condition")]
    top = {n.name for n in loaded.proto.graph.node}
    named = [n for n in folded if n in top] or folded[:1]
    nested = len(folded) - len(named)
    inside = f" (and {nested} If{'s' if nested > 1 else ''} nested in the branch taken)" if nested else ""
    return (
        f"--const {given} decides {', '.join(named) or 'no If'}{inside}: folded as `quantscan rewrite MODEL "
        f"--fix-dim ... --freeze-input {given}` does with the scan's input dims; the scan measures the branch taken"
    )


def setting_inputs(loaded: LoadedModel, consts: Mapping[str, float]) -> list[str]:
    """The `--const` inputs with a static declared shape from which the condition of a top-level If is
    computed (freeze-input needs the shape; a const on a free dim keeps feeding the graph as before)."""
    index = GraphIndex.of(loaded.proto)
    conditions = {n.input[0] for n in index.nodes if is_op(n, "If") and n.input}
    declared = {vi.name: vi for vi in loaded.proto.graph.input}
    found = []
    for name in consts:
        info = tensor_info(declared[name].type) if name in declared else None
        if info is None or info.shape is None or not info.is_static or name in index.initializers:
            continue
        if conditions & _reached_from(index, name):
            found.append(name)
    return found


def _reached_from(index: GraphIndex, name: str) -> set[str]:
    """Every top-level tensor computed (directly or not) from tensor `name`, `name` included."""
    reached = {name}
    pending = [name]
    while pending:
        for node in index.users(pending.pop()):
            for out in node.output:
                if out and out not in reached:
                    reached.add(out)
                    pending.append(out)
    return reached


def unfed(cset: CalibSet, eval_set: CalibSet, frozen: Mapping[str, float]) -> tuple[CalibSet, CalibSet]:
    """Both sample sets without the frozen consts (the evaluation set stays the calibration set's object
    when it was one: run.json says so)."""
    if not frozen:
        return cset, eval_set
    calib = cset.without_consts(frozen)
    return calib, calib if eval_set is cset else eval_set.without_consts(frozen)
