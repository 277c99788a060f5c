"""`extract(model, node, context=K)`: the smallest model around a node that a vendor can run.

The node, its producers up to depth K and its consumers, widened to whole kernels (sites.py's grouping,
a Conv's BatchNormalization included: a cut inside a fused Conv+activation gives a model that no longer
fuses, so it no longer reproduces), as a valid model (checked with `onnx.checker.check_model(full_check=True)`).
Cut tensors become typed graph inputs/outputs (from `onnx.shape_inference` with data propagation; where
that leaves a type or rank unknown, from one run of the full model on data). Initializers and
constant-only producers (Constant nodes holding Paddle weights, shape arithmetic on constants) are
carried along and never count as context. `Extractor` is the cut itself, which `shrink` and `prefixes`
reuse. One of the three jobs of `quantscan extract` (extract.py lists them).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from quantscan import graph as qgraph
from quantscan.calib import CalibSet
from quantscan.calib.source import data_source
from quantscan.compare import load_side
from quantscan.errors import ModelError, UsageError
from quantscan.graph.infer import check_model, infer_shapes
from quantscan.model import ModelArg
from quantscan.runfolder import PRODUCER, is_quantscan_onnx, refuse_foreign_overwrite
from quantscan.runfolder import atomic_write_bytes as write_atomic
from quantscan.runner import Runner
from quantscan.sites import find_sites
from quantscan.specs import InputSpec

_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                          onnx.TensorProto.BFLOAT16})

_NOT_CONSTANT = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}
)
"""Ops without non-constant inputs whose output still changes per run: never carried as constants."""

class UntypedError(UsageError):
    """A cut tensor has no known rank: shape inference left it open and no data could run the model."""


# --- results ---------------------------------------------------------------------------------------------


@dataclass
class ExtractResult:
    """An extracted model, which nodes of the source it holds, and its cut tensors."""

    model: onnx.ModelProto
    node: str
    context: int
    nodes: list[str]
    inputs: list[str]
    outputs: list[str]
    source: onnx.ModelProto = field(repr=False)
    source_path: Path | None = None
    kernel: list[str] = field(default_factory=list)
    """The nodes of the centre node's kernel (as the chip fuses them), first node first."""
    kernel_name: str = ""
    """The kernel's pattern, e.g. `Conv+BatchNormalization+PRelu`."""

    def save(self, out: str | Path, *, force: bool = False) -> Path:
        """Write the model atomically; refuses the source model's own path and files quantscan did not write."""
        return save_extracted(self.model, Path(out), self.source_path, force)


def companion_paths(model_path: str | Path) -> tuple[Path, Path]:
    """`min.onnx` -> (`min.inputs.npz`, `min.expected.npz`), beside the model."""
    p = Path(model_path)
    stem = p.name[: -len(p.suffix)] if p.suffix else p.name
    return p.with_name(f"{stem}.inputs.npz"), p.with_name(f"{stem}.expected.npz")


def save_extracted(model: onnx.ModelProto, target: Path, source: Path | None, force: bool) -> Path:
    """The model and, before it is written, its sidecars: they are ours only when the model they belong
    to is (a `min.inputs.npz` beside a model quantscan did not write is the user's)."""
    _refuse_source(target, source)
    refuse_foreign_overwrite(target, "-o", is_quantscan_onnx, force)
    ours = target.is_file() and is_quantscan_onnx(target)
    stem = target.name[: -len(target.suffix)] if target.suffix else target.name
    for sidecar in (*companion_paths(target), target.with_name(f"{stem}.extract.json"), Path(f"{target}.log")):
        if source is not None and sidecar.resolve() == source.resolve():
            _refuse_source(sidecar, source)
        refuse_foreign_overwrite(sidecar, "-o", lambda _p: ours, force)
    model.producer_name = PRODUCER  # marks it ours: a rerun may replace it without --force
    write_atomic(target, model.SerializeToString())
    return target


def _refuse_source(target: Path, source: Path | None) -> None:
    if source is not None and target.resolve() == source.resolve():
        raise UsageError(f"-o: expected a path other than the input model, found the input itself ({source})")


# --- graph index --------------------------------------------------------------------------------------------


