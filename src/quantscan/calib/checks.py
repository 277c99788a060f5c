"""Checks every calibration reader shares: lossless casts, shape fitting, one-line error text.

Why one module: images, tensor files and --const values all end as arrays fed to a model input, and
must be held to the same rules (no value may change meaning in the cast, axis 0 is the sample axis
unless it is a fixed size > 1) with the same wording in the errors that name them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from quantscan.errors import CalibrationError, UsageError
from quantscan.specs import Dim, InputSpec


def cast_checked(
    arr: np.ndarray, dtype: np.dtype, where: str, name: str, error: type[CalibrationError] | type[UsageError]
) -> np.ndarray:
    """Cast to the input's dtype only when no value changes meaning (no overflow, no fraction lost)."""
    if arr.dtype == dtype:
        return arr
    if arr.dtype.kind not in "biuf" or dtype.kind not in "biuf":
        raise error(f"{where}: input '{name}' takes {dtype}, found {arr.dtype} data")
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            out = arr.astype(dtype)
        if not np.isfinite(out).all():
            raise error(f"{where}: input '{name}' takes {dtype}, found values that overflow it (Inf)")
        return out
    if arr.dtype.kind == "f" and arr.size and not np.all(np.mod(arr, 1) == 0):
        raise error(f"{where}: input '{name}' takes {dtype}, found non-integral {arr.dtype} values")
    if dtype.kind == "b":
        if arr.size and not np.isin(arr, (0, 1)).all():
            raise error(f"{where}: input '{name}' takes bool, found values other than 0/1")
        return arr.astype(dtype)
    info = np.iinfo(dtype)
    if arr.size and (arr.min() < info.min or arr.max() > info.max):
        raise error(
            f"{where}: input '{name}' takes {dtype} [{info.min}, {info.max}], "
            f"found values in [{arr.min()}, {arr.max()}]"
        )
    return arr.astype(dtype)


def fixed_dim(dim: Dim) -> int | None:
    """The size of a fixed dim; None for a symbolic, unknown or non-positive one."""
    return dim if isinstance(dim, int) and not isinstance(dim, bool) and dim > 0 else None


def is_batch_axis(shape: tuple[Dim, ...]) -> bool:
    """Axis 0 is a batch axis unless it is a fixed size > 1 (e.g. an LSTM state [2,1,128])."""
    return bool(shape) and (fixed_dim(shape[0]) is None or shape[0] == 1)


def batched_map(specs: Mapping[str, InputSpec]) -> dict[str, bool]:
    """Per input: may its samples be stacked on axis 0?"""
    return {name: is_batch_axis(spec.shape) for name, spec in specs.items()}


def dims_fit(found: Sequence[int], declared: Sequence[Dim]) -> bool:
    """Same rank, and every fixed declared dim matched (free dims take any size)."""
    if len(found) != len(declared):
        return False
    return all(fixed_dim(d) is None or f == d for f, d in zip(found, declared, strict=True))


def fmt(shape: Sequence[Any]) -> str:
    """A shape as errors print it: `[N,3,?,224]` (unknown dims as `?`)."""
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


_BYTES = re.compile(r"""b(['"]).*?(?<!\\)\1""")

LISTING_LIMIT = 8
"""Most file names one message lists: a folder of 100,000 files must not become a 100,000-name line."""


def short(exc: BaseException) -> str:
    """An exception as one short line (error messages must stay on one line).

    Byte strings are dropped: numpy and PIL quote a file's first bytes ("got b'...'"), and a file a
    symlink points at must not have its content shown in our message.
    """
    text = _BYTES.sub("<bytes>", " ".join(str(exc).split())) or type(exc).__name__
    return text[:200]


def listing(names: Sequence[str], limit: int = LISTING_LIMIT) -> str:
    """`a, b, c and 97 more`: names for a message, truncated."""
    names = list(names)
    if len(names) <= limit:
        return ", ".join(names)
    return ", ".join(names[:limit]) + f" and {len(names) - limit} more"


def missing_inputs_error(names: Sequence[str], folder: Any, expected: str) -> CalibrationError:
    """One line for every model input the folder does not feed, all named at once (fixing them one per
    run sent silero-vad's users round twice: state, then sr). `expected` says what would feed one
    input, with NAME standing for its name."""
    quoted = ", ".join(f"'{n}'" for n in names)
    subject = f"input {quoted} has" if len(names) == 1 else f"inputs {quoted} have"
    wanted = " or ".join(expected.replace("NAME", n) for n in names[:3])
    consts = " ".join(f"--const {n}=VALUE" for n in names)
    return CalibrationError(f"{subject} no data in {folder}: expected {wanted}, found none (give {consts})")

