"""`fold-bn`: fold inference-mode BatchNormalization into the preceding Conv / ConvTranspose / Gemm.

Why: every NPU compiler does this before quantizing, so a fake-quant point between a Conv and its BN
measures an error no chip makes. The fold is exact up to float32 rounding:
    W' = W·γ/√(σ²+ε) on the output-channel axis,   b' = (b−μ)·γ/√(σ²+ε) + β.

Naming: the folded node keeps the Conv's name and takes over the BN's output tensor name, so tensors
downstream (and graph outputs) keep the names of the original model and per-tensor reports line up.

Shared weights: when the producer's weight (or bias) is also read by another node, the folded node gets
its own scaled copy and the other reader keeps the original. Copying is chosen over refusing because the
scan must fold every BN a chip folds; a compiler does the same. The change says "copied".

Refused (left unchanged, with the reason): training-mode BN, non-constant BN parameters, producer output
read by another node or a graph output, non-constant weights/bias, a producer that is not a
Conv/ConvTranspose/Gemm, channel-count mismatches.
"""

from __future__ import annotations

import numpy as np
import onnx

from quantscan.graph.edit import (
    add_initializer,
    attr_float,
    attr_int,
    copy_model,
    drop_value_info,
    get_attr,
    make_constant_node,
    node_label,
    prune_unused,
    set_attr,
    splice,
    unique_name,
)
from quantscan.graph.index import GraphIndex
from quantscan.rewrites.base import Change, Refusal, RewriteResult

REWRITE_ID = "fold-bn"
FOLDABLE = ("Conv", "ConvTranspose", "Gemm")
_FLOATS = (np.float16, np.float32, np.float64)


def fold_batchnorm(model: onnx.ModelProto) -> RewriteResult:
    """Fold every foldable BatchNormalization; return a new model plus changes and refusals."""
    out = copy_model(model)
    graph = out.graph
    index = GraphIndex(graph, ir_version=out.ir_version)
    taken = index.taken_names()
    result = RewriteResult(model=out)
    position = {o: k for k, n in enumerate(graph.node) for o in n.output if o}
    remove: set[int] = set()  # positions of BN nodes folded away
    insert_before: dict[int, list[onnx.NodeProto]] = {}  # Constant nodes placed before a producer
    orphan_candidates: set[str] = set()
    stale_names: set[str] = set()

    for pos, bn in enumerate(graph.node):
        if bn.op_type != "BatchNormalization" or bn.domain not in ("", "ai.onnx"):
            continue
        plan = _plan(bn, index)
        if isinstance(plan, str):
            result.refusals.append(Refusal(REWRITE_ID, node_label(bn), plan))
            continue
        producer, new_w, new_b, note = plan
        consts = _apply(producer, bn, new_w, new_b, index, taken, out)
        if consts:
            insert_before.setdefault(position[bn.input[0]], []).extend(consts)
        orphan_candidates.update(i for i in list(bn.input[1:]) if i)
        orphan_candidates.update(note.replaced)
        stale_names.add(bn.input[0])
        remove.add(pos)
        result.changes.append(
            Change(
                REWRITE_ID,
                node_label(producer),
                f"folded {node_label(bn)} into {producer.op_type} {node_label(producer)}"
                + (f"; {note.text}" if note.text else ""),
            )
        )

    if remove or insert_before:
        splice(graph, remove, insert_before)
        drop_value_info(graph, stale_names)
        prune_unused(graph, orphan_candidates)
    return result


