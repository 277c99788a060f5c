"""A plan's per-site weight bits as models onnxruntime runs: blocked QDQ and MatMulNBits.

The text exports (exports.py) tell a toolchain which layers to keep wide; these two are the quantized
model itself, for the LLM-style schemes where the weights are the whole story (`--activations float`,
RKLLM's w4a16, onnxruntime's weight-only int4):

- `qdq-blocked` (`plan_weights_qdq.onnx`): every weight the plan quantizes replaced by a stored integer
  initializer and its DequantizeLinear (ONNX opset 21: INT4/UINT4 codes, `block_size` for group-wise
  scales; int8/int16 per output channel), the rest of the graph untouched. onnxruntime at
  ORT_ENABLE_ALL fuses a blocked DequantizeLinear + MatMul into its MatMulNBits kernel.
- `matmulnbits` (`plan_matmulnbits.onnx`): the same, but each 2-D MatMul weight at int4 written as
  onnxruntime's `com.microsoft.MatMulNBits` (the operator onnxruntime's own `MatMulNBitsQuantizer`
  writes; format: onnxruntime docs/ContribOperators.md "com.microsoft.MatMulNBits", onnxruntime 1.32:
  B uint8 [N, k_blocks, block_size/2], low nibble first; scales [N, k_blocks]; zero points uint8
  [N, ceil(k_blocks/2)], else the implied 8; block_size a power of two >= 16). A weight it cannot take
  (another block size, not 2-D, a Conv) stays blocked QDQ, said in the model's metadata.

The codes are quantscan's own (quant.weight_qparams + quant.quantize): the model dequantizes to exactly
the weights bisect simulated. Activations stay float: the figure transfers for weight-only schemes;
under a scheme that quantizes activations the model holds the weight half only (metadata `note`).
Pure graph building: no session is opened here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quantscan import quant
from quantscan.graph import qdq
from quantscan.model import constants_to_initializers, onnx_opset, upgrade_opset
from quantscan.records import Plan, Precision
from quantscan.schemes import Scheme

BLOCKED_OPSET = 21
"""DequantizeLinear takes INT4/UINT4, int16 and `block_size` from opset 21."""
WEIGHTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
"""The ops whose constant input 1 quantscan quantizes as a weight (CONTRACT: Quantization sites)."""


@dataclass(frozen=True)
class WeightChoice:
    """How one weight is stored: `bits` 4, 8 or 16; `group_size` None = per output channel."""

    bits: int
    group_size: int | None = None
    zero_point: bool = False

    @property
    def label(self) -> str:
        group = f"-g{self.group_size}" if self.group_size else ""
        return f"int{self.bits}{group}{'-zp' if self.zero_point else ''}"


@dataclass(frozen=True)
class WeightUse:
    """A weighted node of the model: the weight it reads and its output axis (CONTRACT: axis 0 for Conv,
    1 for ConvTranspose and MatMul [K, N], Gemm by transB)."""

    node: str
    op_type: str
    weight: str
    axis: int


def weight_uses(model: onnx.ModelProto) -> list[WeightUse]:
    """Every Conv/ConvTranspose/Gemm/MatMul reading an initializer of rank >= 2 as input 1, in graph order."""
    inits = {t.name: t for t in model.graph.initializer}
    uses = []
    for node in model.graph.node:
        if node.op_type not in WEIGHTED_OPS or len(node.input) < 2 or node.input[1] not in inits:
            continue
        if len(inits[node.input[1]].dims) < 2:
            continue
        uses.append(WeightUse(node.name, node.op_type, node.input[1], _output_axis(node)))
    return uses


def _output_axis(node: onnx.NodeProto) -> int:
    if node.op_type == "Conv":
        return 0
    if node.op_type == "Gemm":
        return 0 if next((a.i for a in node.attribute if a.name == "transB"), 0) else 1
    return 1


def scheme_choice(scheme: Scheme) -> WeightChoice:
    """What a site at the scheme's own precision stores."""
    return WeightChoice(scheme.weight_bits, scheme.group_size, scheme.weight_zero_point)


SITE_CHOICES: dict[Precision, WeightChoice | None] = {
    Precision.INT8: WeightChoice(8),
    Precision.INT16: WeightChoice(16),
    Precision.FLOAT: None,
}
"""A plan site's weights by its precision (graph/mixed.py: W8 and int16 sites per output channel,
symmetric; a float site's weights stay float)."""


def plan_choices(plan: Plan, model: onnx.ModelProto) -> dict[str, WeightChoice | None]:
    """Weight name -> how the plan stores it: the plan's sites by their precision, every other weight at
    the plan's scheme (plan.json `scheme`; w8a8 for plans from before schemes)."""
    scheme = _plan_scheme(plan)
    chosen: dict[str, WeightChoice | None] = {u.weight: scheme_choice(scheme) for u in weight_uses(model)}
    for site in plan.sites:
        for weight in site.weights:
            if weight in chosen:
                chosen[weight] = SITE_CHOICES[site.precision]
    return chosen


