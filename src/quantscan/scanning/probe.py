"""Pass 0, the probe: one sample through the prepared model gives every tensor's true dtype and shape,
which outputs the headline counts and which are classifiers, and whether the model runs a batch.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from quantscan import graph as qgraph
from quantscan import metrics as qm
from quantscan.calib import CalibSet
from quantscan.errors import ModelError, SessionError, UsageError
from quantscan.graph.index import GraphIndex
from quantscan.graph.infer import declared_ranks
from quantscan.model import LoadedModel, PreparedModel
from quantscan.runner import Runner


def is_state_output(name: str, shape: tuple[int, ...], inputs: Mapping[str, tuple[int, ...]]) -> bool:
    """A recurrent state output (e.g. silero's `stateN` for input `state`) is not a headline output."""
    return any(name != i and name.startswith(i) and tuple(shape) == tuple(s) for i, s in inputs.items())


@dataclass
class Probe:
    float_tensors: set[str]
    tensor_order: list[str]
    shapes: dict[str, tuple[int, ...]]
    input_shapes: dict[str, tuple[int, ...]]
    outputs: list[str]
    preparation_check: dict[str, float]
    warnings: list[str]
    activation_bytes: int = 0
    """Bytes of every float activation the prepared model computes, per sample (the memory plan's unit)."""
    largest_bytes: int = 0
    """Bytes of the largest float activation, per sample."""


def probe_model(loaded: LoadedModel, prepared: PreparedModel, cset: CalibSet, batch_size: int, runner: Runner) -> Probe:
    """Pass 0: run the prepared model once with every tensor exposed; compare its outputs with the original.

    Run at the smallest batch (1, or the model's fixed batch): every activation comes back whole, so
    this pass alone would cost a whole batch of activations twice over before any budget is known.
    """
    names = [o for n in prepared.proto.graph.node for o in n.output if o]
    exposed = qgraph.expose(prepared.proto, names)
    feeds = next(iter(cset.batches(batch_size)))
    original = runner.session(loaded.proto).run(feeds)  # the user's model first: its faults are bad input
    session = runner.session(exposed, built=True)
    values = session.run(feeds)
    floats = {k for k, v in {**feeds, **values}.items() if np.issubdtype(v.dtype, np.floating)}
    check_declared_ranks(prepared.proto, {k: values[k].shape for k in floats if k in values}, feeds)
    samples = _samples_in(feeds)
    sizes = [v.nbytes // samples for k, v in values.items() if k in floats]
    check: dict[str, float] = {}
    warnings: list[str] = []
    for name, ref in original.items():
        if name not in values or not np.issubdtype(ref.dtype, np.floating):
            continue
        acc = qm.ErrorAccumulator()
        acc.update(ref, values[name])
        check[name] = acc.max_abs
        scale = float(np.nanmax(np.abs(ref))) if ref.size and np.isfinite(ref).any() else 1.0
        if acc.max_abs > 1e-3 * max(scale, 1e-6):
            warnings.append(
                f"prepared model differs from the original on output '{name}' (max abs {acc.max_abs:.3g}); "
                "BN folding or the opset upgrade changed its numbers"
            )
    return Probe(
        float_tensors=floats,
        tensor_order=names,
        shapes={k: tuple(v.shape) for k, v in values.items()},
        input_shapes={k: tuple(v.shape) for k, v in feeds.items()},
        outputs=[o.name for o in prepared.proto.graph.output],
        preparation_check=check,
        warnings=warnings,
        activation_bytes=int(sum(sizes)),
        largest_bytes=int(max(sizes, default=0)),
    )


def check_declared_ranks(model: onnx.ModelProto, shapes: Mapping[str, tuple[int, ...]],
                         feeds: Mapping[str, np.ndarray]) -> None:
    """Every float tensor has, when run, the rank the model's declarations give it; else one `ModelError`.

    Why before any graph of ours is built: onnxruntime ranks a tensor from the declarations (a Loop body
    input declared [1] makes the Loop's scan output rank 2) and refuses a reduction over the axes the tensor
    really has (rank 3), which looked like our bug (exit 3). The declaration is the model's fault: say which."""
    declared = declared_ranks(model)
    for name, shape in shapes.items():
        rank = declared.get(name)
        if rank is None or rank == len(shape):
            continue
        node = next((n for n in model.graph.node if name in n.output), None)
        made_by = f" ({node.op_type} node '{node.name}')" if node is not None else ""
        raise ModelError(f"expected tensor '{name}'{made_by} to have the rank the model declares, found rank "
                         f"{len(shape)} {list(shape)} when run where its declarations give rank {rank}"
                         f"{_wrong_declaration(node, shapes, feeds)}")


def _wrong_declaration(node: onnx.NodeProto | None, shapes: Mapping[str, tuple[int, ...]],
                       feeds: Mapping[str, np.ndarray]) -> str:
    """For a Loop, the body input whose declared rank is not that of the value the Loop gives it."""
    if node is None or node.op_type != "Loop":
        return ": a declared input or output shape is wrong"
    body = next((a.g for a in node.attribute if a.name == "body"), None)
    real = {**{k: tuple(v.shape) for k, v in feeds.items()}, **shapes}
    if body is not None:
        pairs = list(zip(node.input, body.input, strict=False))[2:]  # past the trip count and the condition
        for outer, inner in pairs:
            dims = inner.type.tensor_type.shape.dim if inner.type.HasField("tensor_type") else []
            if outer in real and inner.type.tensor_type.HasField("shape") and len(dims) != len(real[outer]):
                declared = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
                return (f": the Loop body input '{inner.name}' declares rank {len(dims)} {declared} and receives "
                        f"'{outer}' of rank {len(real[outer])} {list(real[outer])}")
    return ": a declared shape in the Loop body is wrong"


def batch_refused(loaded: LoadedModel, cset: CalibSet, batch_size: int, runner: Runner) -> str:
    """"" when the model runs on the first `batch_size` samples at once, else onnxruntime's message.

    Why: the probe runs one sample, and a model can run on one and not on more: an input pinned to batch 1
    (silero's LSTM state frozen with `--const state=0`: initial_h must be [2, N, 128]). Found here, the
    scan falls back to one sample per run instead of failing in calibration with onnxruntime's error.
    """
    feeds = next(iter(cset.batches(batch_size)))
    if _samples_in(feeds) <= 1:
        return ""
    try:
        runner.session(loaded.proto).run(feeds)
    except SessionError as exc:
        return str(exc).removeprefix("onnxruntime could not run the model: ")
    return ""


def _samples_in(feeds: Mapping[str, np.ndarray]) -> int:
    """Samples in a batch of feeds: the first input's leading dim (rank-0 inputs: one sample)."""
    first = next(iter(feeds.values()), None)
    return max(1, int(first.shape[0])) if first is not None and first.ndim else 1


def headline_outputs(probe: Probe, requested: Sequence[str], states: Collection[str] = ()) -> list[str]:
    """The graph outputs the headline uses: `--output`, else the float outputs that are not recurrent
    state: neither named like one (silero's `stateN`) nor an OUT of `--state` (`states`: a decoder's
    `present.N`, whose cache cosine would otherwise be the worst output and hide the logits')."""
    if requested:
        missing = [o for o in requested if o not in probe.outputs]
        if missing:
            raise UsageError(f"--output: expected one of {', '.join(probe.outputs)}, found {', '.join(missing)}")
        return list(requested)
    chosen = [
        o for o in probe.outputs
        if o in probe.float_tensors and o not in states
        and not is_state_output(o, probe.shapes.get(o, ()), probe.input_shapes)
    ]
    chosen = chosen or [o for o in probe.outputs if o in probe.float_tensors]
    if not chosen:
        raise ModelError(f"expected a float graph output to measure int8 error on, found none among "
                         f"{', '.join(probe.outputs[:8]) or 'the outputs'} (integer, boolean or non-tensor outputs)")
    return chosen


def classifier_outputs(prepared: PreparedModel, outputs: Sequence[str], probe: Probe) -> set[str]:
    """Outputs a Softmax (possibly through Identity/Reshape) produces, with a class axis of ≥ 2; a
    Softmax written out as Exp/ReduceSum/Div (jax2tf, TF exports) counts as one."""
    producers = {o: n for n in prepared.proto.graph.node for o in n.output}
    found = set()
    for name in outputs:
        node = producers.get(name)
        while node is not None and node.op_type in ("Identity", "Reshape", "Flatten", "Squeeze"):
            node = producers.get(node.input[0])
        if node is not None and _is_softmax(prepared, node) and qm.looks_like_classifier(probe.shapes.get(name, ())):
            found.add(name)
    return found


def _is_softmax(prepared: PreparedModel, node: onnx.NodeProto) -> bool:
    """A Softmax/LogSoftmax node, or the last node of a decomposed Softmax (patterns/softmax.py)."""
    from quantscan.patterns import softmax

    if node.op_type in ("Softmax", "LogSoftmax"):
        return True
    if node.op_type not in ("Div", "Mul"):
        return False
    index = GraphIndex(prepared.proto.graph, ir_version=prepared.proto.ir_version)
    for exp in (index.producer_node(i) for i in node.input if i):
        found = softmax.match_at(index, exp) if exp is not None and exp.op_type == "Exp" else None
        if isinstance(found, softmax.SoftmaxMatch) and found.output == node.output[0]:
            return True
    return False
