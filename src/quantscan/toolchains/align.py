"""Lining a vendor's per-layer figures up with quantscan's, and its placement with `check`'s.

Why its own module: the join is the whole point of `quantscan vendor` (is the simulation of the chip
faithful, and where is it not), and it is pure table work, tested on recorded real runs in CI.

* Names. A vendor names a layer by the tensor it writes (RKNN, TPU-MLIR) or by the node; where the
  toolkit rewrote the graph it derives a name from the original one (`MatMul.0#2`, `x_int8`,
  `Add.9-rs_sw`). `renaming.onnx_name` strips such suffixes (the toolchain's one renaming table)
  until an ONNX tensor or node name is left; a `_sw` layer that is not a copy of that tensor is the op
  RKNN moved above a Reshape, which reads it (:func:`swapped`).
* Loss. Per layer, e_q = 1 - quantscan's isolated cosine and e_v = 1 - the vendor's single-layer
  cosine (both: this layer alone quantized, fed float inputs). `none` when both are below
  `NEGLIGIBLE`; `lowering` when the vendor loses much more than quantscan's simulation of the same
  quantization (e_v > `LOWERING_RATIO` * e_q + `NEGLIGIBLE`): the kernel or the graph lowering adds
  error that int8 rounding alone does not explain; `quantization` otherwise (they agree: int8 is the
  cause, and a mixed-precision plan is the fix).
* Placement. Where the vendor ran a node (npu, cpu, with `-float16` when not int8) beside where
  `check` predicted it; a difference is a finding. A layout node the toolkit inserted itself
  (a Reshape/Transpose with no ONNX node of its own) is explained, not a profile error.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from quantscan.columns import Col
from quantscan.toolchains.renaming import RKNN_SUFFIX, GraphNames, Mapped, onnx_name

NEGLIGIBLE = 1e-3
"""1 - cosine below which a layer loses nothing worth a row in a plan (both sides)."""
LOWERING_RATIO = 3.0
"""How many times quantscan's error the vendor's must exceed to be called lowering/kernel loss."""
LAYOUT_OPS = ("Reshape", "Transpose", "exDataConvert", "DataConvert", "InputOperator", "OutputOperator")
"""Ops a toolkit inserts to move between its own layout/dtype and the model's; not ONNX nodes."""

VENDOR_COLUMNS = [
    "layer", Col.NODE, "tensor", "is_output", "qs_isolated_cosine", "qs_cumulative_cosine",
    "vendor_single_cosine", "vendor_entire_cosine", "loss", "vendor_placement", "check_placement",
]
"""vendor.csv columns, in the contract's order."""


@dataclass(frozen=True)
class LayerFigures:
    """One vendor layer with its figures over all analysed samples."""

    layer: str
    op_type: str
    single_cosine: float
    entire_cosine: float


@dataclass(frozen=True)
class VendorPlace:
    """Where the vendor put one of its layers (`placement`: npu, cpu, npu-float16, cpu-float16)."""

    name: str
    op_type: str
    placement: str


def classify_loss(qs_isolated: float, vendor_single: float) -> str:
    """none | lowering | quantization (module docstring); "" when either figure is missing."""
    if not (math.isfinite(qs_isolated) and math.isfinite(vendor_single)):
        return ""
    e_q, e_v = max(0.0, 1.0 - qs_isolated), max(0.0, 1.0 - vendor_single)
    if e_q < NEGLIGIBLE and e_v < NEGLIGIBLE:
        return "none"
    if e_v > LOWERING_RATIO * e_q + NEGLIGIBLE:
        return "lowering"
    return "quantization"