def _plan_scheme(plan: Plan) -> Scheme:
    raw = plan.scheme or {}
    return Scheme(str(raw.get("weights", "int8")), raw.get("group_size"), bool(raw.get("weight_zero_point")),
                  str(raw.get("activations", "uint8")))


def prepared_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """The user's model as quantscan quantized its weights: Constant weights as initializers, each
    BatchNormalization after a Conv/Gemm folded into it (the weight a chip stores)."""
    from quantscan.rewrites.fold_bn import fold_batchnorm

    out = onnx.ModelProto()
    out.CopyFrom(model)
    constants_to_initializers(out)
    return fold_batchnorm(out).model


def quantized_weight(w: np.ndarray, axis: int, choice: WeightChoice) -> qdq.WeightQuant:
    """`w` on the choice's grid: quantscan's own parameters and codes (quant.py)."""
    qp = quant.weight_qparams(w, axis, bits=choice.bits, group_size=choice.group_size,
                              symmetric=not choice.zero_point)
    return qdq.WeightQuant("", qp, quant.quantize(w, qp))


def blocked_qdq_model(model: onnx.ModelProto, choices: Mapping[str, WeightChoice | None],
                      note: str = "") -> onnx.ModelProto:
    """`model` (already prepared: `prepared_copy`) with each chosen weight stored quantized behind its
    DequantizeLinear; a weight chosen None stays float. Raised to opset 21 when a choice needs it."""
    return _with_weights(model, choices, matmulnbits=False, note=note)


def matmulnbits_model(model: onnx.ModelProto, choices: Mapping[str, WeightChoice | None],
                      note: str = "") -> onnx.ModelProto:
    """As `blocked_qdq_model`, with every 2-D MatMul weight at int4 whose block size MatMulNBits takes
    replaced, with its MatMul, by one `com.microsoft.MatMulNBits` node."""
    return _with_weights(model, choices, matmulnbits=True, note=note)


def _with_weights(model: onnx.ModelProto, choices: Mapping[str, WeightChoice | None], *, matmulnbits: bool,
                  note: str) -> onnx.ModelProto:
    uses = weight_uses(model)
    readers: dict[str, list[WeightUse]] = {}
    for use in uses:
        readers.setdefault(use.weight, []).append(use)
    fused = {u.weight for u in uses if matmulnbits and _nbits_ok(u, readers, choices, model)}
    needs21 = any(c is not None and (c.bits != 8 or c.group_size) and w not in fused
                  for w, c in choices.items() if w in readers)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    if any(choices.get(w) is not None for w in readers):
        out = upgrade_opset(out, BLOCKED_OPSET if needs21 else max(13, onnx_opset(out)))
    inits = {t.name: t for t in out.graph.initializer}
    nodes_by_name = {n.name: n for n in out.graph.node}
    removed: set[str] = set()
    new_inits: list[onnx.TensorProto] = []
    dq_nodes: list[onnx.NodeProto] = []
    fused_nodes: dict[str, onnx.NodeProto] = {}
    for weight, users in readers.items():
        choice = choices.get(weight)
        if choice is None:
            continue
        w = numpy_helper.to_array(inits[weight]).astype(np.float32)
        quantized = quantized_weight(w, users[0].axis, choice)
        removed.add(weight)
        if weight in fused:
            node = nodes_by_name[users[0].node]
            fused_node, tensors = _nbits_node(node, weight, quantized, choice)
            fused_nodes[node.name] = fused_node
            new_inits += tensors
            continue
        dq, tensors, dq_out = qdq.weight_quant_dq(weight, quantized)
        dq_nodes.append(dq)
        new_inits += tensors
        for use in users:
            node = nodes_by_name[use.node]
            node.input[1] = dq_out
    kept = [t for t in out.graph.initializer if t.name not in removed]
    del out.graph.initializer[:]
    out.graph.initializer.extend([*kept, *new_inits])
    graph_nodes = [fused_nodes.get(n.name, n) for n in out.graph.node]
    del out.graph.node[:]
    out.graph.node.extend([*dq_nodes, *graph_nodes])
    kept_inputs = [i for i in out.graph.input if i.name not in removed]
    del out.graph.input[:]
    out.graph.input.extend(kept_inputs)
    if fused_nodes and not any(o.domain == "com.microsoft" for o in out.opset_import):
        out.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    _note(out, choices, readers, fused, note)
    return out


def nbits_block_ok(block_size: int | None) -> bool:
    """MatMulNBits' block sizes: a power of two, at least 16 (onnxruntime contrib op schema)."""
    return block_size is not None and block_size >= 16 and block_size & (block_size - 1) == 0


def _nbits_ok(use: WeightUse, readers: Mapping[str, list[WeightUse]], choices: Mapping[str, WeightChoice | None],
              model: onnx.ModelProto) -> bool:
    """A weight MatMulNBits can hold: read by one MatMul only, 2-D, int4 in blocks it takes."""
    choice = choices.get(use.weight)
    if choice is None or choice.bits != 4 or use.op_type != "MatMul" or len(readers[use.weight]) != 1:
        return False
    dims = next(t.dims for t in model.graph.initializer if t.name == use.weight)
    return len(dims) == 2 and nbits_block_ok(choice.group_size)


