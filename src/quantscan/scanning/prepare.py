"""The front half of every scan: load, prepare, probe, find the sites, apply a chip profile, calibrate.

Pass 0, the probe, runs the prepared model with every tensor exposed on one batch: true dtypes and
shapes (the declared ones are not trusted) and a numeric check of the preparation (BN folding,
opset upgrade) against the user's model. `prepare_scan` then calibrates (calibrate.py) and returns
a `ScanContext`: what the scan's evaluation and bisection (gain.py) build on.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pandas as pd

from quantscan import graph as qgraph
from quantscan import metrics as qm
from quantscan.calib import CalibSet, load_calibration
from quantscan.calib.recurrent import check_state, state_consts, with_state
from quantscan.columns import Col
from quantscan.errors import CalibrationError, ModelError, SessionError, UsageError
from quantscan.graph.index import GraphIndex
from quantscan.graph.subgraphs import unquantized_warning
from quantscan.machine import default_budget, machine_memory
from quantscan.model import LoadedModel, PreparedModel, ensure_float_model, load_model
from quantscan.records import ActivationScheme
from quantscan.runner import Runner, quantize_static_model, quantize_static_op_types
from quantscan.scanning.analysis_copy import prepare_for_analysis
from quantscan.scanning.budget import (
    Footprint,
    MemoryPlan,
    default_aim,
    plan_memory,
)
from quantscan.scanning.calibrate import CalibStats, calibrate, make_plan
from quantscan.scanning.options import ChipRecipe, ProgressFactory, ScanOptions, no_progress, worker_count
from quantscan.scanning.ort_recipe import (
    RECIPE,
    check_calib_method,
    prepare_unfolded,
    quantize_static_call,
    recipe_sites,
)
from quantscan.scanning.settings import fold_setting_consts, unfed
from quantscan.sites import PASS_THROUGH_OPS, Site, find_sites
from quantscan.specs import Dim, InputSpec


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


def consumer_range_origins(
    model: onnx.ModelProto, sites: Sequence[Site], origins: Mapping[str, str], ops: frozenset[str]
) -> dict[str, str]:
    """`origins` with each site output that feeds only a chain of `ops` (a profile's `[consumer_range]`)
    taking its range from the end of that chain, and everything sharing its scale with it.

    Why: rknn-toolkit2 gives a kernel followed by MaxPool the MaxPool's *output* range (its
    quant_optimizer `adjust_no_change_node`; recorded on the MTCNN nets: /prelu1's int8 min is the pool's
    -2.28, not the -5.41 the PReLU reaches), so the kernel's output clips where the default walk back to
    the producer would not. A site output read anywhere else (or a graph output) keeps its own range: no
    recorded run says which of several readers would win.
    """
    if not ops:
        return dict(origins)
    index = GraphIndex.of(model)
    out = dict(origins)
    for site in sites:
        end = site.output
        while (user := index.single_user(end)) is not None and user.op_type in ops and user.input[0] == end:
            end = user.output[0]
        if end == site.output:
            continue
        shared = [t for t, o in out.items() if o == site.output] + [site.output, end]
        out.update(dict.fromkeys(shared, end))
    return out


def is_state_output(name: str, shape: tuple[int, ...], inputs: Mapping[str, tuple[int, ...]]) -> bool:
    """A recurrent state output (e.g. silero's `stateN` for input `state`) is not a headline output."""
    return any(name != i and name.startswith(i) and tuple(shape) == tuple(s) for i, s in inputs.items())


@dataclass
class Probe:
    float_tensors: set[str]
    tensor_order: list[str]
    shapes: dict[str, tuple[int, ...]]
    input_shapes: dict[str, tuple[int, ...]]
    outputs: list[str]
    preparation_check: dict[str, float]
    warnings: list[str]
    activation_bytes: int = 0
    """Bytes of every float activation the prepared model computes, per sample (the memory plan's unit)."""
    largest_bytes: int = 0
    """Bytes of the largest float activation, per sample."""


def probe_model(loaded: LoadedModel, prepared: PreparedModel, cset: CalibSet, batch_size: int, runner: Runner) -> Probe:
    """Pass 0: run the prepared model once with every tensor exposed; compare its outputs with the original.

    Run at the smallest batch (1, or the model's fixed batch): every activation comes back whole, so
    this pass alone would cost a whole batch of activations twice over before any budget is known.
    """
    names = [o for n in prepared.proto.graph.node for o in n.output if o]
    exposed = qgraph.expose(prepared.proto, names)
    feeds = next(iter(cset.batches(batch_size)))
    original = runner.session(loaded.proto).run(feeds)  # the user's model first: its faults are bad input
    session = runner.session(exposed, built=True)
    values = session.run(feeds)
    floats = {k for k, v in {**feeds, **values}.items() if np.issubdtype(v.dtype, np.floating)}
    samples = _samples_in(feeds)
    sizes = [v.nbytes // samples for k, v in values.items() if k in floats]
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
        activation_bytes=int(sum(sizes)),
        largest_bytes=int(max(sizes, default=0)),
    )


def batch_refused(loaded: LoadedModel, cset: CalibSet, batch_size: int, runner: Runner) -> str:
    """"" when the model runs on the first `batch_size` samples at once, else onnxruntime's message.

    Why: the probe runs one sample, and a model can run on one and not on more: an input pinned to batch 1
    (silero's LSTM state frozen with `--const state=0`: initial_h must be [2, N, 128]). Found here, the
    scan falls back to one sample per run instead of failing in calibration with onnxruntime's error.
    """
    feeds = next(iter(cset.batches(batch_size)))
    if _samples_in(feeds) <= 1:
        return ""
    try:
        runner.session(loaded.proto).run(feeds)
    except SessionError as exc:
        return str(exc).removeprefix("onnxruntime could not run the model: ")
    return ""


def _samples_in(feeds: Mapping[str, np.ndarray]) -> int:
    """Samples in a batch of feeds: the first input's leading dim (rank-0 inputs: one sample)."""
    first = next(iter(feeds.values()), None)
    return max(1, int(first.shape[0])) if first is not None and first.ndim else 1


@dataclass(frozen=True)
class ScanContext:
    """Everything up to the quantization plan: what the evaluation, bisection and output gain build on.

    `sites` and `plan` describe the all-int8 model; `prepared` is the FP32 analysis copy (same
    tensor names as the user's model), `probe` the true dtypes/shapes of every tensor, `cset` /
    `eval_set` the calibration and evaluation samples, `opts` the user's options, `chip` the profile's
    decisions. The QDQ model is built from `prepared`, `sites` and `plan` by whoever needs it. Frozen:
    no field is reassigned (a shard or a sample subset is `dataclasses.replace`); only `warnings`, a list,
    collects what the later passes find.
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
    order: dict[str, int]
    warnings: list[str]
    chip: ChipRecipe
    """What the profile decided (scheme, fusions, float nodes, recipe), beside `opts`, what the user asked."""
    compat: Any = None
    """compat.CheckResult when a profile was given."""
    quantize_static: dict[str, Any] | None = None
    """Recipe onnxruntime: the quantize_static keyword arguments the sites and plan were read from."""
    memory: MemoryPlan | None = None
    """The memory plan: budget, batch chosen from the probe's sizes, estimated peak (run.json `memory`)."""

    def classifier_outputs(self, outputs: Sequence[str]) -> set[str]:
        """Which of `outputs` are classifier outputs (top-1 agreement applies)."""
        return classifier_outputs(self.prepared, outputs, self.probe)

    def headline_outputs(self) -> list[str]:
        """The graph outputs the headline metric uses (contract: `--output`, else non-state float outputs)."""
        return headline_outputs(self.probe, self.opts.output)


def prepare_scan(
    model: str | Path | LoadedModel,
    calib: str | Path | CalibSet,
    *,
    progress: ProgressFactory = no_progress,
    runner: Runner | None = None,
    **options: Any,
) -> ScanContext:
    """Load, validate, prepare, find sites and calibrate: the common front half of scan and bisect."""
    return prepare_timed(model, calib, progress=progress, runner=runner, **options)[0]


def prepare_timed(
    model: str | Path | LoadedModel,
    calib: str | Path | CalibSet,
    *,
    progress: ProgressFactory = no_progress,
    runner: Runner | None = None,
    calibrate_with: Callable[..., CalibStats | None] | None = None,
    **options: Any,
) -> tuple[ScanContext, dict[str, float]]:
    """`prepare_scan`, plus the seconds each phase took (run.json's `times_s`). `calibrate_with` may
    take pass 1 elsewhere (`--workers`: scanning.workers.ShardedCalibration); None from it: here."""
    opts = ScanOptions(**options).validate()
    times: dict[str, float] = {}
    started = time.perf_counter()
    inputs = _load_phase(model, calib, opts, runner)
    times["load"] = time.perf_counter() - started
    started = time.perf_counter()
    placed = _probe_phase(inputs, opts, times)
    times["probe"] = time.perf_counter() - started - times.get("quantize_static", 0.0)
    started = time.perf_counter()
    calib_stats, plan = _calibration_phase(inputs, placed, opts, progress, calibrate_with)
    times["calibration"] = time.perf_counter() - started
    ctx = ScanContext(
        inputs.loaded, inputs.prepared, inputs.cset, inputs.eval_set, opts, inputs.runner, placed.batch_size,
        placed.probe, placed.sites, placed.origins, calib_stats, plan, placed.order, inputs.warnings, inputs.chip,
        inputs.compat, placed.recipe.call if placed.recipe is not None else None, placed.memory,
    )
    return ctx, times


@dataclass
class _Inputs:
    """The load phase's result: the model (settings folded), its analysis copy, the samples, the chip."""

    loaded: LoadedModel
    prepared: PreparedModel
    cset: CalibSet
    eval_set: CalibSet
    fixed_batch: int | None
    chip: ChipRecipe
    compat: Any
    runner: Runner
    warnings: list[str]


def _load_phase(
    model: str | Path | LoadedModel, calib: str | Path | CalibSet, opts: ScanOptions, runner: Runner | None
) -> _Inputs:
    """Load the model and the samples, fix the dims, fold the setting inputs, let the profile decide, and
    prepare the analysis copy."""
    loaded = model if isinstance(model, LoadedModel) else load_model(model)
    ensure_float_model(loaded)
    cset, eval_set = _sample_sets(loaded, calib, opts)
    warnings: list[str] = list(cset.warnings) + ([] if eval_set is cset else list(eval_set.warnings))
    dims, fixed_batch = _input_dims(loaded, cset, opts.input_shape, state_consts(opts.state, opts.const))
    dims, fixed_batch = _apply_dim_settings(loaded, dims, fixed_batch, opts.input_dims)
    if opts.state and fixed_batch is None and any(s.shape and not isinstance(s.shape[0], int) for s in loaded.inputs):
        # a stateful set feeds one sample at a time: the batch is 1 (and shapes can fold, settings.py)
        dims, fixed_batch = _apply_dim_settings(loaded, dims, fixed_batch, ["batch=1"])
    settings = fold_setting_consts(loaded, opts.const, dims, opts.state.values())  # freeze-input's graph
    loaded, dims = settings.loaded, settings.dims
    cset, eval_set = unfed(cset, eval_set, settings.frozen)
    warnings.extend(w for w in [settings.warning] if w)
    if fixed_batch and fixed_batch != 1:
        warnings.append(f"model batch is fixed at {fixed_batch}: samples are grouped by {fixed_batch}")
    compat, chip = chip_recipe(loaded, opts, dims)
    if chip.recipe == RECIPE:
        check_calib_method(opts.calib_method)
    prepared = prepare_unfolded(loaded, dims) if chip.recipe == RECIPE else prepare_for_analysis(loaded, dims)
    runner = runner or Runner(threads=opts.threads, opt_level="basic")
    if opts.state:
        cset, eval_set = _stateful_sets(loaded, cset, eval_set, opts.state, runner)
    return _Inputs(loaded, prepared, cset, eval_set, fixed_batch, chip, compat, runner, warnings)


@dataclass
class _Placed:
    """The probe phase's result: true shapes, the sites and their range origins, the batch and memory plan."""

    probe: Probe
    order: dict[str, int]
    sites: list[Site]
    origins: dict[str, str]
    recipe: Any
    """scanning.ort_recipe's result under the onnxruntime recipe (sites, origins, plan, call), else None."""
    memory: MemoryPlan
    batch_size: int


def _probe_phase(inputs: _Inputs, opts: ScanOptions, times: dict[str, float]) -> _Placed:
    """Probe one sample, find the sites (quantscan's kernels or quantize_static's placement), and plan
    the batch and memory; quantize_static's own time goes to `times`."""
    loaded, prepared, cset, runner, fixed_batch = (
        inputs.loaded, inputs.prepared, inputs.cset, inputs.runner, inputs.fixed_batch)
    probe = probe_model(loaded, prepared, cset, fixed_batch or 1, runner)
    inputs.warnings.extend(probe.warnings)
    order = {n.name: i for i, n in enumerate(loaded.proto.graph.node)}
    recipe_result = None
    if inputs.chip.recipe == RECIPE:
        started = time.perf_counter()
        call = quantize_static_call(inputs.chip.activations, opts.calib_method)
        # one sample per get_next() as a user's data reader does (a fixed batch stays whole)
        qdq = quantize_static_model(prepared.proto, cset.batches(fixed_batch or 1), call)
        recipe_result = recipe_sites(prepared, qdq, quantize_static_op_types(), call)
        sites, origins = recipe_result.sites, recipe_result.origins
        times["quantize_static"] = time.perf_counter() - started
    else:
        sites, origins = _sites(loaded, prepared, probe, order, inputs.chip)
    inputs.warnings.extend(w for w in [unquantized_warning(prepared.proto)] if w)
    memory, batch_size = _batch_plan(inputs, opts, probe, sites)
    return _Placed(probe, order, sites, origins, recipe_result, memory, batch_size)


def _batch_plan(inputs: _Inputs, opts: ScanOptions, probe: Probe, sites: Sequence[Site]) -> tuple[MemoryPlan, int]:
    """The memory plan and the batch; a model that runs one sample but not the planned batch is planned
    again at batch 1 (or refused, when the user asked for that batch)."""
    n_samples = min(inputs.cset.n_samples, inputs.eval_set.n_samples)
    memory = memory_plan(inputs.prepared, probe, sites, opts, inputs.fixed_batch, n_samples,
                         inputs.runner.weights_file_bytes)
    batch_size = 1 if opts.state else memory.batch_size
    refused = "" if inputs.fixed_batch or batch_size <= 1 else batch_refused(
        inputs.loaded, inputs.cset, batch_size, inputs.runner)
    if refused:
        if opts.batch_size is not None:
            raise UsageError(f"--batch-size {batch_size}: expected the model to run on {batch_size} samples at "
                             f"once, found it runs on one only ({refused}); pass --batch-size 1 (a recurrent "
                             "state input: --state, see README)")
        inputs.warnings.append(f"the model runs on one sample but not on {batch_size} at once ({refused}): "
                               "scanning one sample per run")
        memory = memory_plan(inputs.prepared, probe, sites, replace(opts, batch_size=1), inputs.fixed_batch,
                             n_samples, inputs.runner.weights_file_bytes)
        batch_size = memory.batch_size
    return memory, batch_size


def _calibration_phase(
    inputs: _Inputs,
    placed: _Placed,
    opts: ScanOptions,
    progress: ProgressFactory,
    calibrate_with: Callable[..., CalibStats | None] | None,
) -> tuple[CalibStats, qgraph.QuantPlan]:
    """Pass 1 (here, or in the workers' shards) and the quantization plan it gives."""
    scheme = inputs.chip.activations
    calib_stats = None
    if calibrate_with is not None:
        calib_stats = calibrate_with(inputs.prepared, placed.sites, placed.origins, inputs.cset, placed.batch_size,
                                     inputs.runner, opts, scheme, placed.probe, inputs.loaded.inputs)
    if calib_stats is None:
        calib_stats = calibrate(
            inputs.prepared, placed.sites, placed.origins, inputs.cset, placed.batch_size, inputs.runner,
            opts.calib_method, scheme, progress, placed.probe.shapes, placed.probe.input_shapes,
        )
    plan_warnings: list[str] = []
    if placed.recipe is not None:
        plan = placed.recipe.plan
    else:
        plan, plan_warnings = make_plan(inputs.prepared.proto, placed.sites, placed.origins, calib_stats.observers,
                                        scheme)
    inputs.warnings.extend(plan_warnings)
    inputs.warnings.extend(calib_stats.warnings)
    return calib_stats, plan


def _stateful_sets(
    loaded: LoadedModel, cset: CalibSet, eval_set: CalibSet, pairs: Mapping[str, str], runner: Runner
) -> tuple[CalibSet, CalibSet]:
    """Both sample sets with the recurrent state carried by the FP32 model (`--state`, calib.recurrent)."""
    check_state(pairs, loaded.inputs, [o.name for o in loaded.proto.graph.output])
    session = runner.session(loaded.proto)

    def step(sample: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return session.run(sample, list(pairs))

    stateful = with_state(cset, pairs, step)
    return stateful, stateful if eval_set is cset else with_state(eval_set, pairs, step)


def memory_plan(
    prepared: PreparedModel, probe: Probe, sites: Sequence[Site], opts: ScanOptions, fixed_batch: int | None,
    n_samples: int, weights_file_bytes: int | None = None,
) -> MemoryPlan:
    """The batch size from the budget (`--max-memory`, else half the available RAM) and the probe's sizes.
    `weights_file_bytes`: the runner's threshold for mapping a session's weights from a file (None: never)."""
    weight_bytes = sum(len(t.raw_data) or t.ByteSize() for t in prepared.proto.graph.initializer)
    footprint = Footprint(
        activation_bytes=probe.activation_bytes,
        largest_bytes=probe.largest_bytes,
        weight_bytes=weight_bytes,
        tensors=len(probe.float_tensors),
        sites=len(sites),
        weights_mapped=weights_file_bytes is not None and 2 * weight_bytes >= weights_file_bytes,
    )
    aim = None
    if opts.max_memory is not None:
        budget, source = int(opts.max_memory), "--max-memory"  # bytes: ScanOptions.validate parsed it
    else:
        available, total = machine_memory()
        budget, source = default_budget(available, total), "half the available RAM"
        aim = default_aim(footprint)  # the default aims at a few FP32 runs' memory, not half the machine
    workers = worker_count(opts.workers)
    if workers > 1:  # each worker holds its own analysis session: the budget is shared between them
        budget, source = budget // workers, f"{source}, split between {workers} workers"
        aim = aim // workers if aim is not None else None
    return plan_memory(footprint, budget=budget, budget_source=source, requested_batch=opts.batch_size,
                       fixed_batch=fixed_batch, n_samples=n_samples, segments=opts.segments, aim=aim)


def activations_source(explicit: bool, profile: str | None) -> str:
    """Why the activation scheme is what it is, as run.json and summary.md say it: an explicit
    option wins over the profile, the profile over the uint8 default."""
    if explicit:
        return "from --activations"
    return f"from profile {profile}" if profile else "default"


def given_input_specs(
    inputs: Sequence[InputSpec], input_shape: Mapping[str, Sequence[int]], input_dims: Sequence[str]
) -> list[InputSpec]:
    """The declared inputs with the sizes `--input-shape` gives (whole shapes, and `INPUT:AXIS=V` /
    `DIMPARAM=V` on axes other than the batch).

    Why: a `--const` input has no data to take its sizes from; without this, the error that asks for
    `--input-shape state:1=N` came back unchanged when the user gave exactly that.
    """
    from quantscan.rewrites.fix_dim import parse_dim_spec

    settings = [parse_dim_spec(text) for text in input_dims]
    out = []
    for spec in inputs:
        if spec.name in input_shape:
            out.append(replace(spec, shape=tuple(int(v) for v in input_shape[spec.name])))
            continue
        shape = list(spec.shape)
        for axis, dim in enumerate(shape):
            for st in settings:
                if axis > 0 and ((st.input == spec.name and st.axis == axis) or (st.param and dim == st.param)):
                    shape[axis] = st.value
        out.append(replace(spec, shape=tuple(shape)))
    return out


def _sample_sets(loaded: LoadedModel, calib: str | Path | CalibSet, opts: ScanOptions) -> tuple[CalibSet, CalibSet]:
    """The calibration set and the evaluation set (`--eval`, else the same object)."""
    consts = state_consts(opts.state, opts.const)
    specs = given_input_specs(loaded.inputs, opts.input_shape, opts.input_dims)
    cset = calib if isinstance(calib, CalibSet) else load_calibration(
        calib, specs, preprocess=opts.preprocess, overrides=opts.preprocess_overrides,
        consts=consts, limit=opts.limit,
    )
    if opts.eval is None:
        return cset, cset
    eval_set = load_calibration(
        opts.eval, specs, preprocess=opts.preprocess, overrides=opts.preprocess_overrides,
        consts=consts, limit=opts.limit,
    )
    return cset, eval_set


def _sites(
    loaded: LoadedModel, prepared: PreparedModel, probe: Probe, order: Mapping[str, int], chip: ChipRecipe
) -> tuple[list[Site], dict[str, str]]:
    """Where the chip quantizes, and for every quantized tensor the tensor whose range sets its scale."""
    sites = find_sites(
        prepared.proto,
        float_tensors=probe.float_tensors,
        original_order=order,
        bn_folded_into=prepared.bn_folded_into,
        fused_activations=chip.fused_activations,
        cpu_nodes=chip.cpu_nodes | chip.float16_nodes,
    )
    if not sites:
        raise UsageError(f"found no quantization site in {loaded.path.name}: nothing computes float tensors")
    producers = {o: n for n in prepared.proto.graph.node for o in n.output}
    site_outputs = {s.output for s in sites}
    quantized = list(dict.fromkeys([t for s in sites for t in (*s.inputs, s.output)]))
    origins = {t: _origin(t, producers, site_outputs) for t in quantized}
    return sites, consumer_range_origins(prepared.proto, sites, origins, chip.consumer_range_ops)


def chip_recipe(
    loaded: LoadedModel, opts: ScanOptions, dims: Mapping[str, tuple[Dim, ...]]
) -> tuple[Any, ChipRecipe]:
    """The profile's decisions (and its compat check), or the defaults without one; `opts` is left as
    the user gave it. An explicit `--activations` wins over the profile's scheme."""
    if opts.profile is None:
        return None, ChipRecipe(
            activations=opts.activations or ActivationScheme.UINT8,
            activations_source=activations_source(opts.activations is not None, None),
            fused_activations=opts.fused_activations,
        )
    from quantscan.compat import load_profile
    from quantscan.compat.check import check

    profile = load_profile(opts.profile)
    shapes = {k: [d if isinstance(d, int) else 1 for d in v] for k, v in dims.items()}
    compat = check(loaded.proto, [opts.profile], input_shapes=shapes)
    placement = compat.node_placement.get(profile.name, {})
    scheme = opts.activations or (
        ActivationScheme.INT8 if profile.activations == "int8" else ActivationScheme.UINT8
    )
    return compat, ChipRecipe(
        profile=profile.name,
        activations=scheme,
        activations_source=activations_source(opts.activations is not None, profile.name),
        fused_activations=frozenset(profile.fused_activations),
        cpu_nodes=frozenset(n for n, where in placement.items() if where == "cpu"),
        float16_nodes=float16_nodes(compat.findings, profile.name),
        consumer_range_ops=profile.consumer_range_ops,
        recipe=profile.recipe,
    )


def float16_nodes(findings: pd.DataFrame | None, profile: str) -> frozenset[str]:
    """The nodes `check`'s float16 rule names for `profile`: the toolkit runs them in float16 between
    int8 layers (rknn-toolkit2's Softmax), so simulating their output on the int8 grid (a 0..1 Softmax
    in 1/255 steps) would charge the model a loss the chip does not have. float16's own rounding
    (<= 2^-11 relative, 1-cos ~1e-7 on a Softmax output) is left out: they are kept float32."""
    if findings is None or findings.empty:
        return frozenset()
    rows = findings[(findings["rule"] == "float16") & (findings["profile"] == profile)]
    return frozenset(str(n) for n in rows[Col.NODE] if n)


def deployable_qdq(qdq: onnx.ModelProto, loaded: LoadedModel) -> onnx.ModelProto:
    """The QDQ model as the user gets it: the original's input and output declarations restored.

    The analysis copy fixes free dims from the data and drops declared output shapes; a saved model
    should accept what the original accepts and pass onnx.checker.
    """
    out = copy.deepcopy(qdq)
    originals = {vi.name: vi for vi in loaded.proto.graph.input}
    for vi in out.graph.input:
        if vi.name in originals:
            vi.CopyFrom(originals[vi.name])
    del out.graph.output[:]
    out.graph.output.extend(copy.deepcopy(list(loaded.proto.graph.output)))
    return out


def headline_outputs(probe: Probe, requested: Sequence[str]) -> list[str]:
    """The graph outputs the headline uses: `--output`, else the float outputs that are not recurrent state."""
    if requested:
        missing = [o for o in requested if o not in probe.outputs]
        if missing:
            raise UsageError(f"--output: expected one of {', '.join(probe.outputs)}, found {', '.join(missing)}")
        return list(requested)
    chosen = [
        o for o in probe.outputs
        if o in probe.float_tensors and not is_state_output(o, probe.shapes.get(o, ()), probe.input_shapes)
    ]
    chosen = chosen or [o for o in probe.outputs if o in probe.float_tensors]
    if not chosen:
        raise ModelError(f"expected a float graph output to measure int8 error on, found none among "
                         f"{', '.join(probe.outputs[:8]) or 'the outputs'} (integer, boolean or non-tensor outputs)")
    return chosen


def classifier_outputs(prepared: PreparedModel, outputs: Sequence[str], probe: Probe) -> set[str]:
    """Outputs a Softmax (possibly through Identity/Reshape) produces, with a class axis of ≥ 2; a
    Softmax written out as Exp/ReduceSum/Div (jax2tf, TF exports) counts as one."""
    producers = {o: n for n in prepared.proto.graph.node for o in n.output}
    found = set()
    for name in outputs:
        node = producers.get(name)
        while node is not None and node.op_type in ("Identity", "Reshape", "Flatten", "Squeeze"):
            node = producers.get(node.input[0])
        if node is not None and _is_softmax(prepared, node) and qm.looks_like_classifier(probe.shapes.get(name, ())):
            found.add(name)
    return found


def _is_softmax(prepared: PreparedModel, node: onnx.NodeProto) -> bool:
    """A Softmax/LogSoftmax node, or the last node of a decomposed Softmax (patterns/softmax.py)."""
    from quantscan.patterns import softmax

    if node.op_type in ("Softmax", "LogSoftmax"):
        return True
    if node.op_type not in ("Div", "Mul"):
        return False
    index = GraphIndex(prepared.proto.graph, ir_version=prepared.proto.ir_version)
    for exp in (index.producer_node(i) for i in node.input if i):
        found = softmax.match_at(index, exp) if exp is not None and exp.op_type == "Exp" else None
        if isinstance(found, softmax.SoftmaxMatch) and found.output == node.output[0]:
            return True
    return False