def same_values(mapped: Mapped, vendor_op: str, graph: GraphNames) -> bool:
    """Whether the vendor layer holds the values of the ONNX tensor it was mapped to.

    An exact name does. A derived name does when the vendor op is a copy in another layout or dtype
    (Reshape, DataConvert: cosine ignores layout), or is the same op as the ONNX producer (MatMul and
    GlobalAveragePool become Conv in RKNN); RKNN names a swapped Softmax after its *input* (`Add.9-rs_sw`),
    which must not be compared with that input's figures.
    """
    if not mapped.tensor:
        return False
    if not mapped.derived:
        return True
    op = vendor_op.lower()
    if op in ("reshape", "transpose") or op.endswith("dataconvert"):
        return True
    onnx_op = graph.op_type.get(mapped.node, "").lower()
    if op.startswith("conv") and onnx_op in ("conv", "matmul", "gemm", "globalaveragepool"):
        return True
    if op == "gemm" and onnx_op == "add":
        return True  # tpu-mlir merges MatMul + bias Add into one Gemm named after the Add's output
    return bool(onnx_op) and onnx_op in re.sub(r"^ex|\d+$", "", op)


def swapped(layer: str, vendor_op: str, mapped: Mapped, graph: GraphNames) -> Mapped | None:
    """The ONNX node a `_sw` layer computes: RKNN moves an op above the Reshape it inserted before it
    (`swap_reshape_prelu` in its log) and names the moved op's output after the op's *input* plus `_sw`
    (MTCNN RNet `/dense4/Gemm_output_0_sw` is /prelu4/PRelu on the Gemm's output). When the tensor it
    was named after has exactly one reader and that reader is the vendor's op type, the layer holds that
    reader's output (in another layout: cosine ignores layout)."""
    if not layer.endswith("_sw") or not mapped.tensor:
        return None
    readers = graph.readers.get(mapped.tensor, ())
    op = re.sub(r"^ex|\d+$", "", vendor_op).lower()
    if len(readers) != 1 or graph.op_type.get(readers[0][0], "").lower() != op:
        return None
    node, output = readers[0]
    return Mapped(node, output, True)


def predicted_placements(findings: pd.DataFrame, float16_rule: str = "float16") -> dict[str, str]:
    """Node -> `check`'s predicted placement: cpu when any finding puts it there, `-float16` when the
    profile says the toolkit runs that op in float16; nodes without findings are npu (not listed)."""
    out: dict[str, str] = {}
    if findings.empty:
        return out
    for row in findings.to_dict("records"):
        node, where = str(row[Col.NODE]), str(row.get(Col.PLACEMENT) or "npu")
        if not node:
            continue  # model-level findings (opset) place nothing
        base = out.get(node, "npu")
        base_where = base.split("-")[0]
        where = "cpu" if "cpu" in (where, base_where) else "npu"
        float16 = base.endswith("-float16") or row.get("rule") == float16_rule
        out[node] = f"{where}-float16" if float16 else where
    return out


def _vendor_placement_by_node(places: Sequence[VendorPlace], graph: GraphNames) -> dict[str, str]:
    """Node -> the placement of the vendor layer that is that node: same name first, then a name
    derived from the node's name, then one derived from its output tensor's name."""
    ranked: dict[str, tuple[int, str]] = {}
    for place in places:
        mapped = onnx_name(place.name, graph)
        if mapped is None or not mapped.node:
            continue
        rank = 0 if not mapped.derived else (1 if not mapped.tensor else 2)
        if mapped.node not in ranked or rank < ranked[mapped.node][0]:
            ranked[mapped.node] = (rank, place.placement)
    return {node: placement for node, (_, placement) in ranked.items()}


