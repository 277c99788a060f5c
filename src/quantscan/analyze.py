"""The scan: one FP32 reference, calibrated ranges, then every error figure from one session.

Passes over the data (each a constant number of onnxruntime runs per batch, whatever the number
of sites):
  0. probe: the prepared model with every tensor exposed, on one batch: true dtypes and shapes (the
     declared ones are not trusted) and a numeric check of the preparation (BN folding, opset
     upgrade) against the user's model;
  1. calibration: the prepared FP32 model with in-graph min/max partials (or whole tensors for the
     histogram calibrators) of the tensors whose ranges set the scales;
  2. evaluation: the analysis model (FP32 + cumulative QDQ copy + one isolated twin per site, see
     graph.py) returning in-graph partial sums, per-channel sums and, for the first samples, the
     integer codes behind hist.npz; plus the saved QDQ model under ORT_ENABLE_ALL (the
     deployed-kernel check, reported beside the fake-quant figures).
All comparison sums stream (float64 accumulators), so memory does not grow with the sample count.
`prepare_scan` (passes 0-1 and the plan) is shared with bisection (gain.py).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import onnx
import pandas as pd

from quantscan import graph as qgraph
from quantscan import metrics as qm
from quantscan import quant
from quantscan.calib import CalibSet, load_calibration
from quantscan.errors import CalibrationError, UsageError
from quantscan.model import LoadedModel, PreparedModel, ensure_float_model, load_model, prepare_for_analysis
from quantscan.runner import Runner
from quantscan.sites import DEFAULT_FUSED_ACTIVATIONS, PASS_THROUGH_OPS, Site, find_sites
from quantscan.specs import Dim

CALIB_METHODS = ("minmax", "percentile", "entropy", "mse")
ACTIVATION_SCHEMES = ("uint8", "int8")
INTRINSIC_SQNR_DB = 25.0
"""Below this isolated SQNR (≈ 4 effective bits lost from int8's ~48 dB) a site's error is its own."""
WORST_CHANNEL_SQNR_DB = 12.0
"""Below this per-channel SQNR some channel keeps fewer than ~2 useful bits under a per-tensor scale."""
WEIGHT_WORST_CHANNEL_SQNR_DB = 20.0
"""Below this a weight channel holds outliers that a symmetric per-channel int8 scale cannot serve."""
HIST_BINS = 64
HIST_SAMPLES = 16
"""Value histograms (hist.npz) count the integer codes of the first samples only: a shape, not a sum."""


class ProgressBar(Protocol):
    def update(self, n: int = 1) -> Any: ...
    def close(self) -> Any: ...


ProgressFactory = Callable[[str, int | None], ProgressBar]


class _NoProgress:
    def update(self, n: int = 1) -> None:
        return None

    def close(self) -> None:
        return None


def no_progress(desc: str, total: int | None) -> ProgressBar:
    return _NoProgress()


@dataclass
class ScanOptions:
    """The scan's knobs, named as the CLI flags."""

    calib_method: str = "minmax"
    activations: str | None = None
    """uint8 (asymmetric) or int8 (symmetric); None: the profile's scheme, else uint8."""
    profile: str | Path | None = None
    input_shape: Mapping[str, Sequence[int]] = field(default_factory=dict)
    input_dims: Sequence[str] = ()
    """Dimension settings in the contract's syntax (`INPUT:AXIS=V`, `DIMPARAM=V`, `batch=V`)."""
    const: Mapping[str, float] = field(default_factory=dict)
    limit: int | None = None
    eval: str | Path | None = None
    output: Sequence[str] = ()
    preprocess: str | Path | None = None
    preprocess_overrides: Mapping[str, Any] = field(default_factory=dict)
    threads: int | None = None
    seed: int = 0
    batch_size: int = 8
    save_qdq: str | Path | None = None
    fused_activations: frozenset[str] = DEFAULT_FUSED_ACTIVATIONS
    cpu_nodes: frozenset[str] = frozenset()
    quiet: bool = False
    """Accepted for symmetry with the CLI; progress is whatever `progress=` renders (nothing by default)."""
    no_report: bool = False
    """Skip report.html when writing a run folder."""
    tensors: str = "all"
    """Which tensors get cumulative figures in tensors.csv: "all" float tensors (the contract), or
    "sites" (quantization points and graph outputs only: several times less reduction work on
    models whose kernels hide many internal tensors, e.g. decomposed HardSwish/LayerNorm)."""

    def validate(self) -> None:
        if self.calib_method not in CALIB_METHODS:
            raise UsageError(f"--calib-method: expected one of {', '.join(CALIB_METHODS)}, found {self.calib_method!r}")
        if self.activations is not None and self.activations not in ACTIVATION_SCHEMES:
            raise UsageError(f"--activations: expected uint8 or int8, found {self.activations!r}")
        if self.tensors not in ("all", "sites"):
            raise UsageError(f"--tensors: expected all or sites, found {self.tensors!r}")
        if self.batch_size <= 0:
            raise UsageError(f"--batch-size: expected a positive integer, found {self.batch_size}")


@dataclass
class ScanResult:
    """What a scan found; DataFrames as written to the CSV files of the contract."""

    layers: pd.DataFrame
    tensors: pd.DataFrame
    ops: pd.DataFrame
    channels: pd.DataFrame
    hist: dict[str, np.ndarray]
    output_metrics: dict[str, dict[str, float]]
    headline: dict[str, Any]
    run_info: dict[str, Any]
    warnings: list[str]
    sites: list[Site]
    qdq_model: onnx.ModelProto
    model: LoadedModel
    compat: Any = None
    profile: str | None = None


# --- helpers -------------------------------------------------------------------------------------------


def _input_dims(
    model: LoadedModel, calib: CalibSet, overrides: Mapping[str, Sequence[int]], consts: Mapping[str, float]
) -> tuple[dict[str, tuple[Dim, ...]], int | None]:
    """Concrete input dims from the data (or --input-shape); a free batch dim stays symbolic.

    Returns the dims and the fixed batch size (None when the batch dim is free).
    """
    shapes = calib.sample_shapes()
    dims: dict[str, tuple[Dim, ...]] = {}
    fixed_batch: int | None = None
    for spec in model.inputs:
        if spec.name in overrides:
            dims[spec.name] = tuple(int(v) for v in overrides[spec.name])
            if spec.name not in consts and fixed_batch is None and dims[spec.name]:
                fixed_batch = int(dims[spec.name][0])  # type: ignore[arg-type]
            continue
        data = shapes.get(spec.name)
        if data is None:
            continue
        if len(data) != len(spec.shape):
            raise CalibrationError(
                f"input '{spec.name}': expected rank {len(spec.shape)} {list(spec.shape)}, "
                f"found data of shape {list(data)}"
            )
        new: list[Dim] = []
        for axis, (declared, found) in enumerate(zip(spec.shape, data, strict=True)):
            if axis == 0 and not isinstance(declared, int):
                new.append(declared if isinstance(declared, str) and declared else "N")
                continue
            if isinstance(declared, int) and declared > 0 and declared != found and axis != 0:
                raise CalibrationError(
                    f"input '{spec.name}': expected dim {axis} = {declared}, found {found} in the calibration data"
                )
            new.append(int(found) if not (axis == 0 and isinstance(declared, int)) else declared)
        if spec.shape and isinstance(spec.shape[0], int) and spec.name not in consts and fixed_batch is None:
            fixed_batch = int(spec.shape[0])
        dims[spec.name] = tuple(new)
    return dims, fixed_batch


def _apply_dim_settings(
    model: LoadedModel, dims: dict[str, tuple[Dim, ...]], fixed_batch: int | None, settings: Sequence[str]
) -> tuple[dict[str, tuple[Dim, ...]], int | None]:
    """Apply `--input-shape INPUT:AXIS=V / DIMPARAM=V / batch=V` on top of the dims the data gave.

    Axis 0 settings fix the batch (samples are grouped by V); other axes must agree with the data.
    """
    from quantscan.rewrites.fix_dim import parse_dim_spec

    declared = {s.name: s.shape for s in model.inputs}
    for text in settings:
        setting = parse_dim_spec(text)
        hits = []
        for name, shape in declared.items():
            for axis, dim in enumerate(shape):
                if (setting.batch and axis == 0 and not isinstance(dim, int)) or (
                    setting.input == name and setting.axis == axis) or (setting.param and dim == setting.param):
                    hits.append((name, axis))
        if not hits:
            raise UsageError(
                f"--input-shape {text}: expected a dim of an input ({', '.join(declared)}) to match, found none"
            )
        for name, axis in hits:
            current = list(dims.get(name, declared[name]))
            if axis == 0:
                fixed_batch = setting.value
            elif isinstance(current[axis], int) and current[axis] != setting.value:
                raise CalibrationError(
                    f"--input-shape {text}: expected the data's dim {axis} of '{name}' to be {setting.value}, "
                    f"found {current[axis]}"
                )
            current[axis] = setting.value
            dims[name] = tuple(current)
    return dims, fixed_batch


def _n_batches(n_samples: int, batch_size: int) -> int:
    return max(1, math.ceil(n_samples / batch_size))


def _origin(tensor: str, producers: Mapping[str, onnx.NodeProto], site_outputs: set[str]) -> str:
    """Walk back through scale-preserving ops (single data input) to where the scale is decided."""
    seen = set()
    current = tensor
    while current not in site_outputs and current not in seen:
        seen.add(current)
        node = producers.get(current)
        if node is None or node.op_type not in (*PASS_THROUGH_OPS, "Cast") or node.op_type in ("Concat", "Split"):
            break
        current = node.input[0]
    return current


def _is_state_output(name: str, shape: tuple[int, ...], inputs: Mapping[str, tuple[int, ...]]) -> bool:
    """A recurrent state output (e.g. silero's `stateN` for input `state`) is not a headline output."""
    return any(name != i and name.startswith(i) and tuple(shape) == tuple(s) for i, s in inputs.items())


# --- the scan ------------------------------------------------------------------------------------------


@dataclass
class ScanContext:
    """Everything up to the quantization plan: what bisection and output-gain analyses build on.

    `sites`, `plan` and `qdq` describe the all-int8 model; `prepared` is the FP32 analysis copy
    (same tensor names as the user's model), `probe` the true dtypes/shapes of every tensor.
    """

    loaded: LoadedModel
    prepared: PreparedModel
    cset: CalibSet
    eval_set: CalibSet
    opts: ScanOptions
    runner: Runner
    batch_size: int
    probe: Probe
    sites: list[Site]
    origins: dict[str, str]
    calib_stats: CalibStats
    plan: qgraph.QuantPlan
    qdq: onnx.ModelProto
    order: dict[str, int]
    warnings: list[str]
    times: dict[str, float]
    compat: Any = None
    """compat.CheckResult when a profile was given."""
    profile: str | None = None

    def classifier_outputs(self, outputs: Sequence[str]) -> set[str]:
        """Which of `outputs` are classifier outputs (top-1 agreement applies)."""
        return classifier_outputs(self.prepared, outputs, self.probe)

    def headline_outputs(self) -> list[str]:
        """The graph outputs the headline metric uses (contract: `--output`, else non-state float outputs)."""
        return _headline_outputs(self.probe, self.opts.output)


def prepare_scan(
    model: str | Path | LoadedModel,
    calib: str | Path | CalibSet,
    *,
    progress: ProgressFactory = no_progress,
    runner: Runner | None = None,
    **options: Any,
) -> ScanContext:
    """Load, validate, prepare, find sites and calibrate: the common front half of scan and bisect."""
    opts = ScanOptions(**options)
    opts.validate()
    started = time.perf_counter()
    times: dict[str, float] = {}
    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    ensure_float_model(loaded)
    cset = calib if isinstance(calib, CalibSet) else load_calibration(
        calib, loaded.inputs, preprocess=opts.preprocess, overrides=opts.preprocess_overrides,
        consts=opts.const, limit=opts.limit,
    )
    eval_set = cset
    if opts.eval is not None:
        eval_set = load_calibration(
            opts.eval, loaded.inputs, preprocess=opts.preprocess, overrides=opts.preprocess_overrides,
            consts=opts.const, limit=opts.limit,
        )
    warnings: list[str] = list(cset.warnings) + ([] if eval_set is cset else list(eval_set.warnings))
    dims, fixed_batch = _input_dims(loaded, cset, opts.input_shape, opts.const)
    dims, fixed_batch = _apply_dim_settings(loaded, dims, fixed_batch, opts.input_dims)
    batch_size = fixed_batch if fixed_batch else opts.batch_size
    if fixed_batch and fixed_batch != 1:
        warnings.append(f"model batch is fixed at {fixed_batch}: samples are grouped by {fixed_batch}")
    compat, profile_name = None, None
    if opts.profile is not None:
        compat, profile_name, opts = _apply_profile(loaded, opts, dims)
    opts = replace(opts, activations=opts.activations or "uint8")
    prepared = prepare_for_analysis(loaded, dims)
    runner = runner or Runner(threads=opts.threads, opt_level="basic")
    times["load"] = time.perf_counter() - started

    t0 = time.perf_counter()
    probe = _probe(loaded, prepared, cset, batch_size, runner)
    warnings.extend(probe.warnings)
    order = {n.name: i for i, n in enumerate(loaded.proto.graph.node)}
    sites = find_sites(
        prepared.proto,
        float_tensors=probe.float_tensors,
        original_order=order,
        bn_folded_into=prepared.bn_folded_into,
        fused_activations=opts.fused_activations,
        cpu_nodes=opts.cpu_nodes,
    )
    if not sites:
        raise UsageError(f"found no quantization site in {loaded.path.name}: nothing computes float tensors")
    producers = {o: n for n in prepared.proto.graph.node for o in n.output}
    site_outputs = {s.output for s in sites}
    quantized = list(dict.fromkeys([t for s in sites for t in (*s.inputs, s.output)]))
    origins = {t: _origin(t, producers, site_outputs) for t in quantized}
    times["probe"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    calib_stats = _calibrate(prepared, sites, origins, cset, batch_size, runner, opts, progress, probe)
    times["calibration"] = time.perf_counter() - t0
    plan, plan_warnings = _make_plan(prepared.proto, sites, origins, calib_stats.observers, opts.activations or "uint8")
    warnings.extend(plan_warnings)
    warnings.extend(calib_stats.warnings)
    qdq = qgraph.build_qdq_model(prepared.proto, sites, plan)
    return ScanContext(
        loaded, prepared, cset, eval_set, opts, runner, batch_size, probe, sites, origins, calib_stats,
        plan, qdq, order, warnings, times, compat, profile_name,
    )


def _apply_profile(
    loaded: LoadedModel, opts: ScanOptions, dims: Mapping[str, tuple[Dim, ...]]
) -> tuple[Any, str, ScanOptions]:
    """Let a chip profile decide the scheme, the fusions and which nodes stay float (CPU fallback)."""
    from quantscan.compat import check, load_profile

    assert opts.profile is not None
    profile = load_profile(opts.profile)
    shapes = {k: [d if isinstance(d, int) else 1 for d in v] for k, v in dims.items()}
    compat = check(loaded.proto, [opts.profile], input_shapes=shapes)
    placement = compat.node_placement.get(profile.name, {})
    cpu = frozenset(n for n, where in placement.items() if where == "cpu")
    scheme = opts.activations or ("int8" if profile.activations == "int8" else "uint8")
    fused = frozenset(profile.fused_activations)
    return compat, profile.name, replace(opts, activations=scheme, fused_activations=fused, cpu_nodes=cpu)


def scan(
    model: str | Path | LoadedModel,
    calib: str | Path | CalibSet,
    *,
    out: str | Path | None = None,
    progress: ProgressFactory = no_progress,
    runner: Runner | None = None,
    **options: Any,
) -> ScanResult:
    """Measure every quantization site of `model` on `calib`; write the contract's files if `out`."""
    started = time.perf_counter()
    if out is not None:
        from quantscan.report import ensure_out_dir

        ensure_out_dir(Path(out))
    ctx = prepare_scan(model, calib, progress=progress, runner=runner, **options)
    loaded, prepared, cset, eval_set, opts = ctx.loaded, ctx.prepared, ctx.cset, ctx.eval_set, ctx.opts
    runner, batch_size, probe, sites, plan, qdq = ctx.runner, ctx.batch_size, ctx.probe, ctx.sites, ctx.plan, ctx.qdq
    calib_stats, order, warnings, times = ctx.calib_stats, ctx.order, ctx.warnings, ctx.times

    t0 = time.perf_counter()
    compare = [t for t in probe.tensor_order if t in probe.float_tensors]
    if opts.tensors == "sites":
        points = set(plan.activations) | {s.output for s in sites} | set(probe.outputs)
        compare = [t for t in compare if t in points]
    evaluation = _evaluate(
        prepared, qdq, sites, plan, compare, eval_set, batch_size, runner, progress, probe, opts
    )
    times["evaluation"] = time.perf_counter() - t0
    warnings.extend(evaluation.warnings)

    t0 = time.perf_counter()
    tables = _tables(loaded, prepared, sites, plan, calib_stats, evaluation, order, probe)
    if ctx.compat is not None and ctx.profile is not None:
        tables["layers"] = with_profile(tables["layers"], ctx, evaluation)
    times["tables"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    headline = _headline(evaluation, opts)
    run_info = _run_info(loaded, prepared, cset, eval_set, opts, runner, batch_size, sites, qdq, headline, probe)
    run_info["times_s"] = {k: round(v, 4) for k, v in times.items()}
    run_info["output_metrics"] = evaluation.output_metrics
    run_info["deployed_metrics"] = evaluation.deployed_metrics
    result = ScanResult(
        layers=tables["layers"],
        tensors=tables["tensors"],
        ops=tables["ops"],
        channels=tables["channels"],
        hist=evaluation.hist,
        output_metrics=evaluation.output_metrics,
        headline=headline,
        run_info=run_info,
        warnings=list(dict.fromkeys(warnings)),
        sites=sites,
        qdq_model=qdq,
        model=loaded,
        compat=ctx.compat,
        profile=ctx.profile,
    )
    if opts.save_qdq:
        from quantscan.report import save_model

        save_model(deployable_qdq(qdq, loaded), Path(opts.save_qdq), protect=[loaded.path])
    if out is not None:
        from quantscan.report import write_scan

        t0 = time.perf_counter()
        write_scan(result, Path(out))
        run_info["times_s"]["writing"] = round(time.perf_counter() - t0, 4)
    run_info["times_s"]["total"] = round(time.perf_counter() - started, 4)
    if out is not None:
        from quantscan.report import write_run_json

        write_run_json(result, Path(out))
        if not opts.no_report:
            from quantscan.report_html import write_report

            t0 = time.perf_counter()
            write_report(Path(out))
            run_info["times_s"]["report"] = round(time.perf_counter() - t0, 4)
    return result


def deployable_qdq(qdq: onnx.ModelProto, loaded: LoadedModel) -> onnx.ModelProto:
    """The QDQ model as the user gets it: the original's input and output declarations restored.

    The analysis copy fixes free dims from the data and drops declared output shapes; a saved model
    should accept what the original accepts and pass onnx.checker.
    """
    import copy

    out = copy.deepcopy(qdq)
    originals = {vi.name: vi for vi in loaded.proto.graph.input}
    for vi in out.graph.input:
        if vi.name in originals:
            vi.CopyFrom(originals[vi.name])
    del out.graph.output[:]
    out.graph.output.extend(copy.deepcopy(list(loaded.proto.graph.output)))
    return out


# --- pass 0: probe -------------------------------------------------------------------------------------


@dataclass
class Probe:
    float_tensors: set[str]
    tensor_order: list[str]
    shapes: dict[str, tuple[int, ...]]
    input_shapes: dict[str, tuple[int, ...]]
    outputs: list[str]
    preparation_check: dict[str, float]
    warnings: list[str]


def _probe(loaded: LoadedModel, prepared: PreparedModel, cset: CalibSet, batch_size: int, runner: Runner) -> Probe:
    """Run the prepared model once with every tensor exposed; compare its outputs with the original."""
    names = [o for n in prepared.proto.graph.node for o in n.output if o]
    exposed = qgraph.expose(prepared.proto, names)
    session = runner.session(exposed)
    feeds = next(iter(cset.batches(batch_size)))
    values = session.run(feeds)
    floats = {k for k, v in {**feeds, **values}.items() if np.issubdtype(v.dtype, np.floating)}
    original = runner.session(loaded.proto).run(feeds)
    check: dict[str, float] = {}
    warnings: list[str] = []
    for name, ref in original.items():
        if name not in values or not np.issubdtype(ref.dtype, np.floating):
            continue
        acc = qm.ErrorAccumulator()
        acc.update(ref, values[name])
        check[name] = acc.max_abs
        scale = float(np.nanmax(np.abs(ref))) if ref.size and np.isfinite(ref).any() else 1.0
        if acc.max_abs > 1e-3 * max(scale, 1e-6):
            warnings.append(
                f"prepared model differs from the original on output '{name}' (max abs {acc.max_abs:.3g}); "
                "BN folding or the opset upgrade changed its numbers"
            )
    return Probe(
        float_tensors=floats,
        tensor_order=names,
        shapes={k: tuple(v.shape) for k, v in values.items()},
        input_shapes={k: tuple(v.shape) for k, v in feeds.items()},
        outputs=[o.name for o in prepared.proto.graph.output],
        preparation_check=check,
        warnings=warnings,
    )


# --- pass 1: calibration ---------------------------------------------------------------------------------


@dataclass
class CalibStats:
    observers: dict[str, quant.Observer]
    channel_ranges: dict[str, quant.ChannelRangeObserver]
    warnings: list[str]


def _channel_axis(site: Site, shape: tuple[int, ...]) -> int | None:
    if len(shape) < 2:
        return None
    return qm.channel_axis(len(shape), site.conv_like)


def _rank_of(probe: Probe, tensor: str) -> int:
    shape = probe.shapes.get(tensor, probe.input_shapes.get(tensor, ()))
    return len(shape)


def _calibrate(
    prepared: PreparedModel,
    sites: Sequence[Site],
    origins: Mapping[str, str],
    cset: CalibSet,
    batch_size: int,
    runner: Runner,
    opts: ScanOptions,
    progress: ProgressFactory,
    probe: Probe,
) -> CalibStats:
    """Stream the calibration set once; ranges come from reductions inside the graph for minmax.

    Every tensor that needs a range or per-channel ranges is reduced over its trailing axes
    (onnxruntime's fast path) to [samples, channels] partial min/max; numpy folds them into the
    tensor's range and, for channel axis 1, the per-channel ranges. Histogram methods (percentile,
    entropy, mse) need the values themselves, so those tensors are exposed whole.
    """
    symmetric = opts.activations == "int8"
    targets = sorted(set(origins.values()))
    observers = {t: quant.make_observer(opts.calib_method, symmetric=symmetric) for t in targets}
    reducer = qgraph.Reducer(prepared.opset_to)
    partials: dict[str, tuple[str, str]] = {}
    whole: list[str] = []
    channel_axis_of: dict[str, int] = {}
    explicit: dict[str, tuple[str, str]] = {}
    for site in sites:
        shape = probe.shapes.get(site.output, ())
        axis = _channel_axis(site, shape)
        if axis is not None:
            channel_axis_of[site.output] = axis
    for t in sorted(set(targets) | set(channel_axis_of)):
        rank = _rank_of(probe, t)
        if t in channel_axis_of and not (channel_axis_of[t] == 1 and rank >= 3):
            explicit[t] = reducer.channel_min_max(t, rank, channel_axis_of[t])
        if (t in targets and opts.calib_method == "minmax") or (t in channel_axis_of and t not in explicit):
            partials[t] = reducer.partial_min_max(t, rank)
        if t in targets and opts.calib_method != "minmax" and t not in probe.input_shapes:
            whole.append(t)
    channel_ranges = {t: quant.ChannelRangeObserver(1) for t in channel_axis_of}  # fed [mins; maxs] rows
    outputs = [*whole, *(n for pair in [*partials.values(), *explicit.values()] for n in pair)]
    session = runner.session(reducer.attach(prepared.proto, outputs))
    bar = progress("calibrating", _n_batches(cset.n_samples, batch_size))
    try:
        for feeds in cset.batches(batch_size):
            values = session.run(feeds)
            for t, obs in observers.items():
                if opts.calib_method == "minmax":
                    lo, hi = values[partials[t][0]], values[partials[t][1]]
                    obs.update(np.array([np.min(lo), np.max(hi)], dtype=np.float32))
                else:
                    obs.update(values[t] if t in values else feeds[t])
            for t, ch in channel_ranges.items():
                if t in explicit:
                    lo, hi = values[explicit[t][0]], values[explicit[t][1]]
                else:  # partials [N, C]: fold the samples away
                    lo, hi = values[partials[t][0]].min(axis=0), values[partials[t][1]].max(axis=0)
                ch.update(np.stack([np.ravel(lo), np.ravel(hi)]))
            bar.update(1)
    finally:
        bar.close()
    warnings = []
    for name, obs in observers.items():
        if obs.nonfinite:
            warnings.append(f"tensor '{name}': NaN/Inf seen in activations during calibration (left out of its range)")
    return CalibStats(observers, channel_ranges, warnings)


# --- quantization plan ---------------------------------------------------------------------------------


def _make_plan(
    model: onnx.ModelProto,
    sites: Sequence[Site],
    origins: Mapping[str, str],
    observers: Mapping[str, quant.Observer],
    scheme: str,
) -> tuple[qgraph.QuantPlan, list[str]]:
    plan = qgraph.QuantPlan()
    warnings: list[str] = []
    for tensor, origin in origins.items():
        rmin, rmax = observers[origin].range()
        if not (math.isfinite(rmin) and math.isfinite(rmax)):
            rmin, rmax = 0.0, 0.0
        if rmin == rmax == 0.0:
            warnings.append(f"tensor '{tensor}' is zero on every calibration sample (zero range): scale 1 used")
        plan.activations[tensor] = quant.activation_qparams(rmin, rmax, scheme)
    inits = {t.name: t for t in model.graph.initializer}
    for site in sites:
        for name, axis in [(site.weight, site.weight_axis), *site.extra_weights]:
            if not name or axis is None or name in plan.weights:
                continue
            w = onnx.numpy_helper.to_array(inits[name]).astype(np.float32)
            if w.ndim <= axis:
                continue
            qp = quant.weight_qparams(w, axis)
            plan.weights[name] = qgraph.WeightQuant(name, qp, quant.quantize(w, qp))
        if site.bias and site.weight in plan.weights and site.inputs and site.inputs[0] in plan.activations:
            b = onnx.numpy_helper.to_array(inits[site.bias]).astype(np.float32)
            w_scale = plan.weights[site.weight].qparams.scale
            if w_scale.size != b.size:  # grouped ConvTranspose: per-group channel scales repeat
                w_scale = np.resize(w_scale, b.shape)
            s_in = float(plan.activations[site.inputs[0]].scale)
            values, scale, overflowed = quant.quantize_bias(b, s_in, w_scale)
            if overflowed:
                warnings.append(f"site '{site.node}': bias overflows int32 at scale s_in*s_w and was clamped")
            plan.biases[site.bias] = qgraph.BiasQuant(site.bias, values, scale)
    return plan, warnings


# --- pass 2: evaluation ----------------------------------------------------------------------------------


@dataclass
class Evaluation:
    cumulative: dict[str, qm.ErrorAccumulator]
    isolated: dict[int, qm.ErrorAccumulator]
    act_channel: dict[int, qm.ChannelErrorAccumulator]
    hist: dict[str, np.ndarray]
    output_metrics: dict[str, dict[str, float]]
    deployed_metrics: dict[str, dict[str, float]]
    headline_outputs: list[str]
    warnings: list[str]
    n_samples: int


def _headline_outputs(probe: Probe, requested: Sequence[str]) -> list[str]:
    if requested:
        missing = [o for o in requested if o not in probe.outputs]
        if missing:
            raise UsageError(f"--output: expected one of {', '.join(probe.outputs)}, found {', '.join(missing)}")
        return list(requested)
    chosen = [
        o for o in probe.outputs
        if o in probe.float_tensors and not _is_state_output(o, probe.shapes.get(o, ()), probe.input_shapes)
    ]
    return chosen or [o for o in probe.outputs if o in probe.float_tensors]


def classifier_outputs(prepared: PreparedModel, outputs: Sequence[str], probe: Probe) -> set[str]:
    """Outputs a Softmax (possibly through Identity/Reshape) produces, with a class axis of ≥ 2."""
    producers = {o: n for n in prepared.proto.graph.node for o in n.output}
    found = set()
    for name in outputs:
        node = producers.get(name)
        while node is not None and node.op_type in ("Identity", "Reshape", "Flatten", "Squeeze"):
            node = producers.get(node.input[0])
        if node is not None and node.op_type in ("Softmax", "LogSoftmax") and qm.looks_like_classifier(
            probe.shapes.get(name, ())
        ):
            found.add(name)
    return found


def _evaluate(
    prepared: PreparedModel,
    qdq: onnx.ModelProto,
    sites: Sequence[Site],
    plan: qgraph.QuantPlan,
    compare: Sequence[str],
    eval_set: CalibSet,
    batch_size: int,
    runner: Runner,
    progress: ProgressFactory,
    probe: Probe,
    opts: ScanOptions,
) -> Evaluation:
    """One pass: cumulative and isolated sums and per-channel sums come out of one session per batch."""
    isolated_ids = [k for k, s in enumerate(sites) if s.output in plan.activations]
    combined = qgraph.build_analysis_model(prepared.proto, qdq, sites, plan, isolated=isolated_ids)
    reducer = qgraph.Reducer(prepared.opset_to)
    rank = {t: len(probe.shapes.get(t, ())) for t in compare}
    measurable = [t for t in compare if all(d > 0 for d in probe.shapes.get(t, (1,)))]
    pairs = {t: reducer.pair(t, t + qgraph.CUMULATIVE_SUFFIX, rank[t]) for t in measurable}
    iso_pairs = {
        k: reducer.pair(sites[k].output, qgraph.iso_name(sites[k].output, k), rank.get(sites[k].output, 0))
        for k in isolated_ids
        if sites[k].output in pairs
    }
    channel_pairs: dict[int, tuple[str, str]] = {}
    hist_codes: dict[int, tuple[str, str]] = {}
    for k, site in enumerate(sites):
        qp = plan.activations.get(site.output)
        shape = probe.shapes.get(site.output, ())
        axis = _channel_axis(site, shape)
        if qp is not None and axis is not None and site.output in pairs:
            codes, fq = reducer.quantize(site.output, qp, f"{site.output}@chq")
            channel_pairs[k] = reducer.channel_sums(site.output, fq, len(shape), axis)
            hist_codes[k] = (codes, f"{site.output}__act__q{qgraph.CUMULATIVE_SUFFIX}")
    headline = _headline_outputs(probe, opts.output)
    classifiers = classifier_outputs(prepared, headline, probe)
    outputs = [n for p in [*pairs.values(), *iso_pairs.values()] for n in p.names()]
    outputs += [n for pair in channel_pairs.values() for n in pair]
    outputs += [n for o in headline for n in (o, o + qgraph.CUMULATIVE_SUFFIX)]
    hist_outputs = [n for pair in hist_codes.values() for n in pair]
    session = runner.session(reducer.attach(combined, outputs + hist_outputs))
    deployed = runner.session(qdq, opt_level="all")
    hist_counts = {k: [np.zeros(256, np.int64), np.zeros(256, np.int64)] for k in hist_codes}
    cumulative = {t: qm.ErrorAccumulator() for t in pairs}
    isolated = {k: qm.ErrorAccumulator() for k in iso_pairs}
    act_channel = {k: qm.ChannelErrorAccumulator(1) for k in channel_pairs}
    top1 = {o: qm.Top1Accumulator() for o in classifiers}
    deployed_acc = {o: qm.ErrorAccumulator() for o in headline}
    deployed_top1 = {o: qm.Top1Accumulator() for o in classifiers}
    labels = eval_set.labels
    seen = 0
    bar = progress("measuring", _n_batches(eval_set.n_samples, batch_size))
    try:
        for feeds in eval_set.batches(batch_size):
            want_hist = seen < HIST_SAMPLES
            values = session.run(feeds, outputs + hist_outputs if want_hist else outputs)
            n = next(iter(feeds.values())).shape[0] if feeds else 1
            batch_labels = labels[seen: seen + n] if labels else None
            seen += n
            if want_hist:
                _count_codes(hist_codes, hist_counts, values)
            for t, acc in cumulative.items():
                acc.update_sums(*pairs[t].fold(values))
            for k, acc in isolated.items():
                acc.update_sums(*iso_pairs[k].fold(values))
            for k, ch in act_channel.items():
                ch.update_sums(values[channel_pairs[k][0]], values[channel_pairs[k][1]])
            for o, t1 in top1.items():
                t1.update(values[o], values[o + qgraph.CUMULATIVE_SUFFIX], batch_labels)
            dep = deployed.run(feeds, headline)
            for o, acc in deployed_acc.items():
                acc.update(values[o], dep[o])
            for o, t1 in deployed_top1.items():
                t1.update(values[o], dep[o], batch_labels)
            bar.update(1)
    finally:
        bar.close()
    warnings = [
        f"tensor '{name}': NaN/Inf in activations (samples left out: FP32 side {acc.nonfinite_ref}, "
        f"int8 side {acc.nonfinite_test} elements)"
        for name, acc in cumulative.items()
        if acc.nonfinite_ref or acc.nonfinite_test
    ]
    output_metrics: dict[str, dict[str, float]] = {}
    deployed_metrics: dict[str, dict[str, float]] = {}
    for o in headline:
        if o in cumulative:
            output_metrics[o] = output_row(cumulative[o], top1.get(o))
        deployed_metrics[o] = output_row(deployed_acc[o], deployed_top1.get(o))
    hist = _histograms(sites, plan, hist_counts)
    return Evaluation(
        cumulative, isolated, act_channel, hist, output_metrics, deployed_metrics, headline, warnings, seen
    )


def _count_codes(
    names: Mapping[int, tuple[str, str]], counts: Mapping[int, list[np.ndarray]], values: Mapping[str, np.ndarray]
) -> None:
    """Histogram of the integer codes: FP32 values under the site's scale vs the cumulative int8 codes."""
    for k, (fp32_codes, int8_codes) in names.items():
        for slot, name in enumerate((fp32_codes, int8_codes)):
            codes = np.asarray(values[name]).reshape(-1)
            offset = 128 if codes.dtype == np.int8 else 0
            counts[k][slot] += np.bincount(codes.astype(np.int64) + offset, minlength=256)[:256]


def _histograms(
    sites: Sequence[Site], plan: qgraph.QuantPlan, counts: Mapping[int, list[np.ndarray]]
) -> dict[str, np.ndarray]:
    """hist.npz content: per site, 64 bins over the quantized range (4 codes per bin)."""
    hist: dict[str, np.ndarray] = {"site_nodes": np.array([s.node for s in sites])}
    for k, (fp32, int8) in counts.items():
        qp = plan.activations[sites[k].output]
        lo_code = -128 if qp.zero_point.dtype == np.int8 else 0
        edges_codes = lo_code + np.arange(0, 257, 4) - 0.5
        hist[f"{k}/edges"] = ((edges_codes - float(qp.zero_point)) * float(qp.scale)).astype(np.float64)
        hist[f"{k}/fp32"] = fp32.reshape(64, 4).sum(axis=1)
        hist[f"{k}/int8"] = int8.reshape(64, 4).sum(axis=1)
    return hist


def output_row(acc: qm.ErrorAccumulator, top1: qm.Top1Accumulator | None) -> dict[str, float]:
    """One output's headline metrics (and top-1 agreement / accuracy for classifiers)."""
    row = {
        "cosine": acc.cosine,
        "sqnr_db": acc.sqnr_db,
        "mse": acc.mse,
        "max_abs": acc.max_abs,
        "rel_l2": acc.rel_l2,
        "worst_sample_cosine": acc.worst_sample_cosine,
        "mean_sample_cosine": acc.mean_sample_cosine,
    }
    if top1 is not None:
        row["top1_agreement"] = top1.agreement
        if top1.accuracy is not None:
            row["accuracy"] = top1.accuracy
            if top1.ref_accuracy is not None:
                row["fp32_accuracy"] = top1.ref_accuracy
    return row


def _headline(evaluation: Evaluation, opts: ScanOptions) -> dict[str, Any]:
    """The worst headline output counts (contract), for the fake-quant and the deployed model."""
    worst = min(evaluation.output_metrics, key=lambda o: _nan_last(evaluation.output_metrics[o]["cosine"]))
    out: dict[str, Any] = {"output": worst, **evaluation.output_metrics[worst]}
    out["deployed"] = evaluation.deployed_metrics.get(worst, {})
    out["outputs"] = list(evaluation.output_metrics)
    return out


def _nan_last(value: float) -> float:
    return math.inf if math.isnan(value) else value


# --- tables --------------------------------------------------------------------------------------------


def _weight_stats(prepared: PreparedModel, site: Site, plan: qgraph.QuantPlan) -> dict[str, float]:
    if not site.weight or site.weight not in plan.weights:
        return {"weight_sqnr_db": math.nan, "weight_worst_channel_sqnr_db": math.nan,
                "weight_channel_range_spread": math.nan}
    w_init = next(t for t in prepared.proto.graph.initializer if t.name == site.weight)
    w = onnx.numpy_helper.to_array(w_init).astype(np.float32)
    wq = plan.weights[site.weight]
    fq = quant.dequantize(wq.values, wq.qparams)
    axis = wq.qparams.axis if wq.qparams.axis is not None else 0
    acc = qm.ErrorAccumulator()
    acc.update(w[None], fq[None])
    ch = qm.ChannelErrorAccumulator(axis)
    ch.update(w, fq)
    others = tuple(i for i in range(w.ndim) if i != axis)
    absmax = np.abs(w).max(axis=others)
    nonzero = absmax[absmax > 0].astype(np.float64)
    spread = float(nonzero.max() / nonzero.min()) if nonzero.size >= 2 else 1.0
    return {"weight_sqnr_db": acc.sqnr_db, "weight_worst_channel_sqnr_db": ch.worst_channel_sqnr_db,
            "weight_channel_range_spread": spread}


def _tables(
    loaded: LoadedModel,
    prepared: PreparedModel,
    sites: Sequence[Site],
    plan: qgraph.QuantPlan,
    calib_stats: CalibStats,
    ev: Evaluation,
    order: Mapping[str, int],
    probe: Probe,
) -> dict[str, pd.DataFrame]:
    original_tensors = {o for n in loaded.proto.graph.node for o in n.output} | set(loaded.outputs)
    producers = {o: n for n in prepared.proto.graph.node for o in n.output}
    rows = []
    channel_rows = []
    for k, site in enumerate(sites):
        cum = ev.cumulative.get(site.output)
        iso = ev.isolated.get(k)
        ch_range = calib_stats.channel_ranges.get(site.output)
        row: dict[str, Any] = {
            "node": site.node,
            "op_type": site.op_type,
            "kernel": site.kernel,
            "order": order.get(site.node, -1),
            "output": site.output,
            "inputs": ";".join(site.inputs),
            "isolated_cosine": iso.cosine if iso else math.nan,
            "isolated_sqnr_db": iso.sqnr_db if iso else math.nan,
            "isolated_max_abs": iso.max_abs if iso else math.nan,
            "cumulative_cosine": cum.cosine if cum else math.nan,
            "cumulative_sqnr_db": cum.sqnr_db if cum else math.nan,
            "cumulative_mse": cum.mse if cum else math.nan,
            "cumulative_max_abs": cum.max_abs if cum else math.nan,
            "cumulative_worst_sample_cosine": cum.worst_sample_cosine if cum else math.nan,
            "cumulative_input_sqnr_db": _input_sqnr(site, ev, producers),
        }
        act = ev.act_channel.get(k)
        row["act_worst_channel_sqnr_db"] = act.worst_channel_sqnr_db if act else math.nan
        row["act_channel_range_spread"] = ch_range.spread() if ch_range else math.nan
        row["act_dead_channels"] = ch_range.dead() if ch_range else 0
        row.update(_weight_stats(prepared, site, plan))
        row["sensitive_op"] = site.sensitive
        qp = plan.activations.get(site.output)
        row["act_scale"] = float(qp.scale) if qp is not None else math.nan
        row["act_zero_point"] = int(qp.zero_point) if qp is not None else 0
        rows.append(row)
        if ch_range is not None:
            lo, hi = ch_range.ranges()
            ranges = ch_range.widths()
            sq = act.per_channel_sqnr_db() if act else np.full(len(ranges), math.nan)
            for c in range(len(ranges)):
                channel_rows.append({"node": site.node, "output": site.output, "channel": c,
                                     "act_min": lo[c], "act_max": hi[c], "act_range": ranges[c],
                                     "act_sqnr_db": sq[c] if c < len(sq) else math.nan})
        wq = plan.weights.get(site.weight or "")
        if wq is not None:
            scale = np.atleast_1d(wq.qparams.scale)
            for c, s in enumerate(scale):
                channel_rows.append({"node": site.node, "output": site.output, "channel": c,
                                     "weight_absmax": float(s) * 127.0})
    layers = pd.DataFrame(rows)
    layers = _rank(layers)
    tensors = _tensor_table(prepared, ev, original_tensors, probe, producers)
    ops = _ops_table(layers)
    channels = pd.DataFrame(channel_rows)
    if not channels.empty:
        channels = channels.groupby(["node", "output", "channel"], as_index=False, sort=False).first()
    return {"layers": layers, "tensors": tensors, "ops": ops, "channels": channels}


SEVERITY_ORDER = {"error": 0, "warn": 1, "info": 2}

RANK_DOC_PROFILE = (
    "With a chip profile, `rank` weighs conversion, fallback cost and precision together, in tiers: "
    "(1) kernels with an `error` finding (the converter rejects them: nothing else matters until they are "
    "fixed); (2) sites whose error is intrinsic, and CPU-placed nodes in an island of at most two nodes "
    "(each such island costs two NPU/CPU crossings per inference); (3) everything else. Within a tier, "
    "ascending `isolated_sqnr_db`, then ascending `cumulative_sqnr_db`. CPU-placed nodes stay float in the "
    "simulation, quantized only at the island boundaries, and have no isolated figure."
)


def _worst_findings(ctx: ScanContext) -> dict[str, dict[str, Any]]:
    """node -> its most severe finding for the scan's profile."""
    findings = ctx.compat.findings
    rows = findings[findings["profile"] == ctx.profile] if not findings.empty else findings
    worst: dict[str, dict[str, Any]] = {}
    for r in rows.to_dict("records"):
        node = r.get("node") or ""
        if not node:
            continue
        if node not in worst or SEVERITY_ORDER.get(r["severity"], 3) < SEVERITY_ORDER.get(worst[node]["severity"], 3):
            worst[node] = r
    return worst


def _island_sizes(ctx: ScanContext) -> dict[str, int]:
    parts = ctx.compat.partitions
    sizes: dict[str, int] = {}
    if parts.empty:
        return sizes
    for r in parts[parts["profile"] == ctx.profile].to_dict("records"):
        for node in str(r.get("nodes") or "").split(";"):
            if node:
                sizes[node] = int(r["n_nodes"])
    return sizes


def with_profile(layers: pd.DataFrame, ctx: ScanContext, ev: Evaluation) -> pd.DataFrame:
    """Add placement/compat_rule/compat_fix, rows for CPU-placed nodes, and the tiered rank."""
    worst = _worst_findings(ctx)
    site_nodes = {s.node: s.nodes for s in ctx.sites}
    rules, fixes, severities = [], [], []
    for node in layers["node"]:
        found = [worst[n] for n in site_nodes.get(node, [node]) if n in worst]
        found.sort(key=lambda r: SEVERITY_ORDER.get(r["severity"], 3))
        rules.append(found[0]["rule"] if found else "")
        fixes.append(found[0]["fix"] if found else "")
        severities.append(found[0]["severity"] if found else "")
    layers = layers.assign(placement="npu", compat_rule=rules, compat_fix=fixes, compat_severity=severities)
    prepared_nodes = {n.name: n for n in ctx.prepared.proto.graph.node}
    sizes = _island_sizes(ctx)
    cpu_rows = []
    for name in sorted(ctx.opts.cpu_nodes, key=lambda n: ctx.order.get(n, -1)):
        node = prepared_nodes.get(name)
        if node is None or not node.output or node.output[0] not in ctx.probe.float_tensors:
            continue
        finding = worst.get(name, {})
        cum = ev.cumulative.get(node.output[0])
        cpu_rows.append({
            "node": name, "op_type": node.op_type, "kernel": node.op_type, "order": ctx.order.get(name, -1),
            "output": node.output[0], "placement": "cpu",
            "cumulative_cosine": cum.cosine if cum else math.nan,
            "cumulative_sqnr_db": cum.sqnr_db if cum else math.nan,
            "cumulative_mse": cum.mse if cum else math.nan,
            "cumulative_max_abs": cum.max_abs if cum else math.nan,
            "cumulative_worst_sample_cosine": cum.worst_sample_cosine if cum else math.nan,
            "sensitive_op": False, "cause": "cpu-fallback",
            "reason": f"runs on the CPU in float ({finding.get('rule', 'profile')}); "
                      f"island of {sizes.get(name, 1)} node(s)",
            "compat_rule": finding.get("rule", ""), "compat_fix": finding.get("fix", ""),
            "compat_severity": finding.get("severity", ""),
        })
    if cpu_rows:
        layers = pd.concat([layers, pd.DataFrame(cpu_rows)], ignore_index=True)
    tier = []
    for r in layers.to_dict("records"):
        if r.get("compat_severity") == "error":
            tier.append(0)
        elif r["cause"] == "intrinsic" or (r["placement"] == "cpu" and sizes.get(r["node"], 1) <= 2):
            tier.append(1)
        else:
            tier.append(2)
    key = layers.assign(_tier=tier)[["_tier", "isolated_sqnr_db", "cumulative_sqnr_db"]]
    key = key.replace([np.inf], 1e9).fillna(1e12)
    ordered = key.sort_values(["_tier", "isolated_sqnr_db", "cumulative_sqnr_db"], kind="mergesort").index
    layers = layers.copy()
    layers.loc[ordered, "rank"] = np.arange(1, len(layers) + 1)
    layers["rank"] = layers["rank"].astype(int)
    return layers.sort_values("rank").reset_index(drop=True)


def _input_sqnr(site: Site, ev: Evaluation, producers: Mapping[str, onnx.NodeProto]) -> float:
    """Worst cumulative SQNR among the site's inputs: the error it inherits."""
    values = [ev.cumulative[i].sqnr_db for i in site.inputs if i in ev.cumulative]
    return min(values) if values else math.inf


def classify(row: Mapping[str, Any]) -> tuple[str, str]:
    """(cause, reason): is the site's error its own, inherited, or small? One line, for summary.md."""
    iso = row["isolated_sqnr_db"]
    worst_ch = row["act_worst_channel_sqnr_db"]
    spread = row["act_channel_range_spread"]
    wworst = row["weight_worst_channel_sqnr_db"]
    cum = row["cumulative_sqnr_db"]
    inherited = row["cumulative_input_sqnr_db"]
    reasons = []
    if _lt(worst_ch, WORST_CHANNEL_SQNR_DB) and _gt(spread, 10):
        reasons.append(
            f"activation channel ranges span {spread:.0f}x: "
            f"per-tensor int8 leaves {worst_ch:.1f} dB on the worst channel"
        )
    if _lt(wworst, WEIGHT_WORST_CHANNEL_SQNR_DB):
        reasons.append(f"weight worst channel {wworst:.1f} dB (outlier weights within a channel)")
    if _lt(iso, INTRINSIC_SQNR_DB):
        reasons.insert(0, f"isolated SQNR {iso:.1f} dB: this kernel alone loses precision")
    if row.get("sensitive_op"):
        reasons.append("int8-sensitive op")
    if reasons:
        return "intrinsic", "; ".join(reasons)
    if _lt(cum, INTRINSIC_SQNR_DB) and not _lt(iso, INTRINSIC_SQNR_DB):
        return "inherited", (
            f"isolated {iso:.1f} dB is fine; cumulative {cum:.1f} dB comes from upstream (inputs at {inherited:.1f} dB)"
        )
    return "ok", f"isolated {iso:.1f} dB, cumulative {cum:.1f} dB"


def _lt(value: Any, limit: float) -> bool:
    return isinstance(value, (int, float)) and not math.isnan(value) and value < limit


def _gt(value: Any, limit: float) -> bool:
    return isinstance(value, (int, float)) and not math.isnan(value) and value > limit


RANK_DOC = (
    "`rank` orders sites by the error each site makes itself: ascending `isolated_sqnr_db` (this site alone "
    "quantized, fed FP32 inputs), ties broken by ascending `act_worst_channel_sqnr_db`, then by ascending "
    "`cumulative_sqnr_db`; sites without a measured isolated figure come last. Rank 1 is the most harmful. "
    "The isolated figure is used because cumulative SQNR mostly measures what a site inherits from upstream."
)


def _rank(layers: pd.DataFrame) -> pd.DataFrame:
    causes = [classify(r) for r in layers.to_dict("records")]
    layers["cause"] = [c for c, _ in causes]
    layers["reason"] = [r for _, r in causes]
    key = layers[["isolated_sqnr_db", "act_worst_channel_sqnr_db", "cumulative_sqnr_db"]].copy()
    key = key.replace([np.inf], 1e9).fillna(1e12)
    ordered = key.sort_values(
        ["isolated_sqnr_db", "act_worst_channel_sqnr_db", "cumulative_sqnr_db"], kind="mergesort"
    ).index
    layers.loc[ordered, "rank"] = np.arange(1, len(layers) + 1)
    layers["rank"] = layers["rank"].astype(int)
    return layers.sort_values("rank").reset_index(drop=True)


def _tensor_table(
    prepared: PreparedModel,
    ev: Evaluation,
    original_tensors: set[str],
    probe: Probe,
    producers: Mapping[str, onnx.NodeProto],
) -> pd.DataFrame:
    rows = []
    outputs = set(probe.outputs)
    for name, acc in ev.cumulative.items():
        if name not in original_tensors:
            continue
        node = producers.get(name)
        rows.append({
            "tensor": name,
            "producer": node.name if node is not None else "",
            "op_type": node.op_type if node is not None else "",
            "is_output": name in outputs,
            "cumulative_cosine": acc.cosine,
            "cumulative_sqnr_db": acc.sqnr_db,
            "cumulative_mse": acc.mse,
            "cumulative_max_abs": acc.max_abs,
            "cumulative_worst_sample_cosine": acc.worst_sample_cosine,
            "nonfinite_fp32": acc.nonfinite_ref,
            "nonfinite_int8": acc.nonfinite_test,
        })
    return pd.DataFrame(rows)


def _ops_table(layers: pd.DataFrame) -> pd.DataFrame:
    grouped = layers.groupby("op_type")
    ops = grouped.agg(
        sites=("node", "count"),
        min_isolated_sqnr_db=("isolated_sqnr_db", "min"),
        median_isolated_sqnr_db=("isolated_sqnr_db", "median"),
        min_cumulative_cosine=("cumulative_cosine", "min"),
        min_act_worst_channel_sqnr_db=("act_worst_channel_sqnr_db", "min"),
        sensitive=("sensitive_op", "sum"),
        best_rank=("rank", "min"),
    ).reset_index()
    return ops.sort_values("best_rank").reset_index(drop=True)


def _run_info(
    loaded: LoadedModel,
    prepared: PreparedModel,
    cset: CalibSet,
    eval_set: CalibSet,
    opts: ScanOptions,
    runner: Runner,
    batch_size: int,
    sites: Sequence[Site],
    qdq: onnx.ModelProto,
    headline: Mapping[str, Any],
    probe: Probe,
) -> dict[str, Any]:
    import platform

    import onnxruntime

    from quantscan import __version__

    qdq_pairs = sum(1 for n in qdq.graph.node if n.op_type == "QuantizeLinear")
    return {
        "format": 1,
        "tool": "quantscan",
        "versions": {"quantscan": __version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
                     "numpy": np.__version__, "pandas": pd.__version__, "python": platform.python_version()},
        "model": {"path": str(loaded.path), "sha256": loaded.sha256, "opset": loaded.opset,
                  "nodes": len(loaded.proto.graph.node)},
        "input_contract": {k: list(v) for k, v in probe.input_shapes.items()},
        "inputs": [{"name": s.name, "dtype": str(s.dtype), "shape": list(s.shape)} for s in loaded.inputs],
        "calibration": {"path": str(cset.source), "kind": cset.kind, "samples": cset.n_samples},
        "evaluation": {"path": str(eval_set.source), "samples": eval_set.n_samples,
                       "same_as_calibration": eval_set is cset},
        "options": {"calib_method": opts.calib_method, "activations": opts.activations,
                    "weights": "int8 per-channel symmetric", "profile": str(opts.profile) if opts.profile else None,
                    "bias": "int32 at s_in*s_w", "batch_size": batch_size, "limit": opts.limit,
                    "const": dict(opts.const), "input_shape": {k: list(v) for k, v in opts.input_shape.items()},
                    "output": list(opts.output)},
        "opset_used": prepared.opset_to,
        "opset_original": prepared.opset_from,
        "preparation": prepared.changes,
        "preparation_check_max_abs": probe.preparation_check,
        "ort_level": runner.level_name,
        "deployed_ort_level": "ORT_ENABLE_ALL",
        "threads": opts.threads,
        "seed": opts.seed,
        "sites": len(sites),
        "qdq_pairs": qdq_pairs,
        "runner": {"sessions": runner.stats.sessions_created, "runs": runner.stats.runs},
        "headline": dict(headline),
    }
