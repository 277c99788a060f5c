"""`quantscan compare A B`: the numeric difference between two models, per output and per tensor.

Why a separate command: after a rewrite, an export with other flags or a vendor's round-trip, the
question is "did the numbers move, and where first?". Outputs are compared by name; intermediate
tensors only when the name exists in both models *and* the structure agrees (same producer op type,
same dtype, same shape on the data): a name reused for another computation must not be compared, and
nodes are never paired by their position in the node list. Everything that is not compared is listed
in `unmatched` with the reason, so an empty table is explained rather than silent.

How it runs: the two graphs are merged into one (B's tensors and initializers suffixed `@b`, graph
inputs shared) and every matched pair is reduced to a few per-sample sums inside onnxruntime
(`quantscan.graph.Reducer`), so one session run per sample returns kilobytes instead of every
activation twice. When the models cannot share a graph (different opsets or clashing local
functions) two sessions run side by side and the matched tensors are exposed and compared in numpy.
Samples are streamed one at a time by `quantscan.calib.source` (the one sample source extract uses
too): the calibration set, or seeded random data (said in the result) when none is given. Metrics
are those of the contract (`quantscan.metrics`), with A as the reference.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pandas as pd

from quantscan import graph as qgraph
from quantscan import metrics as qm
from quantscan.calib import CalibSet
from quantscan.calib.calibset import Sample
from quantscan.calib.source import data_source
from quantscan.columns import Col
from quantscan.errors import UsageError
from quantscan.model import ModelArg, graph_inputs, load_model, name_unnamed_nodes, onnx_opset
from quantscan.runfolder import atomic_write_bytes as write_atomic
from quantscan.runfolder import csv_text
from quantscan.runfolder import jsonable as _json_safe
from quantscan.runner import Runner, Session
from quantscan.specs import InputSpec

B_SUFFIX = "@b"
CLASSIFIER_OPS = frozenset({"Softmax", "LogSoftmax"})
_PASS_THROUGH = frozenset({"Identity", "Reshape", "Flatten", "Squeeze"})
_REDUCED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
"""Tensors reduced inside the graph; other float types (float16, ...) are fetched and summed in numpy."""


# --- records ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Unmatched:
    """A tensor or output that was not compared, and why (`side`: "a", "b" or "both")."""

    tensor: str
    side: str
    reason: str


@dataclass
class CompareResult:
    """Per-output and per-tensor metrics of B against A (the reference), and what was left out."""

    outputs: pd.DataFrame
    tensors: pd.DataFrame
    unmatched: list[Unmatched]
    data: str
    samples: int
    random_data: bool
    mode: str
    models: dict[str, str]
    warnings: list[str] = field(default_factory=list)

    def outputs_below(self, min_cosine: float) -> list[str]:
        """Outputs whose cosine is below `min_cosine`; a NaN cosine (nothing compared) counts as below."""
        if self.outputs.empty:
            return []
        cos = self.outputs["cosine"].astype(float)
        bad = self.outputs[~(cos >= min_cosine)]
        return [str(n) for n in bad[Col.OUTPUT]]

    def to_json(self) -> dict[str, Any]:
        """The content of compare.json (strict JSON: non-finite floats become strings)."""
        return _json_safe(
            {
                "models": self.models,
                "data": self.data,
                "samples": self.samples,
                "random_data": self.random_data,
                "mode": self.mode,
                "outputs": self.outputs.to_dict(orient="records"),
                "unmatched": [asdict(u) for u in self.unmatched],
                "warnings": self.warnings,
            }
        )

    def write(self, out: str | Path) -> list[Path]:
        """outputs.csv, tensors.csv, unmatched.csv and compare.json in `out`, each written atomically."""
        folder = Path(out)
        unmatched = pd.DataFrame([asdict(u) for u in self.unmatched], columns=["tensor", "side", Col.REASON])
        files = {
            "outputs.csv": csv_text(self.outputs).encode(),
            "tensors.csv": csv_text(self.tensors).encode(),
            "unmatched.csv": csv_text(unmatched).encode(),
            "compare.json": (json.dumps(self.to_json(), indent=1, allow_nan=False) + "\n").encode(),
        }
        written = []
        for name, data in files.items():
            write_atomic(folder / name, data)
            written.append(folder / name)
        return written


# --- models -------------------------------------------------------------------------------------------------


def load_side(model: ModelArg) -> tuple[str, onnx.ModelProto, list[InputSpec]]:
    """(label, proto, inputs) of a path or an in-memory model; unnamed nodes get the loader's names."""
    if isinstance(model, onnx.ModelProto):
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        name_unnamed_nodes(proto)
        return "<in-memory model>", proto, graph_inputs(proto)
    loaded = load_model(model)
    return str(loaded.path), loaded.proto, loaded.inputs


