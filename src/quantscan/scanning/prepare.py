"""The front half of every scan: load, prepare, probe, find the sites, apply a chip profile, calibrate.

Pass 0, the probe, runs the prepared model with every tensor exposed on one batch: true dtypes and
shapes (the declared ones are not trusted) and a numeric check of the preparation (BN folding,
opset upgrade) against the user's model. `prepare_scan` then calibrates (calibrate.py) and returns
a `ScanContext`: what the scan's evaluation and bisection (gain.py) build on.
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import onnx

from quantscan import graph as qgraph
from quantscan.calib import CalibSet
from quantscan.calib.recurrent import state_consts
from quantscan.errors import UsageError
from quantscan.graph.index import DEFAULT_DOMAINS, GraphIndex
from quantscan.graph.mixed import INT16_OPSET
from quantscan.graph.subgraphs import unquantized_warning
from quantscan.machine import default_budget, machine_memory
from quantscan.model import MIN_ANALYSIS_OPSET, LoadedModel, PreparedModel, ensure_float_model, load_model
from quantscan.runner import Runner, quantize_static_model, quantize_static_op_types
from quantscan.scanning.analysis_copy import prepare_for_analysis
from quantscan.scanning.budget import (
    Footprint,
    MemoryPlan,
    default_aim,
    plan_memory,
)
from quantscan.scanning.calibrate import CalibStats, calibrate, make_plan
from quantscan.scanning.chip import chip_recipe
from quantscan.scanning.options import ChipRecipe, ProgressFactory, ScanOptions, no_progress, worker_count
from quantscan.scanning.ort_recipe import (
    RECIPE,
    check_calib_method,
    prepare_unfolded,
    quantize_static_call,
    recipe_sites,
)
from quantscan.scanning.probe import Probe, batch_refused, classifier_outputs, headline_outputs, probe_model
from quantscan.scanning.samples import (
    apply_dim_settings,
    check_eval_shapes,
    dims_from_data,
    sample_sets,
    stateful_sets,
)
from quantscan.scanning.settings import fold_setting_consts, unfed
from quantscan.scanning.tasks import check_task_specs, task_hint
from quantscan.sites import (
    HARDSWISH_FLOOR,
    PASS_THROUGH_OPS,
    Site,
    find_sites,
    input_sites,
    with_depthwise_hardswish_points,
)


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


def _value_at_zero(node: onnx.NodeProto) -> float | None:
    """An activation's output at input 0 (HardSigmoid: its beta), None for an op `output_grid_points` knows no
    value of."""
    if node.op_type == "Sigmoid":
        return 0.5
    if node.op_type == "HardSigmoid":
        beta = next((a.f for a in node.attribute if a.name == "beta"), 0.5)
        return float(beta)
    if node.op_type == "Tanh":
        return 0.0
    return None


def output_grid_points(model: onnx.ModelProto, sites: Sequence[Site], ops: frozenset[str]) -> dict[str, float]:
    """Site output -> a value its int8 grid must reach, for the sites that end in one of `ops` (a profile's
    `[output_grid]`): the activation's value at 0.

    Why: rknn-toolkit2 does not quantize a Sigmoid's output on the range calibration saw; its quant_optimizer
    (`adjust_tanh_sigmoid`) sets the output grid to the sigmoid of the input grid, and an asymmetric input
    grid always holds 0. PicoDet's class-score Sigmoids, calibrated to [0, 0.04], run on [0, 0.5] (a step of
    1/510 where calibration alone gives 1/6400): a claim made on the finer grid is 0.01 of output cosine
    better than the chip on every sample of a plan whose head is int8 (issue 38).
    """
    if not ops:
        return {}
    producers = {o: n for n in model.graph.node for o in n.output}
    out = {}
    for site in sites:
        node = producers.get(site.output)
        if node is not None and node.op_type in ops and (value := _value_at_zero(node)) is not None:
            out[site.output] = value
    return out


@dataclass(frozen=True)
class SiteGraph:
    """The model a pass runs: `prepared` is the FP32 analysis copy (same tensor names as the user's
    model), `probe` the true dtypes/shapes of every tensor, `sites` the quantization sites with their
    topological `order`, `origins` which site's range a pass-through tensor takes."""

    prepared: PreparedModel
    probe: Probe
    sites: list[Site]
    order: dict[str, int]
    origins: dict[str, str]


@dataclass(frozen=True)
class QuantSetup:
    """What calibration found (`calib_stats`, per-sample ranges kept) and the int8 plan built from it;
    with the onnxruntime recipe, the quantize_static keyword arguments the sites and plan were read from."""

    calib_stats: CalibStats
    plan: qgraph.QuantPlan
    quantize_static: dict[str, Any] | None = None


