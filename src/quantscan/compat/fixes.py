"""Suggested fixes: a rewrite (implemented by `quantscan rewrite`) where one exists, else words.

A `Fix` carries the text users read in compat.csv's `fix` column and, when that text names a
rewrite, the typed `RewriteId` (and its settings) that `compat.rewrite_plan` acts on, so nothing parses
the text back into ids.
"""

from __future__ import annotations

from dataclasses import dataclass

from quantscan.compat.profiles import Profile
from quantscan.records import RewriteId


@dataclass(frozen=True)
class Fix:
    """What a finding suggests: the words, plus the rewrite (and its settings) they name, if any."""

    text: str
    rewrite: RewriteId | None = None
    args: tuple[str, ...] = ()


def rewrite_fix(rewrite: RewriteId, *args: str) -> Fix:
    """A fix that is exactly one rewrite: its text is the id and settings (e.g. `fix-dim batch=1`)."""
    return Fix(" ".join((rewrite.value, *args)), rewrite, tuple(args))


_OP_REWRITES: dict[str, RewriteId] = {  # an Erf without Tanh on the chip: still the rewrite to try
    "Erf": RewriteId.GELU_TANH,
}

_OP_FIXES: dict[str, str] = {
    "Softmax": "keep it on CPU (cheap at the output) or apply softmax in post-processing",
    "LSTM": "keep on CPU (fallback precision), or replace the recurrence with Conv1d/GRU the chip supports",
    "GRU": "keep on CPU (fallback precision), or replace with ops the chip supports",
    "RNN": "keep on CPU (fallback precision), or replace with ops the chip supports",
    "Einsum": "rewrite the Einsum as Transpose/Reshape/MatMul in the exporter",
    "NonZero": "move data-dependent indexing (NonZero) to post-processing outside the model",
    "NonMaxSuppression": "run NMS in post-processing outside the model",
    "GridSample": "replace GridSample with Resize/gather-free warping or run it on CPU",
    "ScatterND": "replace ScatterND with Concat/Slice of static regions, or run it on CPU",
    "DFT": "compute the spectrum as a Conv1d with a fixed DFT basis, or pre-process outside the model",
    "STFT": "compute the STFT as a strided Conv1d with a fixed basis, or pre-process outside the model",
    "If": "export with the branch condition constant so the If folds away, or split the model",
    "Loop": "unroll the Loop at export time (fixed trip count) or run the loop outside the model",
    "Scan": "unroll the Scan at export time or run it outside the model",
    "GroupNormalization": "decompose GroupNormalization into Reshape/InstanceNormalization/Mul/Add",
    "Col2Im": "run Col2Im outside the model",
    "DeformConv": "replace DeformConv with a plain Conv or run it on CPU",
    "RoiAlign": "run RoiAlign on CPU or in post-processing",
}


def unsupported_op_fix(op: str, profile: Profile) -> Fix:
    """What to do about an op type the profile does not run on the NPU."""
    npu = profile.npu_ops
    if op == "HardSwish" and ("HardSigmoid" in npu or "Clip" in npu) and "Mul" in npu:
        return rewrite_fix(RewriteId.DECOMPOSE_HARDSWISH)
    if op == "HardSigmoid" and "Clip" in npu and "Mul" in npu:
        return rewrite_fix(RewriteId.DECOMPOSE_HARDSIGMOID)
    if op == "LayerNormalization" and "ReduceMean" in npu:
        return rewrite_fix(RewriteId.DECOMPOSE_LAYERNORM)
    if op in ("Gelu", "Erf") and "Tanh" in npu:
        return rewrite_fix(RewriteId.GELU_TANH)
    if op == "BatchNormalization":
        return rewrite_fix(RewriteId.FOLD_BN)
    if op == "Reciprocal" and "Div" in npu:
        return rewrite_fix(RewriteId.RECIPROCAL)
    if op == "Gelu":
        return Fix(
            "replace Gelu with an activation the chip runs (e.g. HardSwish/Relu) and re-train, or keep on CPU"
        )
    if op in _OP_REWRITES:
        return rewrite_fix(_OP_REWRITES[op])
    return Fix(
        _OP_FIXES.get(op, f"no rewrite: replace {op} with ops the profile supports, or accept CPU fallback")
    )


_LIMIT_FIXES: dict[str, str] = {
    "kernel": "split the kernel (e.g. stacked smaller kernels) or keep this layer on CPU",
    "stride": "use a supported stride and subsample after (Slice/MaxPool), or reshape frames into channels",
    "stride_symmetric": "use equal strides (stride 1 + a strided pool/Slice on one axis)",
    "dilation": "use dilation 1 (larger kernel) or a dilation the chip accepts",
    "pads": "move the padding into an explicit Pad before the layer",
    "channels_per_group": "split the layer along channels (Split + Concat)",
    "out_channels": "split the layer along output channels (Split + Concat)",
    "channels": "split the tensor along channels (Split + Concat)",
    "kernel_elements": "split along input channels and Add the partial results",
    "kernel_stride": "use a kernel/stride pair the chip lists, or keep this layer on CPU",
    "resize_scale": "use an integer (power-of-two) scale factor",
    "resize_mode": "use nearest or linear resize",
    "axis": "Transpose so the reduced/softmax axis is the one the chip supports",
    "axis_is_last": "Transpose so the axis is the last one",
    "rank": "Reshape to the rank the chip supports",
}


INNER_BATCH_FIX = ("keep this layer on CPU, or re-export with that axis folded into another: no input dim sets this "
                   "batch (e.g. a Reshape folds attention areas or heads into axis 0), so no fix-dim changes it")
STATIC_BATCH_FIX = ("re-export the model with batch 1: this is its input's batch, fixed in the file, and fix-dim "
                    "changes only symbolic dims")


def batch_fix(value: object, symbolic: set[int], static: set[int]) -> Fix:
    """What to do about a batch past the limit, by where it comes from: the size the check gave a symbolic
    input batch (`fix-dim batch=1` changes it), a static input batch (a re-export), or neither (made
    inside the graph, as area attention folds 4 areas into axis 0 of a batch-1 model)."""
    if value in symbolic:
        return rewrite_fix(RewriteId.FIX_DIM, "batch=1")
    return Fix(STATIC_BATCH_FIX if value in static else INNER_BATCH_FIX)


def limit_fix(attribute: str, op: str, value: object) -> Fix:
    """What to do about a parameter outside the profile's limit (a batch limit: `batch_fix`)."""
    if op in ("Conv", "ConvTranspose") and attribute in ("stride", "kernel") and _is_1d_long(value):
        return Fix("reshape the signal into frames and use a stride-1 Conv (or a MatMul on frames)")
    if attribute == "batch":
        return rewrite_fix(RewriteId.FIX_DIM, "batch=1")
    if attribute == "ceil_mode" and op in ("MaxPool", "AveragePool"):
        return rewrite_fix(RewriteId.FIX_CEIL_MODE)
    return Fix(_LIMIT_FIXES.get(attribute, "change the parameter to a supported value, or keep the layer on CPU"))


def _is_1d_long(value: object) -> bool:
    return isinstance(value, list) and len(value) == 1 and value[0] > 16
