"""Cell formatting shared by the page and its plots: numbers for people, escaping, numeric columns.

Run-folder tables come back from CSV with strings, empty cells and infinities mixed in; these
helpers are the one place that decides how each shows (NaN as an en dash, inf as inf).
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def num(value: Any) -> float:
    """A cell as float; NaN for anything that is not a number (empty, text)."""
    if isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def fmt(value: Any, spec: str = ".4g") -> str:
    """Numbers for people: NaN/empty as an en dash, infinities as inf, else `spec`."""
    if value is None:
        return "–"
    if isinstance(value, str):
        return value
    f = num(value)
    if math.isnan(f):
        return "–"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    return format(f, spec)


def truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def col(frame: pd.DataFrame, name: str) -> np.ndarray:
    """A numeric column as float64 (NaN where missing or not numeric); all-NaN when absent."""
    if name not in frame:
        return np.full(len(frame), np.nan)
    return pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=np.float64)


def is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def short(name: str, limit: int = 24) -> str:
    """Long exported names (`F0::If_0_then_branch__Inline_0__/stft/Conv`) keep their informative tail."""
    return name if len(name) <= limit else "…" + name[-(limit - 1) :]


def metric_value(value: Any, metric: str) -> float:
    """plan.json metric values may be a number or a {metric: value} mapping."""
    if isinstance(value, Mapping):
        return num(value.get(metric, value.get("value")))
    return num(value)