def _check_inputs(a: Sequence[InputSpec], b: Sequence[InputSpec]) -> None:
    """Both models must be fed the same tensors: same input names, same dtypes (shapes may differ)."""
    sa, sb = {s.name: s for s in a}, {s.name: s for s in b}
    if set(sa) != set(sb):
        raise UsageError(
            f"compare: expected A and B to take the same inputs, found {_fmt_inputs(a)} in A "
            f"and {_fmt_inputs(b)} in B"
        )
    for name, spec in sa.items():
        if spec.dtype != sb[name].dtype:
            raise UsageError(
                f"compare: expected input '{name}' to have the same dtype in both models, "
                f"found {spec.dtype} in A and {sb[name].dtype} in B"
            )


def _fmt_inputs(specs: Sequence[InputSpec]) -> str:
    return "(" + ", ".join(f"{s.name}:{s.dtype}" for s in specs) + ")" if specs else "(none)"


# --- probing and matching ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ComparedTensor:
    """A tensor as the first sample showed it, and the node that produced it."""

    dtype: np.dtype
    shape: tuple[int, ...]
    producer: str
    op_type: str
    order: int


def probe(proto: onnx.ModelProto, sample: Sample, runner: Runner) -> dict[str, ComparedTensor]:
    """Run once with every top-level tensor exposed: dtypes and shapes as the runtime sees them.

    Why data and not shape inference: symbolic and data-dependent dims are common in real exports and
    inference leaves them unknown; the runtime never does.
    """
    nodes = list(proto.graph.node)
    names = [o for n in nodes for o in n.output if o]
    values = runner.session(qgraph.expose(proto, names)).run(sample)
    info: dict[str, ComparedTensor] = {}
    for order, node in enumerate(nodes):
        for out in node.output:
            if out and out in values:
                v = np.asarray(values[out])
                info[out] = ComparedTensor(v.dtype, tuple(v.shape), node.name, node.op_type, order)
    return info


@dataclass(frozen=True)
class Pair:
    """A tensor compared in both models (B's copy is `name@b` in the merged graph)."""

    name: str
    a: ComparedTensor
    b: ComparedTensor

    @property
    def reduced(self) -> bool:
        return self.a.dtype in _REDUCED_DTYPES and int(np.prod(self.a.shape)) > 0


def match_tensors(
    a: onnx.ModelProto, b: onnx.ModelProto, info_a: Mapping[str, ComparedTensor], info_b: Mapping[str, ComparedTensor]
) -> tuple[list[Pair], list[Pair], list[Unmatched]]:
    """(output pairs, intermediate pairs, unmatched): by name, then producer op type, dtype and shape."""
    outs_a = [o.name for o in a.graph.output]
    outs_b = {o.name for o in b.graph.output}
    unmatched: list[Unmatched] = []
    outputs: list[Pair] = []
    for name in outs_a:
        if name not in outs_b:
            unmatched.append(Unmatched(name, "a", "graph output of A only"))
            continue
        why = _mismatch(info_a.get(name), info_b.get(name), require_float=False, same_op=False)
        if why:
            unmatched.append(Unmatched(name, "both", why))
        else:
            outputs.append(Pair(name, info_a[name], info_b[name]))
    unmatched += [Unmatched(n, "b", "graph output of B only") for n in outs_b if n not in set(outs_a)]
    both_outputs = set(outs_a) & outs_b
    tensors: list[Pair] = []
    for name, ia in info_a.items():
        if name in both_outputs:
            continue
        if name not in info_b:
            unmatched.append(Unmatched(name, "a", "no tensor of this name is produced in B"))
            continue
        why = _mismatch(ia, info_b[name], require_float=True, same_op=True)
        if why:
            unmatched.append(Unmatched(name, "both", why))
        else:
            tensors.append(Pair(name, ia, info_b[name]))
    unmatched += [
        Unmatched(n, "b", "no tensor of this name is produced in A")
        for n in info_b
        if n not in info_a and n not in both_outputs
    ]
    return outputs, tensors, unmatched