def _subgraph_refs(node: onnx.NodeProto) -> list[str]:
    """Outer-scope tensors a node's subgraphs (If/Loop/Scan bodies) read: implicit inputs."""
    refs: list[str] = []
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            local = {i.name for i in g.input} | {t.name for t in g.initializer}
            local |= {o for n in g.node for o in n.output}
            used = [i for n in g.node for i in [*n.input, *_subgraph_refs(n)]] + [o.name for o in g.output]
            refs += [u for u in used if u and u not in local]
    return list(dict.fromkeys(refs))


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Every tensor a node reads: its inputs and what its subgraphs read from the outer scope."""
    return list(dict.fromkeys([i for i in node.input if i] + _subgraph_refs(node)))


class Extractor:
    """Index of one model for cutting out node sets: producers, consumers, constants and types.

    Built once; `build(indices)` is cheap, which is what makes hundreds of `until_fails` tries fast.
    """

    def __init__(
        self,
        proto: onnx.ModelProto,
        inputs: Sequence[InputSpec],
        *,
        calib: CalibSet | str | Path | None = None,
        consts: Mapping[str, float] | None = None,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        seed: int = 0,
        runner: Runner | None = None,
    ) -> None:
        self.proto = proto
        self.input_specs = list(inputs)
        self.nodes = list(proto.graph.node)
        self.by_name = {n.name: i for i, n in enumerate(self.nodes)}
        self.reads = [node_reads(n) for n in self.nodes]
        self.producer = {o: i for i, n in enumerate(self.nodes) for o in n.output if o}
        self.consumers: dict[str, list[int]] = {}
        for i, names in enumerate(self.reads):
            for name in names:
                self.consumers.setdefault(name, []).append(i)
        self.inits = {t.name: t for t in proto.graph.initializer}
        self.graph_outputs = [o.name for o in proto.graph.output]
        self.const_nodes = self._constant_nodes()
        self.types = _inferred_types(proto)
        self._data = (calib, consts, input_shapes, seed)
        self._runner = runner
        self._probed = False
        self._probe_error = ""
        self._kernels: list[tuple[list[int], str]] | None = None

    # -- lookups

    def index(self, name: str) -> int:
        """A node by name (or by a tensor it produces); unknown names list close ones."""
        if name in self.by_name:
            return self.by_name[name]
        if name in self.producer:
            return self.producer[name]
        close = difflib.get_close_matches(name, [*self.by_name, *self.producer], n=5, cutoff=0.5)
        hint = f"; close names: {', '.join(close)}" if close else ""
        raise UsageError(f"--node: expected a node (or tensor) name of the model, found {name!r}{hint}")

    def searchable(self) -> list[int]:
        """Nodes a search works on: everything but the constant-only ones, in graph order."""
        return [i for i in range(len(self.nodes)) if i not in self.const_nodes]

    def _constant_nodes(self) -> set[int]:
        """Nodes whose every read is constant (initializers or other such nodes): weights, not work."""
        const = set(self.inits)
        found: set[int] = set()
        for i, node in enumerate(self.nodes):
            if node.op_type in _NOT_CONSTANT or node.domain not in ("", "ai.onnx"):
                continue
            if all(r in const for r in self.reads[i]):
                found.add(i)
                const.update(o for o in node.output if o)
        return found

    # -- kernels

    def kernels(self) -> list[tuple[list[int], str]]:
        """(node indices, pattern) of every kernel, as sites.py groups them for the chip; a
        BatchNormalization right after a Conv/Gemm joins that kernel (the scan folds it first)."""
        if self._kernels is None:
            floats = {n for n, t in self.types.items() if t.tensor_type.elem_type in _FLOAT_TYPES}
            floats |= set(self.inits)
            sites = find_sites(self.proto, float_tensors=floats, original_order=self.by_name)
            groups = [([self.by_name[n] for n in s.nodes if n in self.by_name], s.kernel) for s in sites]
            self._kernels = _fold_batchnorm(groups, self.nodes, self.producer)
        return self._kernels

    def kernel_of(self, index: int) -> tuple[list[int], str]:
        """The kernel holding node `index` (a node no kernel claims is its own)."""
        for members, name in self.kernels():
            if index in members:
                return members, name
        return [index], self.nodes[index].op_type

    def whole_kernels(self, chosen: set[int]) -> set[int]:
        """`chosen` widened so that no kernel is cut: every kernel touching it comes in whole."""
        grown = set(chosen)
        for members, _ in self.kernels():
            if grown & set(members):
                grown |= set(members)
        return grown

    # -- regions

    def context(self, centre: int, depth: int) -> set[int]:
        """The node, its producers up to `depth` steps back, and its direct consumers."""
        if depth < 0:
            raise UsageError(f"--context: expected a depth >= 0, found {depth}")
        chosen = {centre}
        frontier = {centre}
        for _ in range(depth):
            frontier = {
                self.producer[r] for i in frontier for r in self.reads[i]
                if r in self.producer and self.producer[r] not in self.const_nodes
            } - chosen
            chosen |= frontier
        chosen |= {c for o in self.nodes[centre].output if o for c in self.consumers.get(o, [])}
        return chosen - (self.const_nodes - {centre})

    def _with_constants(self, chosen: set[int]) -> list[int]:
        """Add the constant-only producers the chosen nodes read (transitively); graph order."""
        kept = set(chosen)
        stack = [r for i in chosen for r in self.reads[i]]
        while stack:
            p = self.producer.get(stack.pop())
            if p is not None and p in self.const_nodes and p not in kept:
                kept.add(p)
                stack.extend(self.reads[p])
        return sorted(kept)

    def boundary(self, kept: Sequence[int], extra_outputs: Iterable[str] = ()) -> tuple[list[str], list[str]]:
        """(inputs, outputs) of a node set: what it reads from outside, what leaves it."""
        inside = set(kept)
        produced = [o for i in kept for o in self.nodes[i].output if o]
        made = set(produced)
        inputs = [r for i in kept for r in self.reads[i] if r not in made and r not in self.inits]
        extra = set(extra_outputs)
        outputs = [
            o for o in produced
            if o in extra or (
                self.producer[o] not in self.const_nodes
                and (o in self.graph_outputs or any(c not in inside for c in self.consumers.get(o, [])))
            )
        ]
        if not outputs:  # a closed set: its sinks are what it computes
            outputs = [
                o for o in produced if not self.consumers.get(o) and self.producer[o] not in self.const_nodes
            ]
        return list(dict.fromkeys(inputs)), list(dict.fromkeys(outputs))

    def build(self, chosen: Iterable[int], extra_outputs: Iterable[str] = (), *, check: bool = True
              ) -> tuple[onnx.ModelProto, list[int], list[str], list[str]]:
        """A standalone model of the chosen nodes (plus their constants); checked when `check`."""
        kept = self._with_constants(set(chosen))
        inputs, outputs = self.boundary(kept, extra_outputs)
        self._ensure_types([*inputs, *outputs])
        reads = {r for i in kept for r in self.reads[i]}
        graph = helper.make_graph(
            [self.nodes[i] for i in kept],
            f"{self.proto.graph.name or 'graph'}_extract",
            [self._value_info(n) for n in inputs],
            [self._value_info(n) for n in outputs],
            initializer=[self.inits[n] for n in self.inits if n in reads],
        )
        model = helper.make_model(graph, opset_imports=list(self.proto.opset_import),
                                  producer_name="quantscan extract")
        model.ir_version = self.proto.ir_version
        model.functions.extend(self.proto.functions)
        if check:
            check_model(model, full_check=True)
        return model, kept, inputs, outputs

    def ancestors(self, tensor: str) -> list[int]:
        """The producer of `tensor` and every node it depends on, constants included, in graph order."""
        wanted = {self.producer[tensor]}
        stack = list(wanted)
        while stack:
            for read in self.reads[stack.pop()]:
                up = self.producer.get(read)
                if up is not None and up not in wanted:
                    wanted.add(up)
                    stack.append(up)
        return sorted(wanted)

    def typed(self, names: Sequence[str]) -> list[onnx.ValueInfoProto]:
        """Value infos of `names`, probing the model on data once where inference left a type open."""
        self._ensure_types(names)
        return [self._value_info(n) for n in names]

    # -- types

    def _value_info(self, name: str) -> onnx.ValueInfoProto:
        vi = onnx.ValueInfoProto(name=name)
        vi.type.CopyFrom(self.types[name])
        return vi

    def _ensure_types(self, names: Sequence[str]) -> None:
        """Probe the full model on data once if any boundary tensor lacks an element type or a rank.

        The checker wants every graph input/output ranked; without usable data (no calibration set,
        and symbolic dims random data cannot fill) such a cut is refused with the probe's reason.
        """
        missing = [n for n in names if not _complete(self.types.get(n))]
        if missing and not self._probed:
            self._probed = True
            try:
                self._probe_types()
            except UsageError as exc:
                self._probe_error = str(exc)
        untyped = [n for n in names if not _complete(self.types.get(n))]
        if untyped:
            why = f": {self._probe_error}" if self._probe_error else ""
            raise UntypedError(
                f"extract: expected shape inference or one run on data to type {', '.join(untyped[:5])}, "
                f"found neither{why}"
            )

    def _probe_types(self) -> None:
        """One run of the full model with every tensor exposed; data fills what inference left unknown."""
        calib, consts, shapes, seed = self._data
        source = data_source(calib, self.input_specs, limit=1, seed=seed, consts=consts, input_shapes=shapes)
        sample = next(source.samples())
        names = [o for o in self.producer]
        runner = self._runner or Runner()
        values = {**sample, **runner.session(qgraph.expose(self.proto, names)).run(sample)}
        for name, value in values.items():
            self.types[name] = _merge_type(self.types.get(name), np.asarray(value))


def _inferred_types(proto: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Types of every tensor from shape inference with data propagation (empty where it fails)."""
    types: dict[str, onnx.TypeProto] = {}
    try:
        inferred = infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:  # inference bugs on exotic graphs must not block extraction: the probe covers it
        inferred = proto
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types[vi.name] = vi.type
    for t in proto.graph.initializer:
        types.setdefault(t.name, helper.make_tensor_type_proto(t.data_type, list(t.dims)))
    return types


