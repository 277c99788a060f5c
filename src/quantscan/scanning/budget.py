"""The memory plan of a scan: how much it may use, what it will use, and the batch size that fits.

Why: the analysis session holds the FP32 graph, the cumulative copy, one twin per site and the
reductions at once, so its peak grows with activation size x batch. A 640x640 detector at the old
fixed batch of 8 was killed by the kernel on a 24 GB machine. The probe (pass 0, at the smallest
batch) gives every tensor's true size per sample; from it, `estimate_peak` predicts the peak resident
memory of a whole scan at a batch size, and `plan_memory` picks the largest batch (up to
`DEFAULT_BATCH`) whose estimate fits the budget, or says in one line why nothing fits.

The estimate is linear: a fixed part (the interpreter, onnx and onnxruntime, and the copies of the
weights the scan keeps: the user's model, the prepared copy, the QDQ model, the analysis and gain
graphs) plus, per sample in a batch, a multiple of the sum of all activations (what the
interleaved analysis session keeps alive, see graph/schedule.py) and of the largest one. The factors
were fitted on measured peaks (VmHWM, benchmarks/memory.py --batch-size 1 8) and rounded up, so the
estimate errs high: PP-LCNet 316/628 MB at batch 1/8 (2.3x its 19 MB of activations per sample),
PP-OCRv4 870/4340 MB (2.6x its 194 MB), a seeded ResNet-50 1801 MB at batch 1 (2148 before sessions
took their weights as arrays). The default plan aims lower than the budget (`default_aim`: 3x a plain
FP32 run + 1 GB, issue 11).

Pure code: no onnxruntime. Reading /proc for the machine's memory is the only outside contact.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from quantscan.errors import UsageError
from quantscan.machine import read_text_or_empty

DEFAULT_BATCH = 8
"""The batch a scan uses when memory allows and neither the model nor `--batch-size` fixes one."""

BASE_BYTES = 300 * 2**20
"""Interpreter, numpy/pandas/onnx/onnxruntime, the calibration loader and tables: a scan's floor."""
WEIGHT_COPIES = 12.5
"""Copies of the weights alive at the peak, which is the gain ranking's session build: the user's
model, the prepared copy, the analysis graph's FP32 and fake-quant weights (twice: the graph and its
reduced copy), the arrays handed to onnxruntime and its own tensors, the deployed-check session.
Fitted on the seeded ResNet-50 (102 MB of weights, 1603-1801 MB at batch 1, rounded up; 18 before
sessions stopped keeping their serialized model and took weights as arrays)."""
MAPPED_WEIGHT_COPIES = 5.0
"""The same when the analysis graph's weights reach onnxruntime through a file it maps (`Footprint.
weights_mapped`, runner.WEIGHTS_FILE_BYTES): each session's graph is dropped before its session is
built and no array copy exists beside onnxruntime's, so the peak holds the user's model, the prepared
copy, the QDQ model and the analysis session's FP32 and fake-quant weights. Fitted on the seeded
BERT-base (438 MB of weights, 2.7-2.8 GB at batch 1; 5.3 GB and 12.5 copies before), rounded up."""
ACTIVATION_FACTOR = 3.0
"""Per sample: this many times the sum of all float activations (FP32, cumulative and isolated
copies near the frontier, reduction temporaries, the arena's rounding)."""
LARGEST_FACTOR = 8.0
"""Per sample: this many times the largest activation (a handful of whole-tensor temporaries:
Sub, Mul and the QDQ pair of the biggest tensor exist at once)."""

GOAL_FACTOR = 3.0
GOAL_EXTRA_BYTES = 2**30
"""The default plan aims at a peak of at most GOAL_FACTOR x a plain FP32 run + GOAL_EXTRA_BYTES (issue 11):
a scan should cost a few FP32 runs' memory, not whatever half the machine allows."""
FP32_BASE_BYTES = 80 * 2**20
"""Interpreter, numpy and onnxruntime of a plain FP32 run: its floor (measured 88-90 MB on the small models)."""
FP32_WEIGHT_COPIES = 2.0
"""Copies of the weights a plain FP32 session holds (measured 2.2x on a seeded ResNet-50: 325 MB for 102 MB)."""