def _mismatch(ia: ComparedTensor | None, ib: ComparedTensor | None, *, require_float: bool, same_op: bool) -> str:
    """Why two same-named tensors are not the same quantity; "" when they can be compared."""
    if ia is None or ib is None:
        return "not returned by the runtime" + (" in A" if ia is None else " in B")
    if same_op and ia.op_type != ib.op_type:
        return f"producer differs: {ia.op_type} ({ia.producer}) in A, {ib.op_type} ({ib.producer}) in B"
    if ia.dtype != ib.dtype:
        return f"dtype differs: {ia.dtype} in A, {ib.dtype} in B"
    if ia.shape != ib.shape:
        return f"shape differs: {list(ia.shape)} in A, {list(ib.shape)} in B"
    if require_float and ia.dtype.kind != "f":
        return f"not a float tensor ({ia.dtype})"
    if ia.dtype.kind not in "biuf":
        return f"not a numeric tensor ({ia.dtype})"
    return ""


# --- the merged graph -------------------------------------------------------------------------------------


def merge_models(a: onnx.ModelProto, b: onnx.ModelProto, suffix: str = B_SUFFIX) -> onnx.ModelProto | None:
    """A and B in one graph sharing A's inputs; every other name of B gets `suffix`.

    None when they cannot share one model: a domain imported at different opset versions, or a local
    function defined differently in each. Names in B's subgraphs are renamed too (ONNX names are
    unique across nested scopes, and A's copy of the same name must not collide).
    """
    opsets = {imp.domain or "ai.onnx": imp.version for imp in a.opset_import}
    for imp in b.opset_import:
        domain = imp.domain or "ai.onnx"
        if opsets.setdefault(domain, imp.version) != imp.version:
            return None
    funcs = {(f.domain, f.name): f for f in a.functions}
    for f in b.functions:
        known = funcs.get((f.domain, f.name))
        if known is not None and known.SerializeToString() != f.SerializeToString():
            return None
    shared = {s.name for s in graph_inputs(b)}
    renamed = onnx.GraphProto()
    renamed.CopyFrom(b.graph)
    _rename_graph(renamed, lambda n: n if not n or n in shared else n + suffix, suffix)
    merged = onnx.ModelProto()
    merged.CopyFrom(a)
    merged.ir_version = max(a.ir_version, b.ir_version)
    del merged.opset_import[:]
    merged.opset_import.extend(
        onnx.helper.make_opsetid("" if d == "ai.onnx" else d, v) for d, v in sorted(opsets.items())
    )
    merged.functions.extend(f for f in b.functions if (f.domain, f.name) not in funcs)
    merged.graph.node.extend(renamed.node)
    merged.graph.initializer.extend(renamed.initializer)
    merged.graph.sparse_initializer.extend(renamed.sparse_initializer)
    return merged


def _rename_graph(g: onnx.GraphProto, rename: Callable[[str], str], suffix: str) -> None:
    for node in g.node:
        if node.name:
            node.name = node.name + suffix
        for i, name in enumerate(node.input):
            node.input[i] = rename(name)
        for i, name in enumerate(node.output):
            node.output[i] = rename(name)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _rename_graph(attr.g, rename, suffix)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    _rename_graph(sub, rename, suffix)
    for t in g.initializer:
        t.name = rename(t.name)
    for st in g.sparse_initializer:
        st.values.name = rename(st.values.name)
    for vi in [*g.input, *g.output, *g.value_info]:
        vi.name = rename(vi.name)


# --- accumulation -------------------------------------------------------------------------------------------


@dataclass
class _Accs:
    outputs: dict[str, qm.ErrorAccumulator]
    top1: dict[str, qm.Top1Accumulator]
    tensors: dict[str, qm.ErrorAccumulator]


class _Evaluator:
    """One way of running both models per sample and feeding the accumulators."""

    def run(self, sample: Sample, accs: _Accs, labels: Sequence[int | None] | None) -> None:
        raise NotImplementedError


def _feed_full(accs: _Accs, name: str, x: np.ndarray, y: np.ndarray, labels: Sequence[int | None] | None,
               into: dict[str, qm.ErrorAccumulator]) -> None:
    """Whole tensors of one sample; a rank-0 tensor is one sample of one element."""
    x, y = np.asarray(x), np.asarray(y)
    into[name].update(x.reshape(1, -1), y.reshape(1, -1))
    if name in accs.top1:
        accs.top1[name].update(x, y, labels)


