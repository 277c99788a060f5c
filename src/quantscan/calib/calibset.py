"""`CalibSet`: a validated calibration set that decodes its samples lazily, one file at a time.

Why its own module: the image and tensor readers both return this one record, and batching (which
inputs may be stacked on axis 0, which consts pass once) is the same whatever the files were.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from quantscan.calib.checks import fmt
from quantscan.errors import CalibrationError, UsageError

Sample = dict[str, np.ndarray]
_Reader = Callable[[int], Iterator[tuple[Sample, Path]]]
"""Yields (sample, file it came from) for the first n samples; the file names errors in `batches`."""


@dataclass
class CalibSet:
    """A validated calibration set; samples are decoded lazily, one file at a time."""

    source: Path
    kind: str
    files: list[Path]
    n_samples: int
    warnings: list[str]
    labels: list[int | None] | None
    label_names: list[str] | None
    _shapes: dict[str, tuple[int, ...]] = field(repr=False, compare=False)
    _batched: dict[str, bool] = field(repr=False, compare=False)
    _consts: dict[str, np.ndarray] = field(repr=False, compare=False)
    _read: _Reader = field(repr=False, compare=False)
    preprocessing: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per input, the preprocessing as applied (calib/preprocess.contract_record; tensors: as stored)."""

    def sample_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of one sample per input (batch dim 1), consts included; images: the first one."""
        return dict(self._shapes)

    def samples(self) -> Iterator[Sample]:
        """One sample at a time (batch dim 1), every model input present, in file order."""
        for sample, _ in self._samples_with_files():
            yield sample

    def without_consts(self, names: Iterable[str]) -> CalibSet:
        """The same samples without these `--const` inputs: a scan that froze them into the graph
        (scanning.settings) must not feed them to a model that no longer takes them."""
        gone = set(names)
        return replace(
            self, _shapes={k: v for k, v in self._shapes.items() if k not in gone},
            _batched={k: v for k, v in self._batched.items() if k not in gone},
            _consts={k: v for k, v in self._consts.items() if k not in gone},
        )

    def shard(self, start: int, stop: int) -> CalibSet:
        """Samples [start, stop) as a set of their own (a `--workers` shard), labels and files alike.

        Samples before `start` are read and dropped: readers stream in file order (an .npz holds many
        samples), and decoding is small beside the analysis each sample then gets.
        """
        if not 0 <= start <= stop <= self.n_samples:
            raise UsageError(f"expected a shard within 0..{self.n_samples}, found {start}..{stop}")
        read = self._read

        def sharded(n: int) -> Iterator[tuple[Sample, Path]]:
            return islice(read(start + n), start, start + n)

        one_per_sample = len(self.files) == self.n_samples
        return replace(
            self, n_samples=stop - start, labels=self.labels[start:stop] if self.labels else self.labels,
            files=self.files[start:stop] if one_per_sample else list(self.files), _read=sharded,
        )

    def select(self, indices: Iterable[int]) -> CalibSet:
        """The samples at `indices` (in file order, each once) as a set of their own, labels and files alike.

        Why: the scan measures output gain on the evaluation samples that carry the most error, wherever
        they sit in the set. Samples before the last one chosen are read and dropped, as in `shard`.
        """
        chosen = sorted(set(indices))
        if chosen and not 0 <= chosen[0] <= chosen[-1] < self.n_samples:
            raise UsageError(f"expected sample indices within 0..{self.n_samples - 1}, found {chosen}")
        read, wanted = self._read, set(chosen)
        stop = chosen[-1] + 1 if chosen else 0

        def selected(n: int) -> Iterator[tuple[Sample, Path]]:
            picked = (item for i, item in enumerate(read(stop)) if i in wanted)
            return islice(picked, n)

        one_per_sample = len(self.files) == self.n_samples
        return replace(
            self, n_samples=len(chosen), labels=[self.labels[i] for i in chosen] if self.labels else self.labels,
            files=[self.files[i] for i in chosen] if one_per_sample else list(self.files), _read=selected,
        )

    def batches(self, batch_size: int) -> Iterator[Sample]:
        """Consecutive samples concatenated on axis 0; the last batch may be smaller.

        Consts whose axis 0 is fixed are passed once, not repeated; a data input whose axis 0 is not a
        batch axis cannot be batched (batch size 1 only).
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise UsageError(f"expected a positive batch size, found {batch_size!r}")
        group: list[tuple[Sample, Path]] = []
        for item in self._samples_with_files():
            group.append(item)
            if len(group) == batch_size:
                yield self._stack(group)
                group = []
        if group:
            yield self._stack(group)

    def _samples_with_files(self) -> Iterator[tuple[Sample, Path]]:
        for sample, path in self._read(self.n_samples):
            for name, value in self._consts.items():
                sample[name] = value.copy()
            yield sample, path

    def _stack(self, group: list[tuple[Sample, Path]]) -> Sample:
        first, first_path = group[0]
        if len(group) == 1:
            return first
        out: Sample = {}
        for name, value in first.items():
            if name in self._consts and not self._batched[name]:
                out[name] = value
                continue
            if not self._batched[name]:
                raise CalibrationError(
                    f"input '{name}' has a fixed axis 0 of {value.shape[0] if value.ndim else 0}, so its "
                    f"samples cannot be batched: expected batch size 1, found {len(group)}"
                )
            for sample, path in group[1:]:
                if sample[name].shape != value.shape:
                    raise CalibrationError(
                        f"cannot batch {path} with {first_path}: input '{name}' shapes differ "
                        f"({fmt(sample[name].shape)} vs {fmt(value.shape)}); "
                        "use batch size 1 or a fixed shape"
                    )
            out[name] = np.concatenate([s[name] for s, _ in group], axis=0)
        return out