class _Note:
    """What a fold did beyond the arithmetic (copied shared weights, added bias) and what it replaced."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.replaced: list[str] = []

    @property
    def text(self) -> str:
        return "; ".join(self.parts)


def _plan(
    bn: onnx.NodeProto, index: GraphIndex
) -> str | tuple[onnx.NodeProto, np.ndarray, np.ndarray, _Note]:
    """Compute the folded weight and bias for one BN, or return the reason it cannot be folded."""
    stats = _bn_statistics(bn, index)
    if isinstance(stats, str):
        return stats
    producer = _foldable_producer(bn, index)
    if isinstance(producer, str):
        return producer
    weights = _producer_weights(producer, index)
    if isinstance(weights, str):
        return weights
    w, b, has_bias = weights
    gamma, beta, mean, var, eps = stats
    factor = gamma / np.sqrt(var + eps)
    folded = _folded(producer, w, b, factor, mean, beta)
    if isinstance(folded, str):
        return folded
    new_w, new_b = folded
    note = _note(producer, index, has_bias)
    return producer, new_w.astype(w.dtype), np.ascontiguousarray(new_b).astype(w.dtype), note


_Stats = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]


def _bn_statistics(bn: onnx.NodeProto, index: GraphIndex) -> str | _Stats:
    """(gamma, beta, mean, var, epsilon) of an inference-mode BN with constant parameters, or why not."""
    if get_attr(bn, "training_mode", 0) == 1:
        return "BN is in training mode (training_mode=1): batch statistics, not constants"
    if len([o for o in bn.output if o]) > 1:
        return "BN produces running statistics (training outputs): not an inference-mode BN"
    if get_attr(bn, "spatial", 1) == 0:
        return "BN has spatial=0 (per-element statistics): not a per-channel affine"
    if len(bn.input) < 5:
        return "BN has fewer than 5 inputs"
    params = [index.constant(name) for name in bn.input[1:5]]
    if any(p is None for p in params):
        missing = [n for n, p in zip(bn.input[1:5], params, strict=True) if p is None]
        return f"BN parameters are not constant: {', '.join(missing)}"
    gamma, beta, mean, var = (np.asarray(p, dtype=np.float64).reshape(-1) for p in params)  # type: ignore[arg-type]
    if not all(p.size == gamma.size for p in (beta, mean, var)):
        return "BN parameters have different lengths"
    return gamma, beta, mean, var, attr_float(bn, "epsilon", 1e-5)


def _foldable_producer(bn: onnx.NodeProto, index: GraphIndex) -> str | onnx.NodeProto:
    """The Conv/ConvTranspose/Gemm the BN alone reads from, or why the BN cannot go into it."""
    x = bn.input[0]
    producer = index.producer_node(x)
    if producer is None:
        return f"BN input {x!r} is a graph input, not the output of a Conv/ConvTranspose/Gemm"
    if producer.op_type not in FOLDABLE or producer.domain not in ("", "ai.onnx"):
        return f"not preceded by a foldable op: input comes from {producer.op_type} {node_label(producer)}"
    if index.use_count(x) > 1:
        others = [node_label(n) for n in index.readers(x) if n is not bn]
        if x in index.graph_outputs:
            others.append("graph output")
        return f"BN input has another consumer ({', '.join(others)}): folding would change it"
    return producer


def _producer_weights(
    producer: onnx.NodeProto, index: GraphIndex
) -> str | tuple[np.ndarray, np.ndarray | None, bool]:
    """(weight, bias or None, whether a bias input exists) when both are float constants, or why not."""
    if len(producer.input) < 2 or not producer.input[1]:
        return f"{producer.op_type} {node_label(producer)} has no weight input"
    w = index.constant(producer.input[1])
    if w is None:
        return f"{producer.op_type} weight {producer.input[1]!r} is not constant"
    if w.dtype.type not in _FLOATS:
        return f"{producer.op_type} weight has dtype {w.dtype}, not float"
    has_bias = len(producer.input) > 2 and bool(producer.input[2])
    b = index.constant(producer.input[2]) if has_bias else None
    if has_bias and b is None:
        return f"{producer.op_type} bias {producer.input[2]!r} is not constant"
    return w, b, has_bias


def _folded(
    producer: onnx.NodeProto, w: np.ndarray, b: np.ndarray | None, factor: np.ndarray, mean: np.ndarray,
    beta: np.ndarray,
) -> str | tuple[np.ndarray, np.ndarray]:
    """W' = W·γ/√(σ²+ε) along the producer's output channels, b' = (b−μ)·γ/√(σ²+ε)+β (float64)."""
    channels = factor.size
    w64 = w.astype(np.float64)
    if producer.op_type == "Conv":
        if w.ndim < 2 or w.shape[0] != channels:
            return f"Conv has {w.shape[0] if w.ndim else '?'} output channels, BN has {channels}"
        new_w = w64 * factor.reshape((-1,) + (1,) * (w.ndim - 1))
        bias = b.astype(np.float64).reshape(-1) if b is not None else np.zeros(channels)
        return new_w, (bias - mean) * factor + beta
    if producer.op_type == "ConvTranspose":
        group = attr_int(producer, "group", 1)
        if w.ndim < 2 or w.shape[0] % group:
            return "ConvTranspose weight shape does not match its group count"
        c_out = group * w.shape[1]
        if c_out != channels:
            return f"ConvTranspose has {c_out} output channels, BN has {channels}"
        # weight [C_in, C_out/g, k...]: output channel g*(C_out/g)+j lives at [g-block, j]
        blocks = w64.reshape((group, w.shape[0] // group, w.shape[1]) + w.shape[2:])
        f = factor.reshape((group, 1, w.shape[1]) + (1,) * (w.ndim - 2))
        bias = b.astype(np.float64).reshape(-1) if b is not None else np.zeros(channels)
        return (blocks * f).reshape(w.shape), (bias - mean) * factor + beta
    # Gemm: Y = alpha·A'·B' + beta·C, output channel = column of Y
    if w.ndim != 2:
        return "Gemm weight is not 2-D"
    trans_b = attr_int(producer, "transB", 0)
    if w.shape[0 if trans_b else 1] != channels:
        return f"Gemm has {w.shape[0 if trans_b else 1]} output columns, BN has {channels}"
    new_w = w64 * (factor.reshape(-1, 1) if trans_b else factor.reshape(1, -1))
    bias64 = attr_float(producer, "beta", 1.0) * b.astype(np.float64) if b is not None else np.zeros(channels)
    new_b = (bias64 - mean) * factor + beta
    return new_w, np.broadcast_to(new_b, (channels,)) if new_b.ndim == 0 else new_b


def _note(producer: onnx.NodeProto, index: GraphIndex, has_bias: bool) -> _Note:
    """What the fold changes besides the numbers: shared weights copied, a bias added, the tensors replaced."""
    note = _Note()
    if index.use_count(producer.input[1]) > 1:
        note.parts.append(f"weight {producer.input[1]!r} is shared: folded into a copy")
    if has_bias and index.use_count(producer.input[2]) > 1:
        note.parts.append(f"bias {producer.input[2]!r} is shared: folded into a copy")
    if not has_bias:
        note.parts.append("bias added")
    note.replaced.append(producer.input[1])
    if has_bias:
        note.replaced.append(producer.input[2])
    return note


def _apply(
    producer: onnx.NodeProto,
    bn: onnx.NodeProto,
    new_w: np.ndarray,
    new_b: np.ndarray,
    index: GraphIndex,
    taken: set[str],
    model: onnx.ModelProto,
) -> list[onnx.NodeProto]:
    """Point the producer at fresh weight/bias tensors and make it write the BN's output tensor.

    Returns the Constant nodes to insert before the producer when its weights lived in Constant nodes
    (the fold keeps the exporter's style); initializers are appended to the graph directly.
    """
    consts: list[onnx.NodeProto] = []
    as_constant_node = producer.input[1] in index.constant_nodes
    w_name = unique_name(f"{producer.input[1]}_bnfold", taken)
    has_bias = len(producer.input) > 2 and bool(producer.input[2])
    b_base = producer.input[2] if has_bias else f"{producer.input[1]}_bias"
    b_name = unique_name(f"{b_base}_bnfold", taken)
    for name, value in ((w_name, new_w), (b_name, new_b)):
        if as_constant_node:
            const = make_constant_node(name, value, unique_name(f"{name}_const", taken))
            consts.append(const)
        else:
            add_initializer(model, name, value)
    inputs = list(producer.input)
    inputs[1] = w_name
    if len(inputs) > 2:
        inputs[2] = b_name
    else:
        inputs.append(b_name)
    del producer.input[:]
    producer.input.extend(inputs)
    if producer.op_type == "Gemm":
        set_attr(producer, "beta", 1.0)
        if get_attr(producer, "broadcast") is not None:
            set_attr(producer, "broadcast", 1)
    producer.output[0] = bn.output[0]
    return consts