@dataclass(frozen=True)
class SampleData:
    """The calibration and evaluation samples (the same object when no `--eval`), and how they are fed:
    the batch size and the memory plan (budget, segments, estimated peak; run.json `memory`)."""

    cset: CalibSet
    eval_set: CalibSet
    batch_size: int
    memory: MemoryPlan | None = None


@dataclass(frozen=True)
class ScanContext:
    """Everything up to the quantization plan: what the evaluation, bisection and output gain build on.

    Three records a pass reads (`graph`: the prepared model and its sites; `quant`: calibration and the
    plan; `data`: the samples and the memory plan), beside what the user asked (`opts`), what the chip
    decided (`chip`) and the one onnxruntime runner. The QDQ model is built from `graph.prepared`,
    `graph.sites` and `quant.plan` by whoever needs it. Frozen: no field is reassigned (a shard or a
    sample subset is `dataclasses.replace` on `data`, another plan on `quant`); only `warnings`, a
    list, collects what the later passes find.
    """

    loaded: LoadedModel
    graph: SiteGraph
    quant: QuantSetup
    data: SampleData
    opts: ScanOptions
    chip: ChipRecipe
    runner: Runner
    warnings: list[str]
    compat: Any = None
    """compat.CheckResult when a profile was given."""

    def classifier_outputs(self, outputs: Sequence[str]) -> set[str]:
        """Which of `outputs` are classifier outputs (top-1 agreement applies)."""
        return classifier_outputs(self.graph.prepared, outputs, self.graph.probe)

    def headline_outputs(self) -> list[str]:
        """The graph outputs the headline metric uses (contract: `--output`, else non-state float outputs)."""
        return headline_outputs(self.graph.probe, self.opts.output, self.opts.state)


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
    opts: ScanOptions | None = None,
    **options: Any,
) -> tuple[ScanContext, dict[str, float]]:
    """`prepare_scan`, plus the seconds each phase took (run.json's `times_s`). `calibrate_with` may
    take pass 1 elsewhere (`--workers`: scanning.workers.ShardedCalibration); None from it: here.
    `opts` are options already validated (`measure` parses them once); else `options` are."""
    opts = opts if opts is not None else ScanOptions(**options).validate()
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
        loaded=inputs.loaded,
        graph=SiteGraph(inputs.prepared, placed.probe, placed.sites, placed.order, placed.origins),
        quant=QuantSetup(calib_stats, plan, placed.recipe.call if placed.recipe is not None else None),
        data=SampleData(inputs.cset, inputs.eval_set, placed.batch_size, placed.memory),
        opts=opts, chip=inputs.chip, runner=inputs.runner, warnings=inputs.warnings, compat=inputs.compat,
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
    cset, eval_set = sample_sets(loaded, calib, opts)
    warnings: list[str] = list(cset.warnings) + ([] if eval_set is cset else list(eval_set.warnings))
    dims, fixed_batch = dims_from_data(loaded, cset, opts.input_shape, state_consts(opts.state, opts.const, calib))
    dims, fixed_batch = apply_dim_settings(loaded, dims, fixed_batch, opts.input_dims)
    check_eval_shapes(eval_set, cset, dims)
    if opts.state and fixed_batch is None and any(s.shape and not isinstance(s.shape[0], int) for s in loaded.inputs):
        # a stateful set feeds one sample at a time: the batch is 1 (and shapes can fold, settings.py)
        dims, fixed_batch = apply_dim_settings(loaded, dims, fixed_batch, ["batch=1"])
    settings = fold_setting_consts(loaded, opts.const, dims, opts.state.values())  # freeze-input's graph
    loaded, dims = settings.loaded, settings.dims
    cset, eval_set = unfed(cset, eval_set, settings.frozen)
    warnings.extend(w for w in [settings.warning] if w)
    if fixed_batch and fixed_batch != 1:
        warnings.append(f"model batch is fixed at {fixed_batch}: samples are grouped by {fixed_batch}")
    compat, chip = chip_recipe(loaded, opts, dims)
    if chip.recipe == RECIPE:
        check_calib_method(opts.calib_method)
    min_opset = max(MIN_ANALYSIS_OPSET, INT16_OPSET) if chip.scheme.needs_opset21 else MIN_ANALYSIS_OPSET
    recipe_opset = INT16_OPSET if chip.scheme.activations == "int16" else 0  # else the user's opset, kept
    prepared = prepare_unfolded(loaded, dims, recipe_opset) if chip.recipe == RECIPE else prepare_for_analysis(
        loaded, dims, min_opset=min_opset)
    runner = runner or Runner(threads=opts.threads, opt_level="basic")
    if opts.state:
        cset, eval_set = stateful_sets(loaded, cset, eval_set, opts.state, runner)
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
        sites, origins = _sites(loaded, prepared, probe, order, inputs.chip, [*opts.state.values(), *opts.const])
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
                             "state input: --state, see docs/control-flow.md)")
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
    headline = headline_outputs(placed.probe, opts.output, opts.state)
    check_task_specs(inputs.prepared.proto, headline, placed.probe.shapes, placed.probe.input_shapes, opts)
    inputs.warnings.extend(h for h in [task_hint(headline, placed.probe.shapes, opts)] if h)
    calib_stats = None
    observed = placed.origins
    if placed.recipe is not None:  # ranges a float Relu/Clip/Softmax leaves their tensor (ort_recipe.range_settings)
        observed = {**{t: t for t in placed.recipe.own_ranges}, **placed.origins}
    if calibrate_with is not None:
        calib_stats = calibrate_with(inputs.prepared, placed.sites, observed, inputs.cset, placed.batch_size,
                                     inputs.runner, opts, scheme, placed.probe, inputs.loaded.inputs)
    if calib_stats is None:
        calib_stats = calibrate(
            inputs.prepared, placed.sites, observed, inputs.cset, placed.batch_size, inputs.runner,
            opts.calib_method, scheme, progress, placed.probe.shapes, placed.probe.input_shapes,
        )
    plan_warnings: list[str] = []
    if placed.recipe is not None:
        plan = placed.recipe.plan
    else:
        grid_points = output_grid_points(inputs.prepared.proto, placed.sites, inputs.chip.output_grid_ops)
        floors = {t: HARDSWISH_FLOOR for s in placed.sites for t in s.inner}  # the only kernel point so far
        plan, plan_warnings = make_plan(inputs.prepared.proto, placed.sites, placed.origins, calib_stats.observers,
                                        scheme, inputs.chip.per_channel_weights, inputs.chip.scheme, grid_points,
                                        floors)
    inputs.warnings.extend(plan_warnings)
    inputs.warnings.extend(calib_stats.warnings)
    return calib_stats, plan


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
    if workers > 1:  # each worker holds its own analysis session: the hard budget is shared between them
        budget, source = budget // workers, f"{source}, split between {workers} workers"
    # The soft aim stays per session: a default batch that moved with the worker count changed the
    # tables' bytes (onnxruntime's kernels give other float32 values at batch 8 than at batch 1), and
    # layers.csv must not depend on how many processes computed it (issue 41). Only the hard budget splits.
    return plan_memory(footprint, budget=budget, budget_source=source, requested_batch=opts.batch_size,
                       fixed_batch=fixed_batch, n_samples=n_samples, segments=opts.segments, aim=aim)