_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?)\s*(?P<unit>[KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Footprint:
    """What one sample costs, from the probe: bytes of every float activation and of the largest one."""

    activation_bytes: int
    largest_bytes: int
    weight_bytes: int
    tensors: int
    sites: int
    weights_mapped: bool = False
    """The analysis graph's weights (FP32 and fake-quant, about twice `weight_bytes`) are large enough
    that onnxruntime maps them from a file (runner.WEIGHTS_FILE_BYTES): fewer copies at the peak."""


@dataclass
class MemoryPlan:
    """The budget, the batch chosen for it and the estimate; run.json's `memory`."""

    budget_bytes: int
    budget_source: str
    batch_size: int
    batch_source: str
    estimated_peak_bytes: int
    footprint: Footprint
    segments: int = 1
    measured_peak_bytes: int | None = None
    aim_bytes: int | None = None
    """The default plan's target (`default_aim`); None when the user set the budget or the batch."""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """run.json's `memory` object (bytes, plus MiB figures a person can read)."""
        return {
            "budget_bytes": self.budget_bytes,
            "budget": format_size(self.budget_bytes),
            "budget_source": self.budget_source,
            "batch_size": self.batch_size,
            "batch_source": self.batch_source,
            "segments": self.segments,
            "estimated_peak_bytes": self.estimated_peak_bytes,
            "estimated_peak": format_size(self.estimated_peak_bytes),
            "measured_peak_bytes": self.measured_peak_bytes,
            "measured_peak": format_size(self.measured_peak_bytes) if self.measured_peak_bytes else None,
            "activation_bytes_per_sample": self.footprint.activation_bytes,
            "largest_activation_bytes_per_sample": self.footprint.largest_bytes,
            "weight_bytes": self.footprint.weight_bytes,
            "aim_bytes": self.aim_bytes,
        }


def parse_size(text: str | int) -> int:
    """`8G`, `512M`, `1.5GiB`, `2048K` or a plain byte count -> bytes (binary units, as `free -h`)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise UsageError(f"--max-memory: expected a positive size such as 8G or 512M, found {text}")
        return text
    found = _SIZE.match(str(text))
    if not found:
        raise UsageError(f"--max-memory: expected a size such as 8G, 512M or 1.5G, found {text!r}")
    value = float(found.group("num")) * _UNITS[found.group("unit").upper()]
    if value < 1:
        raise UsageError(f"--max-memory: expected a positive size such as 8G or 512M, found {text!r}")
    return int(value)


def format_size(n: int) -> str:
    """Bytes as the largest binary unit that keeps one decimal meaningful: `3.2G`, `512M`."""
    for unit in ("T", "G", "M", "K"):
        if n >= _UNITS[unit]:
            value = n / _UNITS[unit]
            return f"{value:.1f}{unit}" if value < 100 else f"{value:.0f}{unit}"
    return f"{n}B"


def measured_peak_bytes() -> int | None:
    """This process's peak resident memory so far (VmHWM), or None where /proc is missing."""
    for line in read_text_or_empty("/proc/self/status").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


def estimate_peak(footprint: Footprint, batch: int, segments: int = 1) -> int:
    """Predicted peak resident bytes of a whole scan (probe to gain ranking) at `batch` samples per run,
    the analysis split into `segments` sessions (each holds about 1/segments of the activations)."""
    copies = MAPPED_WEIGHT_COPIES if footprint.weights_mapped else WEIGHT_COPIES
    fixed = BASE_BYTES + copies * footprint.weight_bytes
    per_sample = ACTIVATION_FACTOR * footprint.activation_bytes / max(1, segments)
    per_sample += LARGEST_FACTOR * footprint.largest_bytes
    return int(fixed + batch * per_sample)


def fp32_floor(footprint: Footprint) -> int:
    """A low estimate of a plain FP32 onnxruntime run's peak: its floor and the session's weights
    (activations left out, so the aim derived from it errs low)."""
    return int(FP32_BASE_BYTES + FP32_WEIGHT_COPIES * footprint.weight_bytes)


def default_aim(footprint: Footprint) -> int:
    """The peak the default plan aims under: GOAL_FACTOR x a plain FP32 run's floor + GOAL_EXTRA_BYTES."""
    return int(GOAL_FACTOR * fp32_floor(footprint) + GOAL_EXTRA_BYTES)


def segment_counts(footprint: Footprint) -> list[int]:
    """Segment counts worth trying, fewest first: 2, 4, 8, ... up to one site per segment."""
    counts, n = [], 2
    while n < footprint.sites:
        counts.append(n)
        n *= 2
    return [*counts, footprint.sites] if footprint.sites > 1 else []


def plan_memory(
    footprint: Footprint,
    *,
    budget: int,
    budget_source: str,
    requested_batch: int | None,
    fixed_batch: int | None,
    n_samples: int,
    segments: int | None = None,
    aim: int | None = None,
) -> MemoryPlan:
    """The largest batch ≤ DEFAULT_BATCH that fits `budget` in one session; else batch 1 in the fewest
    segments that fit; the batch the model or the user fixed, if it fits (in segments if need be).
    `segments` forces a segment count (tests, the API). `aim` (the default plan, see `default_aim`)
    lowers the budget to it; batch 1 when nothing gets under it. Raises
    UsageError (exit 2, one line) when nothing fits, naming the estimate and the smallest budget that works."""
    if fixed_batch:
        return _fixed(footprint, budget, budget_source, fixed_batch, "fixed by the model", segments)
    if requested_batch is not None:
        return _fixed(footprint, budget, budget_source, requested_batch, "--batch-size", segments)
    ceiling = max(1, min(DEFAULT_BATCH, n_samples))
    if segments is not None:
        fits = [b for b in range(1, ceiling + 1) if estimate_peak(footprint, b, segments) <= budget] or [1]
        return MemoryPlan(budget, budget_source, fits[-1], "given segments", estimate_peak(footprint, fits[-1],
                          segments), footprint, segments)
    if aim is not None and aim < budget:
        plan = _aimed(footprint, budget, budget_source, ceiling, aim)
        if plan is not None:
            return plan
    if estimate_peak(footprint, 1) > budget:
        return _segmented(footprint, budget, budget_source, 1, "batch 1 needs segments")
    batch = max(b for b in range(1, ceiling + 1) if estimate_peak(footprint, b) <= budget)
    source = "default" if batch == ceiling else f"largest that fits {format_size(budget)}"
    return MemoryPlan(budget, budget_source, batch, source, estimate_peak(footprint, batch), footprint, aim_bytes=aim)


def _aimed(footprint: Footprint, budget: int, budget_source: str, ceiling: int, aim: int) -> MemoryPlan | None:
    """The largest batch whose estimate is under `aim` in one session, else batch 1 in the fewest
    segments under it, else batch 1 in one session when the budget holds it (closest to the aim);
    None when it does not (the budget rule picks the segments then).

    Why: under half the machine's memory the largest batch fits almost any model, and its peak grows
    with the batch (ResNet-50: 4.3 GB at batch 8, 2 GB at batch 1) while the scan's time per sample
    barely changes with it (benchmarks/RESULTS.md, memory.py)."""
    fits = [b for b in range(1, ceiling + 1) if estimate_peak(footprint, b) <= aim]
    if fits:
        batch = fits[-1]
        source = "default" if batch == ceiling else f"largest under the aim of {format_size(aim)}"
        return MemoryPlan(budget, budget_source, batch, source, estimate_peak(footprint, batch), footprint,
                          aim_bytes=aim)
    for count in segment_counts(footprint):
        peak = estimate_peak(footprint, 1, count)
        if peak <= aim:
            return MemoryPlan(budget, budget_source, 1, f"batch 1 in segments under the aim of {format_size(aim)}",
                              peak, footprint, count, aim_bytes=aim)
    peak = estimate_peak(footprint, 1)
    if peak <= budget:
        return MemoryPlan(budget, budget_source, 1, f"batch 1, closest to the aim of {format_size(aim)}", peak,
                          footprint, aim_bytes=aim)
    return None


def _segmented(footprint: Footprint, budget: int, budget_source: str, batch: int, why: str) -> MemoryPlan:
    """The fewest segments that fit at `batch`, or the one-line error naming the smallest budget that works."""
    for count in segment_counts(footprint):
        peak = estimate_peak(footprint, batch, count)
        if peak <= budget:
            return MemoryPlan(budget, budget_source, batch, why, peak, footprint, count)
    finest = max(1, footprint.sites)
    smallest = estimate_peak(footprint, batch, finest)
    raise UsageError(
        f"--max-memory {format_size(budget)}: expected a budget the scan fits at batch {batch} with one site per "
        f"segment, found an estimated peak of {format_size(smallest)}: give at least --max-memory "
        f"{_round_up(smallest)}"
    )


def _largest_fitting_batch(footprint: Footprint, budget: int, most: int) -> int:
    """The largest batch in 1..most whose estimate fits `budget` (0: none), by bisection: the estimate
    grows with the batch, and `--batch-size 2147483648` must not mean two billion estimates."""
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate_peak(footprint, mid) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _fixed(footprint: Footprint, budget: int, budget_source: str, batch: int, why: str,
           segments: int | None = None) -> MemoryPlan:
    """A batch the model or the user set: it fits (in segments if need be), or a one-line error with the estimate."""
    peak = estimate_peak(footprint, batch, segments or 1)
    if peak <= budget or segments is not None:
        return MemoryPlan(budget, budget_source, batch, why, peak, footprint, segments or 1)
    if any(estimate_peak(footprint, batch, c) <= budget for c in segment_counts(footprint)):
        return _segmented(footprint, budget, budget_source, batch, why)
    fitting = _largest_fitting_batch(footprint, budget, batch - 1)
    smallest = estimate_peak(footprint, batch, max(1, footprint.sites))
    hint = (f"--batch-size {fitting} fits" if fitting and why == "--batch-size"
            else f"give at least --max-memory {_round_up(smallest)}")
    flag = f"--batch-size {batch}" if why == "--batch-size" else f"the model's fixed batch of {batch}"
    raise UsageError(
        f"--max-memory {format_size(budget)}: expected {flag} to fit, found an estimated peak of "
        f"{format_size(peak)}: {hint}"
    )


def _round_up(n: int) -> str:
    """A budget a user can type that is at least `n`: whole GiB above 1 GiB, else whole 64 MiB steps."""
    if n > 2**30:
        return f"{math.ceil(n / 2**30)}G"
    return f"{math.ceil(n / (64 * 2**20)) * 64}M"
