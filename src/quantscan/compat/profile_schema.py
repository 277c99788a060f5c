"""The shape of a chip-profile TOML file: every key, its type and, for enumerations, its values.

Kept as data so the validator can name the exact key and the expected type in one line, and so the
README/`quantscan profiles` can show what a profile may contain.
"""

from __future__ import annotations

ATTRIBUTES: dict[str, str] = {
    "kernel": "each spatial kernel dim (Conv, ConvTranspose, pools; Global pools: the input H, W)",
    "stride": "each stride",
    "dilation": "each dilation",
    "pads": "each pad value",
    "group": "the group count",
    "channels_per_group": "input channels / group (Conv, ConvTranspose)",
    "out_channels": "output channels (Conv, ConvTranspose)",
    "kernel_elements": "kernel H x W x input channels per group",
    "dilated_kernel_height": "(kernel_h - 1) * dilation_h + 1",
    "dilated_kernel_area": "product of dilated kernel dims",
    "kernel_stride": "'3x3s2' (square stride) or '3x3s2x1'; Conv1d: '256s128'",
    "stride_symmetric": "true when every stride is equal",
    "spatial_rank": "number of spatial dims (2 for a 2-D Conv)",
    "ceil_mode": "pooling ceil_mode",
    "count_include_pad": "AveragePool count_include_pad",
    "resize_mode": "Resize/Upsample mode",
    "resize_scale": "each spatial scale factor of Resize/Upsample",
    "axis": "Softmax/LogSoftmax/Concat/Reduce axes, as non-negative indices",
    "axis_is_last": "true when the (single) axis is the last one",
    "pad_mode": "Pad mode",
    "slice_step": "each step of a Slice (1 when it has no steps input)",
    "merged_row_alignment": "Reshape (N, C, H, W) -> (N, C, H*W): largest power of two <= 16 dividing H*W",
    "batch": "dim 0 of the first input",
    "channels": "channel axis of the first input (rank >= 3): dim 1 in a conv (NCHW) layout, else the last dim",
    "height": "H of the first input (rank 4): dim 2 in NCHW, dim 1 in NHWC",
    "width": "W of the first input (rank 4): dim 3 in NCHW, dim 2 in NHWC",
    "plane": "H x W of the first input (rank 4)",
    "rank": "rank of the first input",
}
"""Parameters a `[[limit]]` may constrain, as computed by `quantscan.compat.params`."""

WHEN = ("any", "depthwise", "not_depthwise", "grouped", "plain")
"""Which Conv-like nodes a limit applies to (plain = group 1, dilation 1)."""

STR, INT, BOOL, NUM, STR_LIST, ANY_LIST, OP_LIST, STR_TABLE = (
    "string",
    "integer",
    "boolean",
    "number",
    "list of strings",
    "list of numbers, strings or booleans",
    "list of ONNX op types",
    "table of strings",
)

SOURCED = {"source": STR, "unverified": BOOL, "note": STR}