def align_layers(
    layers: Iterable[LayerFigures],
    graph: GraphNames,
    qs_layers: pd.DataFrame,
    qs_tensors: pd.DataFrame,
    vendor_places: Sequence[VendorPlace],
    predicted: Mapping[str, str],
    suffix: re.Pattern[str] = RKNN_SUFFIX,
) -> pd.DataFrame:
    """vendor.csv: one row per vendor layer, quantscan's figures for the same tensor beside it
    (`suffix`: the vendor's derived-name suffixes, `renaming.suffix_pattern` of its table)."""
    isolated = _by(qs_layers, Col.OUTPUT, Col.ISOLATED_COSINE)
    cumulative = _by(qs_tensors, "tensor", Col.CUMULATIVE_COSINE)
    placed = _vendor_placement_by_node(vendor_places, graph)
    kernel_of = _site_nodes(qs_layers)
    first_of = {first: output for output, first in kernel_of.items()}
    rows = []
    for layer in layers:
        mapped = onnx_name(layer.layer, graph, suffix)
        same = mapped is not None and (same_values(mapped, layer.op_type, graph)
                                       or _fused_site_output(layer.layer, mapped, isolated, first_of))
        moved = swapped(layer.layer, layer.op_type, mapped, graph) if mapped is not None and not same else None
        mapped, same = (moved, True) if moved is not None else (mapped, same)
        node = mapped.node if mapped else ""
        tensor = mapped.tensor if mapped else ""
        key = _kernel_output(mapped, isolated, first_of) if same and mapped is not None else tensor
        iso = isolated.get(key, math.nan) if same else math.nan
        cum = cumulative.get(key, math.nan) if same else math.nan
        rows.append({
            "layer": layer.layer,
            Col.NODE: node,
            "tensor": tensor,
            "is_output": tensor in graph.outputs,
            "qs_isolated_cosine": iso,
            "qs_cumulative_cosine": cum,
            "vendor_single_cosine": layer.single_cosine,
            "vendor_entire_cosine": layer.entire_cosine,
            "loss": classify_loss(iso, layer.single_cosine),
            "vendor_placement": placed.get(node) or placed.get(kernel_of.get(tensor, ""), ""),
            "check_placement": _predicted(predicted, node, kernel_of.get(tensor, "")) if node else "",
        })
    return pd.DataFrame(rows, columns=VENDOR_COLUMNS)


def placement_findings(
    places: Sequence[VendorPlace], graph: GraphNames, predicted: Mapping[str, str], tool: str, profile: str
) -> tuple[pd.DataFrame, int, int]:
    """Every vendor layer placed other than `check` predicted, as compat.csv rows (rule
    `vendor-placement`); returns (rows, unexplained count, explained count)."""
    rows, unexplained, explained = [], 0, 0
    for place in places:
        if place.op_type in ("InputOperator", "OutputOperator") or place.op_type.endswith("DataConvert"):
            continue
        mapped = onnx_name(place.name, graph)
        if mapped is None:
            continue
        expected = predicted.get(mapped.node, "npu")
        if place.placement == expected:
            continue
        inserted = mapped.derived and bool(mapped.tensor) and place.op_type in LAYOUT_OPS
        if inserted:
            explained += 1
            why = (f"{tool} inserted {place.op_type} '{place.name}' (from tensor {mapped.tensor}) to leave its "
                   f"4-D layout; no ONNX node of its own, so check cannot place it")
            fix = "none needed (a layout copy); to avoid it, give the graph output the rank the toolkit keeps"
            severity = "info"
        else:
            unexplained += 1
            why = f"{tool} ran it on {place.placement}, check --profile {profile} predicted {expected}"
            fix = f"profile {profile}: record this placement (a recorded {tool} run has the last word)"
            severity = "warn"
        rows.append({
            Col.NODE: mapped.node, Col.OP_TYPE: graph.op_type.get(mapped.node, place.op_type),
            "rule": "vendor-placement", "attribute": Col.PLACEMENT, "value": place.placement,
            "limit": expected, "severity": severity, Col.PLACEMENT: place.placement.split("-")[0],
            "partition": "", "fix": fix, "profile": profile, "vendor_layer": place.name, Col.REASON: why,
        })
    return pd.DataFrame(rows), unexplained, explained


def _site_nodes(qs_layers: pd.DataFrame) -> dict[str, str]:
    """Site output tensor -> the site's first node: a vendor names a fused kernel (Conv+BN+HardSwish)
    by its first node and its output by the last node's tensor, as quantscan's sites do."""
    if qs_layers is None or qs_layers.empty or Col.OUTPUT not in qs_layers or Col.NODE not in qs_layers:
        return {}
    return {str(t): str(n) for t, n in zip(qs_layers[Col.OUTPUT], qs_layers[Col.NODE], strict=True)}