class _Merged(_Evaluator):
    """One session on the merged graph: outputs fetched whole, matched tensors reduced in-graph."""

    def __init__(self, merged: onnx.ModelProto, outputs: Sequence[Pair], tensors: Sequence[Pair],
                 runner: Runner) -> None:
        reducer = qgraph.Reducer(onnx_opset(merged))
        self.full = [p.name for p in outputs] + [p.name for p in tensors if not p.reduced]
        self.output_names = {p.name for p in outputs}
        # rank 1: one [1, elements] row per run, i.e. per sample whatever the tensor's own axis 0 means.
        self.pairs = {p.name: reducer.pair(p.name, p.name + B_SUFFIX, 1) for p in tensors if p.reduced}
        fetch = [*self.full, *(n + B_SUFFIX for n in self.full)]
        fetch += [s for ps in self.pairs.values() for s in ps.names()]
        self.session: Session = runner.session(reducer.attach(merged, fetch))
        self.fetch = list(dict.fromkeys(fetch))

    def run(self, sample: Sample, accs: _Accs, labels: Sequence[int | None] | None) -> None:
        values = self.session.run(sample, self.fetch)
        for name in self.full:
            into = accs.outputs if name in self.output_names else accs.tensors
            _feed_full(accs, name, values[name], values[name + B_SUFFIX], labels, into)
        for name, ps in self.pairs.items():
            accs.tensors[name].update_sums(*ps.fold(values))


class _TwoSessions(_Evaluator):
    """Fallback when the graphs cannot be merged: both models with the matched tensors exposed."""

    def __init__(self, a: onnx.ModelProto, b: onnx.ModelProto, outputs: Sequence[Pair],
                 tensors: Sequence[Pair], runner: Runner) -> None:
        self.names = [p.name for p in outputs] + [p.name for p in tensors]
        self.output_names = {p.name for p in outputs}
        self.a = runner.session(qgraph.expose(a, self.names))
        self.b = runner.session(qgraph.expose(b, self.names))

    def run(self, sample: Sample, accs: _Accs, labels: Sequence[int | None] | None) -> None:
        va = self.a.run(sample, self.names)
        vb = self.b.run(sample, self.names)
        for name in self.names:
            into = accs.outputs if name in self.output_names else accs.tensors
            _feed_full(accs, name, va[name], vb[name], labels, into)


# --- entry point --------------------------------------------------------------------------------------------


def compare(
    a: ModelArg,
    b: ModelArg,
    calib: CalibSet | str | Path | None = None,
    *,
    limit: int | None = None,
    seed: int = 0,
    runner: Runner | None = None,
    consts: Mapping[str, float] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    out: str | Path | None = None,
) -> CompareResult:
    """Compare B against A (the reference) on the same samples; write CSVs to `out` when given.

    Raises UsageError when the models take different inputs (names or dtypes) and for bad
    `limit`/`consts`/`input_shapes`; calibration problems raise CalibrationError.
    """
    label_a, proto_a, inputs_a = load_side(a)
    label_b, proto_b, inputs_b = load_side(b)
    _check_inputs(inputs_a, inputs_b)
    runner = runner or Runner()
    source = data_source(calib, inputs_a, other_inputs=inputs_b, limit=limit, seed=seed, consts=consts,
                         input_shapes=input_shapes)
    samples = source.samples()
    first = next(samples, None)
    if first is None:
        raise UsageError("compare: expected at least one sample, found none")
    info_a, info_b = probe(proto_a, first, runner), probe(proto_b, first, runner)
    out_pairs, tensor_pairs, unmatched = match_tensors(proto_a, proto_b, info_a, info_b)
    merged = merge_models(proto_a, proto_b)
    evaluator: _Evaluator
    if merged is not None:
        evaluator, mode = _Merged(merged, out_pairs, tensor_pairs, runner), "one merged session"
    else:
        evaluator = _TwoSessions(proto_a, proto_b, out_pairs, tensor_pairs, runner)
        mode = "two sessions (the models import different opsets or functions)"
    accs = _Accs(
        {p.name: qm.ErrorAccumulator() for p in out_pairs},
        {p.name: qm.Top1Accumulator() for p in out_pairs if _is_classifier(proto_a, p, source.labels)},
        {p.name: qm.ErrorAccumulator() for p in tensor_pairs},
    )
    count = _stream(evaluator, _chain(first, samples), accs, source.labels)
    result = CompareResult(
        outputs=_output_table(out_pairs, accs, source.labels is not None),
        tensors=_tensor_table(tensor_pairs, accs),
        unmatched=unmatched,
        data=source.description,
        samples=count,
        random_data=source.random,
        mode=mode,
        models={"a": label_a, "b": label_b},
        warnings=_nonfinite_warnings(accs),
    )
    if out is not None:
        result.write(out)
    return result


