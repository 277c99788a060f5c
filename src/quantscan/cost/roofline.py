"""Time of one kernel on one chip: max(compute, memory traffic) + a fixed overhead (a roofline).

compute  = MACs x channel padding / (MACs per cycle at the precision x efficiency x clock x cores)
           for Conv/Gemm/MatMul (a depthwise Conv reaches `depthwise_efficiency` of the array instead:
           the rk profiles set it to 1/channel_align, one input-channel lane of the array);
           elements streamed (inputs + output) x bytes per element / (elementwise_per_cycle x clock x cores)
           for the rest (activation kernels at `activation_per_cycle`);
memory   = bytes read and written / DRAM bandwidth, where an activation tensor no larger than the
           on-chip buffer stays on chip and weights always come from DRAM;
overhead = the per-layer figure (NPU) or the per-op figure (CPU); a free kernel (a Reshape) costs nothing;
           an attention kernel (a MatMul of two activations, a Softmax) adds `attention_us` on the NPU.
On the CPU the same formula runs at float32 with the CPU's rate and bandwidth.

Pure arithmetic: the figures come from `CostTable`, the sizes from `Kernel`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from quantscan.cost.kernels import Kernel
from quantscan.cost.table import PRECISION_BYTES, CostTable

BOUNDS = ("compute", "memory", "overhead")
ACTIVATION_OPS = frozenset({"Sigmoid", "HardSwish", "HardSigmoid", "Tanh", "Relu", "LeakyRelu", "Clip", "Elu",
                            "Selu", "Softplus", "Mish", "Gelu", "PRelu"})
"""Unary activations left as their own kernel (SiLU is a Sigmoid kernel with its Mul): priced at
`activation_per_cycle`. Why apart: the zoo's SiLU models run faster than their SiLU kernels at the
elementwise rate say (yolov5s/yolov5s_relu measured x1.37 on rk3588, estimated x1.66), while PP-OCRv4 det's
standalone Add/Mul layers run slower; one rate cannot serve both (benchmarks/cost_fit.py, RESULTS.md)."""


@dataclass(frozen=True)
class KernelTime:
    """One kernel's estimate in milliseconds, by part."""

    compute_ms: float
    memory_ms: float
    overhead_ms: float

    @property
    def est_ms(self) -> float:
        return max(self.compute_ms, self.memory_ms) + self.overhead_ms

    @property
    def bound(self) -> str:
        """What decides the time: compute, memory or the fixed overhead (the largest part)."""
        parts = {"compute": self.compute_ms, "memory": self.memory_ms, "overhead": self.overhead_ms}
        return max(BOUNDS, key=lambda k: parts[k])


ZERO = KernelTime(0.0, 0.0, 0.0)


def channel_padding(channels: int, align: float) -> float:
    """Work done / work needed when `channels` are padded up to a multiple of `align` (>= 1)."""
    if channels <= 0 or align <= 1:
        return 1.0
    return math.ceil(channels / align) * align / channels


def kernel_time(kernel: Kernel, precision: str, device: str, table: CostTable) -> KernelTime:
    """The roofline time of `kernel` at `precision` ("int8", "int16", "fp16"; "float" on the CPU)."""
    if kernel.role == "free":
        return ZERO
    if device == "cpu":
        return _cpu_time(kernel, table)
    return _npu_time(kernel, precision, table)


def _npu_time(kernel: Kernel, precision: str, table: CostTable) -> KernelTime:
    hz = table.clock_mhz * 1e6 * table.cores
    if kernel.role == "matmul":
        efficiency = table.depthwise_efficiency if kernel.depthwise else table.compute_efficiency
        padding = channel_padding(kernel.cout, table.channel_align)
        if not kernel.depthwise:
            padding *= channel_padding(kernel.cin, table.channel_align)
        compute = kernel.macs * padding / (table.macs_per_cycle(precision) * efficiency * hz)
    else:  # the vector unit handles a fixed bit width: int16/fp16 results take twice the int8 time
        rate = table.activation_rate if kernel.op in ACTIVATION_OPS else table.elementwise_per_cycle
        compute = kernel.ops * PRECISION_BYTES.get(precision, 1) / (rate * hz)
    nbytes = PRECISION_BYTES.get(precision, 1)
    memory = dram_bytes(kernel, nbytes, table.onchip_kib * 1024) / (table.dram_gbps * 1e9)
    fixed = table.layer_overhead_us + (table.attention_us if is_attention(kernel) else 0.0)
    return KernelTime(compute * 1e3, memory * 1e3, fixed * 1e-3)


def is_attention(kernel: Kernel) -> bool:
    """A MatMul whose both operands are activations (no weight), or a Softmax: the attention kernels.

    Why apart: on RK3566/68 the RKNN Model Zoo's attention models (yolo11, yolov10's PSA, PP-OCRv4 rec's
    SVTR) run 1.6x slower than yolov8 at fewer MACs, which no per-MAC or per-element figure explains; a
    fixed cost per such kernel does (benchmarks/cost_fit.py, RESULTS.md)."""
    return (kernel.op == "MatMul" and kernel.role == "matmul" and kernel.weight_elems == 0) or kernel.op == "Softmax"


def _cpu_time(kernel: Kernel, table: CostTable) -> KernelTime:
    compute = (kernel.macs + kernel.ops) / (table.cpu_gmacs * 1e9)
    traffic = 4 * (sum(kernel.input_elems) + kernel.output_elems + kernel.weight_elems)
    memory = traffic / (table.cpu_gbps * 1e9)
    return KernelTime(compute * 1e3, memory * 1e3, table.cpu_op_overhead_us * 1e-3)


def dram_bytes(kernel: Kernel, nbytes: int, onchip: float) -> float:
    """Bytes a kernel moves through DRAM: activations larger than the on-chip buffer, and its weights."""
    activations = [*kernel.input_elems, kernel.output_elems]
    spilled = sum(n * nbytes for n in activations if n * nbytes > onchip)
    return spilled + kernel.weight_elems * nbytes


def boundary_ms(elements: int, from_bytes: int, to_bytes: int, fixed_us: float, gbps: float) -> float:
    """A converter layer or a partition crossing: a fixed cost plus reading and writing the tensor once."""
    return fixed_us * 1e-3 + elements * (from_bytes + to_bytes) / (gbps * 1e9) * 1e3