COST_FIGURES: dict[str, str] = {
    "clock_mhz": "NPU clock at its maximum frequency, MHz",
    "cores": "NPU cores one model uses (RKNN: 1 unless the core mask says otherwise)",
    "int8_macs_per_cycle": "int8 multiply-accumulates per cycle per core",
    "int16_macs_per_cycle": "int16 multiply-accumulates per cycle per core",
    "fp16_macs_per_cycle": "float16 multiply-accumulates per cycle per core",
    "channel_align": "channels the MAC array works on at once: a Conv's input/output channels are padded to it",
    "compute_efficiency": "fraction of the peak MAC rate a dense Conv reaches",
    "depthwise_efficiency": "fraction of the (aligned) peak a depthwise Conv reaches",
    "elementwise_per_cycle": "elements streamed per cycle per core by elementwise kernels (inputs read + output "
                             "written: activations, Add/Mul, pools, Resize)",
    "dram_gbps": "DRAM bandwidth the NPU reaches, GB/s",
    "onchip_kib": "on-chip buffer: an activation tensor no larger stays on chip (no DRAM traffic)",
    "layer_overhead_us": "fixed time per NPU kernel (launch, configuration), microseconds",
    "run_overhead_us": "fixed time per inference (submit, wait), microseconds",
    "cpu_gmacs": "the CPU fallback's rate, GMAC/s (one big core, float32)",
    "cpu_gbps": "the CPU fallback's memory bandwidth, GB/s",
    "cpu_op_overhead_us": "fixed time per CPU op, microseconds",
    "converter_us": "fixed time of a converter layer at a precision boundary (int8 <-> int16/fp16), microseconds",
    "partition_us": "fixed time of an NPU <-> CPU partition boundary (sync, cache flush), microseconds",
}
"""Every figure a `[cost]` table must give (quantscan.cost reads them; the help text is the meaning)."""
OPTIONAL_COST_FIGURES: dict[str, str] = {
    "attention_us": "fixed extra time of an attention kernel (a MatMul of two activations, a Softmax), "
                    "microseconds; 0 when not given",
    "activation_per_cycle": "elements streamed per cycle per core by an activation kernel (SiLU, Sigmoid, "
                            "HardSwish...); elementwise_per_cycle when not given",
}
"""Figures a `[cost]` table may give; a table without them prices as if they were 0."""

SECTIONS: dict[str, dict[str, str]] = {
    "meta": {"name": STR, "vendor": STR, "description": STR, "documents": STR_LIST, "note": STR},
    "quantization": {
        "activations": STR,
        "weights": STR,
        "per_channel_weights": BOOL,
        "weight_zero_point": BOOL,
        "power_of_two_scales": BOOL,
        "fallback_precision": STR,
        "recipe": STR,
        **SOURCED,
    },
    "schemes": {"names": STR_LIST, "a16": STR, **SOURCED},
    "opset": {"min": INT, "max": INT, **SOURCED},
    "ops": {
        "npu": OP_LIST,
        "cpu": OP_LIST,
        "folded": OP_LIST,
        "unsupported": STR,
        "on_violation": STR,
        **SOURCED,
    },
    "fusion": {"activations": OP_LIST, "patterns": STR_LIST, **SOURCED},
    "float16": {"ops": OP_LIST, **SOURCED},
    "consumer_range": {"ops": OP_LIST, **SOURCED},
    "output_grid": {"ops": OP_LIST, **SOURCED},
    "requantize": {"ops": OP_LIST, **SOURCED},
    "input": {"follows_readers": BOOL, **SOURCED},
    "kernel_points": {"depthwise_hardswish": BOOL, **SOURCED},
    "dtypes": {"npu": STR_LIST, **SOURCED},
    "cost": {**{k: NUM for k in (*COST_FIGURES, *OPTIONAL_COST_FIGURES)}, "sources": STR_TABLE, "fitted": STR_LIST,
             **SOURCED},
    "tensor": {
        "max_rank": INT,
        "max_dim": INT,
        "max_batch": INT,
        "max_elements": INT,
        "static_shapes": BOOL,
        **SOURCED,
    },
}

LIMIT_KEYS: dict[str, str] = {
    "op": OP_LIST,
    "attribute": STR,
    "min": NUM,
    "max": NUM,
    "allowed": ANY_LIST,
    "when": STR,
    "on_violation": STR,
    **SOURCED,
}

ENUMS: dict[str, tuple[str, ...]] = {
    "quantization.activations": ("int8", "uint8", "int16"),
    "quantization.weights": ("int8", "uint8", "int4"),
    "quantization.fallback_precision": ("int16", "fp16", "float"),
    "quantization.recipe": ("kernels", "onnxruntime"),
    "schemes.a16": ("int16", "float"),
    "ops.unsupported": ("reject", "cpu"),
    "ops.on_violation": ("reject", "cpu"),
    "limit.on_violation": ("reject", "cpu"),
    "limit.when": WHEN,
    "limit.attribute": tuple(ATTRIBUTES),
}

DTYPES = (
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "int8",
    "uint8",
    "int16",
    "uint16",
    "int32",
    "int64",
    "bool",
)
