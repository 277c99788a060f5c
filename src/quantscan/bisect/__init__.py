"""`quantscan bisect`: which sites to keep above int8 so the output meets a target.

One job per module:

- `state`: the search as a pure, replayable state machine (no onnxruntime, onnx or pandas);
- `session`: the resumable session file (identities, options, events) and `describe` for `--show`;
- `driver`: `run_bisect`, the evaluation loop that feeds measured values to the machine;
- `plan`: the typed `records.Plan` built from a finished search, and plan.json/plan.csv/gain.csv;
- `exports`: the plan in the formats vendor toolchains read (onnxruntime, RKNN, Horizon, TPU-MLIR, TIDL);

The output gain of every site (the mixed-precision gain graph) is `quantscan.gain`.

The driver needs onnxruntime, onnx and pandas, so `run_bisect` and `BisectResult` are loaded on
first use: reading a session (`bisect --show`) or importing the state machine loads none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quantscan.bisect.session import Session, calibration_identity, describe, machine_for
from quantscan.bisect.state import Bisector, Outcome, SessionFileError, Step, Target

if TYPE_CHECKING:
    from quantscan.bisect.driver import BisectResult, run_bisect

_LAZY = {"run_bisect": "quantscan.bisect.driver", "BisectResult": "quantscan.bisect.driver"}

__all__ = [
    "BisectResult",
    "Bisector",
    "Outcome",
    "Session",
    "SessionFileError",
    "Step",
    "Target",
    "calibration_identity",
    "describe",
    "machine_for",
    "run_bisect",
]


def __getattr__(name: str) -> Any:
    """`run_bisect` and `BisectResult` come from the driver, imported on first use (see above)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