def _chain(first: Sample, rest: Iterator[Sample]) -> Iterator[Sample]:
    yield first
    yield from rest


def _stream(evaluator: _Evaluator, samples: Iterable[Sample], accs: _Accs,
            labels: Sequence[int | None] | None) -> int:
    count = 0
    for sample in samples:
        evaluator.run(sample, accs, [labels[count]] if labels is not None else None)
        count += 1
    return count


def _is_classifier(proto: onnx.ModelProto, pair: Pair, labels: Sequence[int | None] | None) -> bool:
    """[N, C] (or [N, C, 1, 1]) scores from a Softmax, or with as many classes as the set has labels."""
    if not qm.looks_like_classifier(pair.a.shape) or pair.a.dtype.kind != "f":
        return False
    producers = {o: n for n in proto.graph.node for o in n.output}
    node = producers.get(pair.name)
    while node is not None and node.op_type in _PASS_THROUGH:
        node = producers.get(node.input[0])
    if node is not None and node.op_type in CLASSIFIER_OPS:
        return True
    return labels is not None and max((x for x in labels if x is not None), default=-1) < pair.a.shape[1]


_METRIC_COLUMNS = (
    "cosine", "sqnr_db", "mse", "max_abs", "rel_l2", "worst_sample_cosine", "mean_sample_cosine"
)


def _metrics(acc: qm.ErrorAccumulator) -> dict[str, float]:
    values = acc.as_dict()
    row = {k: values[k] for k in _METRIC_COLUMNS}
    row["nonfinite_a"], row["nonfinite_b"] = float(acc.nonfinite_ref), float(acc.nonfinite_test)
    return row


def _output_table(pairs: Sequence[Pair], accs: _Accs, labelled: bool) -> pd.DataFrame:
    rows = []
    for p in pairs:
        row: dict[str, Any] = {Col.OUTPUT: p.name, "dtype": str(p.a.dtype), "shape": list(p.a.shape)}
        row.update(_metrics(accs.outputs[p.name]))
        top1 = accs.top1.get(p.name)
        row["top1_agreement"] = top1.agreement if top1 else math.nan
        if labelled:
            row["accuracy_a"] = top1.ref_accuracy if top1 and top1.ref_accuracy is not None else math.nan
            row["accuracy_b"] = top1.accuracy if top1 and top1.accuracy is not None else math.nan
        row["samples"] = accs.outputs[p.name].samples
        rows.append(row)
    columns = [Col.OUTPUT, "dtype", "shape", *_METRIC_COLUMNS, "nonfinite_a", "nonfinite_b", "top1_agreement"]
    columns += ["accuracy_a", "accuracy_b"] if labelled else []
    return pd.DataFrame(rows, columns=[*columns, "samples"])


def _tensor_table(pairs: Sequence[Pair], accs: _Accs) -> pd.DataFrame:
    rows = []
    for p in sorted(pairs, key=lambda q: q.a.order):
        row: dict[str, Any] = {
            "tensor": p.name,
            "producer": p.a.producer,
            "producer_b": p.b.producer,
            Col.OP_TYPE: p.a.op_type,
            Col.ORDER: p.a.order,
            "shape": list(p.a.shape),
        }
        row.update(_metrics(accs.tensors[p.name]))
        rows.append(row)
    columns = ["tensor", "producer", "producer_b", Col.OP_TYPE, Col.ORDER, "shape", *_METRIC_COLUMNS,
               "nonfinite_a", "nonfinite_b"]
    return pd.DataFrame(rows, columns=columns)


def _nonfinite_warnings(accs: _Accs) -> list[str]:
    found = [
        f"NaN/Inf in '{name}' ({acc.nonfinite_ref} elements in A, {acc.nonfinite_test} in B): "
        "left out of its sums"
        for name, acc in [*accs.outputs.items(), *accs.tensors.items()]
        if acc.nonfinite_ref or acc.nonfinite_test
    ]
    return found
