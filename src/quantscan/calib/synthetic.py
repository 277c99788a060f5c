"""Synthetic samples: seeded random inputs for a model when no calibration set is given.

Why here and not in the rewrite proof: the rewrite proof and `compare` both need inputs that fit two
models at once (the original and its rewrite, or A and B), and both must say in their report that the
data was random. One generator keeps their samples identical for the same seed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from quantscan.errors import UsageError
from quantscan.specs import InputSpec


def random_samples(
    original: Sequence[InputSpec], rewritten: Sequence[InputSpec], seed: int, n: int
) -> Iterator[dict[str, np.ndarray]]:
    """`n` seeded samples fitting both models: a symbolic dim takes the rewritten model's fixed value,
    axis 0 defaults to 1, any other symbolic dim needs calibration data or fix-dim (UsageError)."""
    shapes = _shapes(original, rewritten)
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield {spec.name: _draw(rng, spec, shapes[spec.name]) for spec in original}


def _shapes(original: Sequence[InputSpec], rewritten: Sequence[InputSpec]) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for `original`'s inputs; raises UsageError for a symbolic dim it cannot fill."""
    fixed = {s.name: s.shape for s in rewritten}
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in original:
        dims: list[int] = []
        for axis, d in enumerate(spec.shape):
            other = fixed.get(spec.name, ())
            alt = other[axis] if axis < len(other) else None
            if isinstance(d, int) and d > 0:
                dims.append(d)
            elif isinstance(alt, int) and alt > 0:
                dims.append(alt)
            elif axis == 0:
                dims.append(1)
            else:
                raise UsageError(
                    f"cannot make random data for input {spec.name!r}: axis {axis} is symbolic ({d!r}); "
                    "expected a calibration set or a fix-dim for it"
                )
        shapes[spec.name] = tuple(dims)
    return shapes


def _draw(rng: np.random.Generator, spec: InputSpec, shape: tuple[int, ...]) -> np.ndarray:
    """Normal floats, fair booleans, integers in [0, 10): values every op accepts."""
    if np.issubdtype(spec.dtype, np.floating):
        return rng.standard_normal(shape).astype(spec.dtype)
    if spec.dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    return rng.integers(0, 10, shape).astype(spec.dtype)
