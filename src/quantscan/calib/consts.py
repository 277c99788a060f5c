"""--const values: one array per named input, shaped as declared with symbolic dims set to 1.

Why its own module: a const replaces data for an input whatever kind of folder feeds the others,
so both readers take the arrays built here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from quantscan.calib.checks import cast_checked, fixed_dim, fmt
from quantscan.errors import UsageError
from quantscan.specs import InputSpec


def const_arrays(consts: Mapping[str, float], specs: Mapping[str, InputSpec]) -> dict[str, np.ndarray]:
    """Build one array per --const; the shape is the declared one with symbolic dims set to 1."""
    out: dict[str, np.ndarray] = {}
    for name, value in consts.items():
        if name not in specs:
            raise UsageError(
                f"--const {name}={value}: expected one of the model inputs ({', '.join(specs)}), "
                f"found '{name}'"
            )
        out[name] = _const_array(specs[name], value)
    return out


def _const_array(spec: InputSpec, value: float) -> np.ndarray:
    shape: list[int] = []
    for axis, dim in enumerate(spec.shape):
        fixed = fixed_dim(dim)
        if fixed is not None:
            shape.append(fixed)
        elif axis == 0 or isinstance(dim, str):
            shape.append(1)
        else:
            raise UsageError(
                f"--const {spec.name}: expected known sizes, found axis {axis} of input "
                f"'{spec.name}' unknown (shape {fmt(spec.shape)}); "
                f"give it with --input-shape {spec.name}:{axis}=N (rewrite: --fix-dim {spec.name}:{axis}=N)"
            )
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UsageError(f"--const {spec.name}: expected a number, found {value!r}") from None
    if not math.isfinite(number):
        raise UsageError(f"--const {spec.name}: expected a finite number, found {value!r}")
    arr = np.full(shape, number, dtype=np.float64)
    return cast_checked(arr, spec.dtype, f"--const {spec.name}={value}", spec.name, UsageError)
