"""`--metric module:function`: a user's own named sums per batch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from quantscan.errors import UsageError
from quantscan.taskmetrics.base import add_sums

# --- plugins -----------------------------------------------------------------------------------------

MetricFunction = Callable[[np.ndarray, np.ndarray], Mapping[str, float]]


@dataclass
class PluginAccumulator:
    """`--metric module:function`: the function returns named sums per batch; results are those sums."""

    function: MetricFunction
    name: str
    kind: str = "plugin"
    _s: dict[str, float] = field(default_factory=dict)

    def update(self, ref: np.ndarray, test: np.ndarray, labels: Sequence[int | None] | None) -> None:
        got = self.function(np.asarray(ref), np.asarray(test))
        if not isinstance(got, Mapping) or not all(isinstance(k, str) for k in got):
            raise UsageError(f"--metric {self.name}: expected a dict of named sums, found {type(got).__name__}")
        add_sums(self._s, got)

    def merge(self, other: PluginAccumulator) -> None:
        add_sums(self._s, other._s)

    def sums(self) -> dict[str, float]:
        return dict(self._s)

    def results(self) -> dict[str, float]:
        return dict(self._s)


def load_plugin(spec: str) -> PluginAccumulator:
    """`module:function` → an accumulator; a bad spec is a usage error, not a traceback."""
    module_name, sep, func_name = spec.partition(":")
    if not sep or not module_name or not func_name:
        raise UsageError(f"--metric: expected module:function, found {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"--metric: cannot import module {module_name!r} ({exc})") from None
    function = getattr(module, func_name, None)
    if not callable(function):
        raise UsageError(f"--metric: expected a function {func_name!r} in {module_name}, found none")
    return PluginAccumulator(function, spec)