def _complete(tp: onnx.TypeProto | None) -> bool:
    """Element type and rank known. A dim inference could not size stays unknown (valid ONNX: any
    size) rather than pinned to one sample's value, which a data-dependent dim would not keep."""
    if tp is None or not tp.HasField("tensor_type") or not tp.tensor_type.elem_type:
        return False
    return tp.tensor_type.HasField("shape")


def _merge_type(known: onnx.TypeProto | None, value: np.ndarray) -> onnx.TypeProto:
    """Inferred dims where inference had them (symbols survive), the data's dims elsewhere."""
    elem = helper.np_dtype_to_tensor_dtype(value.dtype)
    dims: list[int | str | None] = list(value.shape)
    has_shape = known is not None and known.tensor_type.HasField("shape")
    known_dims = known.tensor_type.shape.dim if known is not None and has_shape else None
    if known_dims is not None and len(known_dims) == value.ndim:
        for axis, d in enumerate(known_dims):
            if d.HasField("dim_value"):
                dims[axis] = d.dim_value
            elif d.HasField("dim_param"):
                dims[axis] = d.dim_param
    return helper.make_tensor_type_proto(elem, dims)


# --- extract ------------------------------------------------------------------------------------------------


def extract(
    model: ModelArg,
    node: str,
    *,
    context: int = 1,
    calib: CalibSet | str | Path | None = None,
    consts: Mapping[str, float] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    seed: int = 0,
    runner: Runner | None = None,
    kernels: bool = True,
) -> ExtractResult:
    """The subgraph around `node`: producers up to depth `context`, direct consumers, constants,
    widened to whole kernels unless `kernels=False`; the centre kernel's output is an output.

    `calib`/`consts`/`input_shapes`/`seed` only matter when shape inference leaves a cut tensor's
    type unknown (the full model is then run once on that data, or on seeded random data). The centre
    node's outputs are always graph outputs of the result. Unknown node names raise UsageError with
    the closest names.
    """
    _, proto, inputs = load_side(model)
    ex = Extractor(
        proto, inputs, calib=calib, consts=consts, input_shapes=input_shapes, seed=seed, runner=runner
    )
    centre = ex.index(node)
    chosen = ex.context(centre, context)
    members, kernel_name = ex.kernel_of(centre) if kernels else ([centre], ex.nodes[centre].op_type)
    if kernels:
        chosen = ex.whole_kernels(chosen)
    last = members[-1]  # the kernel's output, not a tensor inside it: an output there would stop the fusion
    produced = [o for o in ex.nodes[last].output if o]
    centre_outputs = [o for o in produced if o in ex.consumers or o in ex.graph_outputs] or produced[:1]
    try:
        sub, kept, sub_inputs, sub_outputs = ex.build(chosen, centre_outputs)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        # the model's own declarations (types, attributes) fail the full check onnx.checker skipped on load
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"expected the subgraph around '{ex.nodes[centre].name}' to pass onnx's full check "
                         f"(shape and type inference), found: {first[:300]}") from None
    return ExtractResult(
        model=sub,
        node=ex.nodes[centre].name,
        context=context,
        nodes=[ex.nodes[i].name for i in kept],
        inputs=sub_inputs,
        outputs=sub_outputs,
        source=proto,
        source_path=None if isinstance(model, onnx.ModelProto) else Path(model),
        kernel=[ex.nodes[i].name for i in members],
        kernel_name=kernel_name,
    )


def _fold_batchnorm(
    groups: list[tuple[list[int], str]], nodes: Sequence[onnx.NodeProto], producer: Mapping[str, int]
) -> list[tuple[list[int], str]]:
    """Join a kernel that starts with BatchNormalization to the Conv/ConvTranspose/Gemm kernel feeding it."""
    owner = {i: k for k, (members, _) in enumerate(groups) for i in members}
    merged = [(list(m), name) for m, name in groups]
    gone: set[int] = set()
    for k, (members, name) in enumerate(groups):
        first = nodes[members[0]]
        if first.op_type != "BatchNormalization" or not first.input:
            continue
        up = producer.get(first.input[0])
        target = owner.get(up) if up is not None else None
        if target is None or target in gone or nodes[merged[target][0][0]].op_type not in ("Conv", "ConvTranspose",
                                                                                          "Gemm"):
            continue
        merged[target] = (merged[target][0] + members, merged[target][1] + "+" + name)
        gone.add(k)
    return [g for k, g in enumerate(merged) if k not in gone]
