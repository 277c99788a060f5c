"""The parameters a profile's `[[limit]]` tables constrain, computed from one node.

Values come from attributes first, then from constant inputs and inferred shapes (a Conv's kernel
from its weight shape when `kernel_shape` is absent). A parameter that cannot be determined is
simply absent: the limit rule then skips it rather than guess.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from quantscan.graph.index import GraphIndex
from quantscan.metrics import channel_axis

CONV_OPS = frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "DeformConv"})
POOL_OPS = frozenset({"MaxPool", "AveragePool", "LpPool"})
GLOBAL_POOL_OPS = frozenset({"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"})
AXIS_OPS = frozenset({"Softmax", "LogSoftmax", "Hardmax", "Concat", "Split", "Gather", "Flatten"})
REDUCE_OPS = frozenset(
    {
        "ReduceMean",
        "ReduceSum",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ReduceSumSquare",
        "ArgMax",
        "ArgMin",
    }
)

Params = dict[str, Any]


NCHW_OPS = CONV_OPS | POOL_OPS | GLOBAL_POOL_OPS | frozenset(
    {"BatchNormalization", "InstanceNormalization", "LRN", "DepthToSpace", "SpaceToDepth", "MaxUnpool"}
)
"""Ops whose ONNX definition puts the channels on axis 1 of their first input, whoever produced it."""


def node_params(view: GraphIndex, i: int, channels_first: frozenset[str] | set[str] = frozenset()) -> Params:
    """Every parameter of node `i` that can be computed (see profile_schema.ATTRIBUTES).

    `channels_first` holds the tensors in a convolutional (NCHW) layout (`sites.channels_first_tensors`):
    there, and at the inputs of `NCHW_OPS`, the channel axis is 1; elsewhere it is the last axis, as
    CONTRACT.md fixes it ([B, T, C] audio frames have no "channels" on their time axis).
    """
    op = view.nodes[i].op_type
    inputs = view.node_inputs(i)
    p: Params = _input_dims(view, i, op in NCHW_OPS or (bool(inputs) and inputs[0] in channels_first))
    if op in CONV_OPS:
        p.update(_conv(view, i))
    elif op in POOL_OPS:
        p.update(_window(view, i, _ints(view.attr(i, "kernel_shape", []))))
        p["ceil_mode"] = int(view.attr(i, "ceil_mode", 0) or 0)
        if op == "AveragePool" and _pads(view, i, p):
            p["count_include_pad"] = int(view.attr(i, "count_include_pad", 0) or 0)
    elif op in GLOBAL_POOL_OPS:
        shape = view.info(view.node_inputs(i)[0]).shape if view.node_inputs(i) else None
        spatial = [d for d in shape[2:] if isinstance(d, int)] if shape is not None else []
        if shape is not None and len(shape) >= 3 and len(spatial) == len(shape) - 2:
            p["kernel"] = spatial
    elif op in ("Resize", "Upsample"):
        p.update(_resize(view, i))
    elif op == "Pad":
        p["pad_mode"] = _text(view.attr(i, "mode", "constant"))
    elif op == "Slice":
        p.update(_slice_steps(view, i))
    elif op == "Reshape":
        p.update(_merged_row(view, i))
    if op in AXIS_OPS or op in REDUCE_OPS:
        p.update(_axes(view, i))
    return p


def _ints(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _first_shape(view: GraphIndex, i: int) -> tuple[Any, ...] | None:
    inputs = view.node_inputs(i)
    return view.info(inputs[0]).shape if inputs else None


RECURRENT_OPS = frozenset({"LSTM", "GRU", "RNN"})


def recurrent_batch_axis(view: GraphIndex, i: int) -> int:
    """Where node i's first input keeps its batch: axis 1 for a time-major recurrent op (LSTM/GRU/RNN
    with layout 0, X = [seq, batch, input]), axis 0 for everything else."""
    node = view.nodes[i]
    if node.op_type in RECURRENT_OPS and int(view.attr(i, "layout", 0) or 0) == 0:
        return 1
    return 0


def _input_dims(view: GraphIndex, i: int, conv_like: bool) -> Params:
    """rank, batch, channels (axis 1 when `conv_like`, else the last), and for rank 4 height and width
    (the two axes after the channels in NCHW, the two before them in NHWC)."""
    shape = _first_shape(view, i)
    p: Params = {}
    if shape is None:
        return p
    p["rank"] = len(shape)
    dims = [d if isinstance(d, int) else None for d in shape]
    batch_axis = recurrent_batch_axis(view, i)
    if len(dims) >= 2 and dims[batch_axis] is not None:
        p["batch"] = dims[batch_axis]
    channel = channel_axis(len(dims), conv_like) if dims else 0
    if len(dims) >= 3 and dims[channel] is not None:
        p["channels"] = dims[channel]
    if len(dims) == 4:
        h, w = (dims[2], dims[3]) if channel == 1 else (dims[1], dims[2])
        if h is not None:
            p["height"] = h
        if w is not None:
            p["width"] = w
        if h is not None and w is not None:
            p["plane"] = h * w
    return p


def _weight_shape(view: GraphIndex, i: int) -> tuple[int, ...] | None:
    inputs = view.nodes[i].input
    w_index = 3 if view.nodes[i].op_type == "QLinearConv" else 1
    if len(inputs) <= w_index:
        return None
    shape = view.info(inputs[w_index]).shape
    dims = [d for d in shape if isinstance(d, int)] if shape is not None else []
    if shape is None or len(dims) != len(shape):
        return None
    return tuple(dims)


def _conv(view: GraphIndex, i: int) -> Params:
    w = _weight_shape(view, i)
    kernel = _ints(view.attr(i, "kernel_shape")) or (list(w[2:]) if w else [])
    p = _window(view, i, kernel)
    group = int(view.attr(i, "group", 1) or 1)
    p["group"] = group
    if w is not None:
        transpose = view.nodes[i].op_type == "ConvTranspose"
        cin_per_group = w[0] // group if transpose else w[1]
        cout = w[1] * group if transpose else w[0]
        p["channels_per_group"] = cin_per_group
        p["out_channels"] = cout
        p["kernel_elements"] = int(np.prod(kernel or [1])) * cin_per_group
        p["depthwise"] = group > 1 and cin_per_group == 1 and not transpose
    else:
        p["depthwise"] = False
    return p


def _window(view: GraphIndex, i: int, kernel: list[int]) -> Params:
    n = len(kernel)
    stride = _ints(view.attr(i, "strides")) or [1] * n
    dilation = _ints(view.attr(i, "dilations")) or [1] * n
    pads = _ints(view.attr(i, "pads")) or [0] * (2 * n)
    p: Params = {"stride": stride, "dilation": dilation, "pads": pads, "spatial_rank": n}
    p["stride_symmetric"] = len(set(stride)) <= 1
    if not kernel:
        return p
    p["kernel"] = kernel
    dilated = [(k - 1) * d + 1 for k, d in zip(kernel, dilation, strict=False)]
    p["dilated_kernel_height"] = dilated[0]
    p["dilated_kernel_area"] = int(np.prod(dilated))
    p["kernel_stride"] = kernel_stride_text(kernel, stride)
    return p


def _pads(view: GraphIndex, i: int, p: Params) -> bool:
    """Whether a pooling window ever covers padding: without it, count_include_pad changes nothing
    (rknn-toolkit2 2.5.0 ran ppocrv4_rec's unpadded count_include_pad=0 AveragePool on the NPU while a
    limit on the attribute alone sent it to the CPU)."""
    auto_pad = _text(view.attr(i, "auto_pad", "NOTSET"))
    return auto_pad in ("SAME_UPPER", "SAME_LOWER") or any(int(v) != 0 for v in p.get("pads", []))


def kernel_stride_text(kernel: list[int], stride: list[int]) -> str:
    """`3x3s2`, `3x3s2x1` (asymmetric stride), `256s128` (1-D)."""
    k = "x".join(str(v) for v in kernel)
    s = str(stride[0]) if len(set(stride)) <= 1 and stride else "x".join(str(v) for v in stride)
    return f"{k}s{s}"


def _resize(view: GraphIndex, i: int) -> Params:
    p: Params = {"resize_mode": _text(view.attr(i, "mode", "nearest"))}
    inputs = list(view.nodes[i].input)
    in_shape = view.info(inputs[0]).shape if inputs else None
    out_shape = view.info(view.nodes[i].output[0]).shape
    if in_shape and out_shape and len(in_shape) == len(out_shape) and len(in_shape) >= 3:
        ins = [d for d in in_shape[2:] if isinstance(d, int) and d > 0]
        outs = [d for d in out_shape[2:] if isinstance(d, int) and d > 0]
        if len(ins) == len(outs) == len(in_shape) - 2:
            p["resize_scale"] = [round(o / n, 4) for n, o in zip(ins, outs, strict=True)]
    return p


def _slice_steps(view: GraphIndex, i: int) -> Params:
    """`slice_step`: each step of a Slice (opset >= 10 `steps` input; absent means 1). rknn-toolkit2
    2.5.0 ran the step-2 Slices of a YOLOX Focus on the CPU; a step the graph computes is left out."""
    inputs = view.nodes[i].input
    if len(inputs) < 5 or not inputs[4]:  # opset < 10 has no steps input: every step is 1
        return {"slice_step": [1]}
    steps = view.const_value(inputs[4])
    return {} if steps is None else {"slice_step": [int(v) for v in steps.reshape(-1)]}


ROW_ALIGNMENT = 16
"""The largest alignment `merged_row_alignment` reports (elements of the merged innermost row)."""


def _merged_row(view: GraphIndex, i: int) -> Params:
    """`merged_row_alignment`: for a Reshape that merges its input's last two dims into one innermost
    row (N, C, H, W) -> (N, C, H*W), the largest power of two up to 16 dividing H*W. rknn-toolkit2
    2.5.0 rewrote such Reshapes to 4-D rows and ran 26x26 (676 = 4 x 169) on the CPU, 52x52 (2704 =
    16 x 169) on the NPU. Other reshapes (innermost dim kept, shapes not static) have no value."""
    inputs, outputs = view.node_inputs(i), view.nodes[i].output
    in_shape = view.info(inputs[0]).shape if inputs else None
    out_shape = view.info(outputs[0]).shape if outputs else None
    if not in_shape or not out_shape or len(in_shape) < 2:
        return {}
    dims = [d if isinstance(d, int) and d > 0 else 0 for d in (in_shape[-2], in_shape[-1], out_shape[-1])]
    h, w, row = dims
    if not all(dims) or w == row or row != h * w:
        return {}
    return {"merged_row_alignment": math.gcd(row, ROW_ALIGNMENT)}


def _axes(view: GraphIndex, i: int) -> Params:
    shape = _first_shape(view, i)
    rank = len(shape) if shape is not None else None
    node = view.nodes[i]
    axes = view.attr(i, "axes")
    if axes is None and node.op_type.startswith("Reduce") and len(node.input) > 1 and node.input[1]:
        value = view.const_value(node.input[1])
        axes = None if value is None else value.reshape(-1).tolist()
    if axes is None:
        softmax = node.op_type in ("Softmax", "LogSoftmax", "Hardmax")
        default = (-1 if view.opset() >= 13 else 1) if softmax else 0
        single = view.attr(i, "axis", default)
        axes = None if node.op_type.startswith("Reduce") else [single]
    if axes is None or rank is None:
        return {}
    norm = [int(a) + rank if int(a) < 0 else int(a) for a in axes]
    return {"axis": norm, "axis_is_last": len(norm) == 1 and norm[0] == rank - 1}