def _fused_site_output(layer: str, mapped: Mapped, isolated: Mapping[str, float], first_of: Mapping[str, str]) -> bool:
    """A layer RKNN named after a quantscan *site* output with a layout or fusion suffix holds that site's
    values even when its op is not the producer's: the fused LayerNorm (`p2o.Add.235_tp-rs`, exNorm),
    attention (`p2o.MatMul.5_sdpa`), SiLU (`swish_13.tmp_0_tp-rs`, exSwish) or MatMul+bias run as a Conv
    (`p2o.Add.239-rs`) of PP-OCRv4 rec's neck; a LayerNorm RKNN names after its first node (`_2ln`).
    Not a `_sw` name: that is the op RKNN moved, the reader."""
    if not mapped.tensor:
        return layer.endswith("_2ln") and mapped.node in first_of
    return mapped.derived and mapped.tensor in isolated and not layer.endswith("_sw")


def _kernel_output(mapped: Mapped, isolated: Mapping[str, float], first_of: Mapping[str, str]) -> str:
    """The tensor whose quantscan figures a vendor layer is compared with: its own, or, for a name RKNN
    derived from a kernel's inner tensor (the classifier FC `p2o.pd_op.matmul.0.0_rs_sw`: MatMul with its
    bias Add fused, named after the MatMul's output), the output of the site that kernel starts."""
    if not mapped.derived or mapped.tensor in isolated or mapped.node not in first_of:
        return mapped.tensor
    # an inner tensor, or a name derived from the kernel's first node (`_2ln`): the site's output
    return first_of[mapped.node]


def _predicted(predicted: Mapping[str, str], node: str, kernel: str) -> str:
    """check's placement of a node, or of the kernel it belongs to when that one has a finding."""
    return predicted.get(node) or predicted.get(kernel) or "npu"


def _by(frame: pd.DataFrame, key: str, value: str) -> dict[str, float]:
    if frame is None or frame.empty or key not in frame or value not in frame:
        return {}
    return {str(k): float(v) for k, v in zip(frame[key], frame[value], strict=True)}


def agreement(table: pd.DataFrame, top: int = 5) -> dict[str, float | int]:
    """How well quantscan ranks layers the way the vendor does, over the layers both measured:
    Spearman of isolated vs single and cumulative vs entire cosine (also per quantscan site, see
    `by_site`), and how many of each side's `top` worst layers (lowest cosine) the other side also has
    in its `top`."""
    out: dict[str, float | int] = {}
    pairs = (("isolated", "qs_isolated_cosine", "vendor_single_cosine"),
             ("cumulative", "qs_cumulative_cosine", "vendor_entire_cosine"))
    for name, ours, theirs in pairs:
        both = table[[ours, theirs, "layer"]].dropna() if not table.empty else table
        out[f"{name}_layers"] = int(len(both))
        if len(both) < 3:
            out[f"spearman_{name}"] = math.nan
            out[f"top{top}_overlap_{name}"] = 0
            continue
        out[f"spearman_{name}"] = float(both[ours].astype(float).corr(both[theirs].astype(float), method="spearman"))
        worst_ours = set(both.nsmallest(top, ours)["layer"])
        worst_theirs = set(both.nsmallest(top, theirs)["layer"])
        out[f"top{top}_overlap_{name}"] = len(worst_ours & worst_theirs)
        errors = (both[ours].astype(float) - both[theirs].astype(float)).abs()
        out[f"mean_abs_delta_{name}"] = float(errors.mean())
        sites = by_site(both, ours, theirs)
        out[f"{name}_sites"] = int(len(sites))
        out[f"spearman_{name}_sites"] = (float(sites[ours].corr(sites[theirs], method="spearman"))
                                         if len(sites) >= 3 else math.nan)
    return out


def by_site(both: pd.DataFrame, ours: str, theirs: str) -> pd.DataFrame:
    """One row per quantscan figure: the vendor layers that map to the same quantscan tensor (RKNN's
    `out0_mm`, `out0_int8`, `out0` for one Gemm site) collapsed to their worst vendor figure. Repeating
    one quantscan value against three vendor values makes ties the rank correlation counts as
    disagreement (MTCNN PNet: 0.49 over 7 rows, 0.90 over its 5 sites)."""
    frame = both[[ours, theirs]].astype(float)
    return frame.groupby(frame[ours].round(12), as_index=False).agg({ours: "first", theirs: "min"})