def _sites(
    loaded: LoadedModel, prepared: PreparedModel, probe: Probe, order: Mapping[str, int], chip: ChipRecipe,
    fixed: Iterable[str] = (),
) -> tuple[list[Site], dict[str, str]]:
    """Where the chip quantizes (the model inputs first, sites.input_sites), and for every quantized
    tensor the tensor whose range sets its scale."""
    sites = find_sites(
        prepared.proto,
        float_tensors=probe.float_tensors,
        original_order=order,
        bn_folded_into=prepared.bn_folded_into,
        fused_activations=chip.fused_activations,
        cpu_nodes=chip.cpu_nodes | chip.float16_nodes,
        shapes=probe.shapes,
    )
    if not sites:
        raise UsageError(_no_site_message(loaded.path.name, prepared.proto))
    sites = [*input_sites(prepared.proto, sites, fixed), *sites]
    if chip.depthwise_hardswish_point:
        sites = with_depthwise_hardswish_points(prepared.proto, sites)
    producers = {o: n for n in prepared.proto.graph.node for o in n.output}
    site_outputs = {s.output for s in sites}
    quantized = list(dict.fromkeys([t for s in sites for t in (*s.inputs, s.output, *s.inner)]))
    origins = {t: _origin(t, producers, site_outputs) for t in quantized}
    return sites, consumer_range_origins(prepared.proto, sites, origins, chip.consumer_range_ops)


def _no_site_message(name: str, model: onnx.ModelProto) -> str:
    """Why a model has no quantization site. Ops outside the standard domain (a scikit-learn GBDT's
    ai.onnx.ml::TreeEnsembleClassifier) may well compute float tensors: they are named, with where they
    run, rather than the false "nothing computes float tensors"."""
    foreign = Counter(f"{n.domain}::{n.op_type}" for n in model.graph.node if n.domain not in DEFAULT_DOMAINS)
    if not foreign:
        return f"found no quantization site in {name}: nothing computes float tensors"
    ops = ", ".join(f"{op} ×{k}" if k > 1 else op for op, k in foreign.items())
    return (f"expected standard ONNX ops an int8 scheme quantizes (Conv, MatMul, ...), found only {ops} in {name}: "
            "ops outside the standard domain have no int8 kernel and run on the CPU (onnxruntime runs "
            "ai.onnx.ml), so there is nothing to scan; `quantscan check` places them")


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
