"""The one sample source of compare and extract: a calibration set, else seeded random data.

Why here and not in compare.py: `quantscan compare` and `quantscan extract` must see the same samples
for the same folder (extract's saved inputs reproduce what compare measured), so both take them from
this one function, which also says in its description where the samples came from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from quantscan.calib import CalibSet, load_calibration
from quantscan.calib.calibset import Sample
from quantscan.calib.synthetic import random_samples
from quantscan.errors import UsageError
from quantscan.specs import InputSpec

RANDOM_SAMPLES = 8
"""Samples of seeded random data when no calibration set is given and no limit says otherwise."""


@dataclass
class DataSource:
    """Where samples come from, described for the report, streamed one at a time."""

    description: str
    random: bool
    count: int | None
    labels: list[int | None] | None
    _make: Callable[[], Iterator[Sample]] = field(repr=False)

    def samples(self) -> Iterator[Sample]:
        """A fresh stream of the samples, from the first one."""
        return self._make()


def data_source(
    calib: CalibSet | str | Path | None,
    inputs: Sequence[InputSpec],
    *,
    other_inputs: Sequence[InputSpec] | None = None,
    limit: int | None = None,
    seed: int = 0,
    consts: Mapping[str, float] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> DataSource:
    """The calibration set (a folder is loaded against `inputs`), else `RANDOM_SAMPLES` seeded samples.

    Random data needs concrete shapes: `input_shapes` fixes them, a symbolic axis 0 becomes 1, a dim
    fixed in `other_inputs` (the other model) is taken from there; anything else is a UsageError.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise UsageError(f"--limit: expected a positive integer, found {limit!r}")
    if calib is not None:
        cset = calib if isinstance(calib, CalibSet) else load_calibration(
            calib, inputs, consts=consts, limit=limit
        )
        n = min(cset.n_samples, limit) if limit else cset.n_samples
        labels = cset.labels if cset.labels is not None and len(cset.labels) >= n else None
        return DataSource(
            f"calibration set {cset.source}, {n} samples", False, n, labels, lambda: _take(cset.samples(), n)
        )
    specs = _with_shapes(inputs, input_shapes or {})
    others = _with_shapes(other_inputs or inputs, input_shapes or {})
    n = limit or RANDOM_SAMPLES
    fills = _const_fills(consts or {}, specs)
    # Fail on unknown dims now, not inside the first run.
    next(iter(random_samples(specs, others, seed, 1)))

    def make() -> Iterator[Sample]:
        for sample in random_samples(specs, others, seed, n):
            for name, value in fills.items():
                sample[name] = np.full(sample[name].shape, value, dtype=sample[name].dtype)
            yield sample

    return DataSource(
        f"seeded random data (seed {seed}, {n} samples): no calibration set given", True, n, None, make
    )


def _take(samples: Iterator[Sample], n: int) -> Iterator[Sample]:
    for i, sample in enumerate(samples):
        if i >= n:
            return
        yield sample


def _with_shapes(specs: Sequence[InputSpec], shapes: Mapping[str, Sequence[int]]) -> list[InputSpec]:
    names = {s.name for s in specs}
    unknown = [n for n in shapes if n not in names]
    if unknown:
        raise UsageError(
            f"--input-shape: expected one of the model inputs ({', '.join(sorted(names))}), "
            f"found {unknown[0]!r}"
        )
    return [InputSpec(s.name, s.dtype, tuple(int(d) for d in shapes[s.name])) if s.name in shapes else s
            for s in specs]


def _const_fills(consts: Mapping[str, float], specs: Sequence[InputSpec]) -> dict[str, float]:
    names = {s.name for s in specs}
    for name in consts:
        if name not in names:
            raise UsageError(f"--const {name}: expected one of the model inputs ({', '.join(sorted(names))})")
    return {k: float(v) for k, v in consts.items()}
