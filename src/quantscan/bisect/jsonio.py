"""The one JSON helper of the bisect package: session file, plan.json and the JSON exports.

Why one: the session, the plan and the exports each had their own "make it JSON-safe" and dump
settings, and they drifted (one cleaned only the gain rows' floats, another also numpy scalars).
Here every file is standard JSON (NaN/inf stored as the strings "nan"/"inf", which `float()` reads
back), indented by one, ending in a newline, and written atomically through `quantscan.runfolder`.
Standard library only, so the session file stays free of numpy/pandas.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quantscan.runfolder import atomic_write_text


def to_jsonable(value: Any) -> Any:
    """`value` with paths as strings, tuples/sets as lists, numpy scalars as Python numbers, and
    non-finite floats as strings (JSON has no NaN/inf)."""
    if isinstance(value, (str, bool)) or value is None:
        return value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else str(number)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """Standard JSON text of `value` (see :func:`to_jsonable`), one-space indent, trailing newline."""
    return json.dumps(to_jsonable(value), indent=1, allow_nan=False) + "\n"


def write_json(path: Path, value: Any) -> Path:
    """Write :func:`dumps` of `value` to `path` atomically (a kill leaves the old file or the new)."""
    atomic_write_text(path, dumps(value))
    return path