def pack_nbits(codes: np.ndarray, zero_points: np.ndarray | None, block_size: int
               ) -> tuple[np.ndarray, np.ndarray | None]:
    """MatMulNBits' B and zero points from 4-bit codes of a [K, N] weight (signed -8..7 when symmetric,
    then stored +8 as the op's implied zero point 8 reads them; else unsigned 0..15 with their zero
    points [k_blocks, N]). Two codes a byte, the lower k in the low nibble; a short last block padded
    with the code of zero. Byte for byte what onnxruntime's quantize_matmul_4bits (MatMulNBitsQuantizer's
    kernel) writes for the same codes (tests/bisect/test_weight_exports.py)."""
    k, n = codes.shape
    k_blocks = -(-k // block_size)
    unsigned = codes.astype(np.int16) + (8 if zero_points is None else 0)
    pad_code: int | np.ndarray = 8
    if zero_points is not None:
        pad_code = np.repeat(zero_points.astype(np.int16), block_size, axis=0)[k:k_blocks * block_size]
    padded = np.empty((k_blocks * block_size, n), np.int16)
    padded[:k] = unsigned
    padded[k:] = pad_code
    blocks = padded.T.reshape(n, k_blocks, block_size // 2, 2).astype(np.uint8)
    packed = (blocks[..., 0] | (blocks[..., 1] << 4)).astype(np.uint8)
    if zero_points is None:
        return packed, None
    zp = zero_points.astype(np.uint8).T  # [N, k_blocks]
    if k_blocks % 2:  # the unused high nibble holds 8, as onnxruntime's quantize_matmul_4bits writes it
        zp = np.concatenate([zp, np.full((n, 1), 8, np.uint8)], axis=1)
    zp_packed = (zp[:, 0::2] | (zp[:, 1::2] << 4)).astype(np.uint8)
    return packed, zp_packed


def _nbits_node(node: onnx.NodeProto, weight: str, quantized: qdq.WeightQuant, choice: WeightChoice
                ) -> tuple[onnx.NodeProto, list[onnx.TensorProto]]:
    qp = quantized.qparams
    assert choice.group_size is not None
    k, n = quantized.values.shape
    zps = np.asarray(qp.zero_point) if choice.zero_point else None
    packed, zp_packed = pack_nbits(quantized.values, zps, choice.group_size)
    scales = np.ascontiguousarray(np.asarray(qp.scale, np.float32).T)  # [N, k_blocks]
    tensors = [numpy_helper.from_array(packed, f"{weight}__Q4"), numpy_helper.from_array(scales, f"{weight}__scales")]
    inputs = [node.input[0], tensors[0].name, tensors[1].name]
    if zp_packed is not None:
        tensors.append(numpy_helper.from_array(zp_packed, f"{weight}__zero_points"))
        inputs.append(tensors[2].name)
    fused = helper.make_node("MatMulNBits", inputs, list(node.output), name=f"{node.name}_Q4", domain="com.microsoft",
                             K=k, N=n, bits=4, block_size=choice.group_size)
    return fused, tensors


def _note(model: onnx.ModelProto, choices: Mapping[str, WeightChoice | None],
          readers: Mapping[str, list[WeightUse]], fused: set[str], note: str) -> None:
    """metadata_props: how many weights went where, and what the model does not hold."""
    counts: dict[str, int] = {}
    for weight in readers:
        choice = choices.get(weight)
        where = " MatMulNBits" if weight in fused else " DequantizeLinear"
        label = "float" if choice is None else choice.label + where
        counts[label] = counts.get(label, 0) + 1
    entries = {"quantscan_weights": ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))}
    if note:
        entries["quantscan_note"] = note
    for key, value in entries.items():
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value


def plan_note(plan: Plan) -> str:
    """What the model does not hold of the plan: activation quantization, when the scheme has any."""
    scheme = _plan_scheme(plan)
    if scheme.weight_only:
        return "weight-only scheme: the model is the plan bisect measured (activations float, as simulated)"
    return (f"scheme {scheme.name()} quantizes activations too: this model holds the plan's weights only "
            "(activations float); ort_quant_config.json or the chip's export carries the rest")


def plan_blocked_qdq(plan: Plan, model: onnx.ModelProto) -> onnx.ModelProto:
    """The plan's `qdq-blocked` export of the user's `model`."""
    prepared = prepared_copy(model)
    return blocked_qdq_model(prepared, plan_choices(plan, prepared), plan_note(plan))


def plan_matmulnbits(plan: Plan, model: onnx.ModelProto) -> onnx.ModelProto:
    """The plan's `matmulnbits` export of the user's `model`."""
    prepared = prepared_copy(model)
    return matmulnbits_model(prepared, plan_choices(plan, prepared), plan_note(plan))


MODEL_WRITERS = {
    "qdq-blocked": ("plan_weights_qdq.onnx", plan_blocked_qdq),
    "matmulnbits": ("plan_matmulnbits.onnx", plan_matmulnbits),
}
"""Export name -> (file name, writer of the plan and the user's model). Written only when asked for."""
