"""`quantscan bisect`: which sites to keep above int8 so the output meets a target.

One job per module:

- `state`: the search as a pure, replayable state machine (no onnxruntime, onnx or pandas);
- `session`: the resumable session file (identities, options, events) and `describe` for `--show`;
- `request`: the typed `BisectRequest` (and `BisectHooks`) a session stores and gives back on resume;
- `driver`: `bisect_model(model, calib, request, scan, hooks)`, request in, plan out; `search` runs the
  gains, the session and the rounds, `finish` builds the plan;
- `judge`, `judges`: the one `Judge` protocol and its registry (`simulated`: quantscan's simulation,
  `external`: a vendor toolchain's builds);
- `plan`: the typed `records.Plan` built from a finished search, and plan.json/plan.csv/gain.csv;
- `exports`: the plan in the formats vendor toolchains read (onnxruntime, TIDL and the chips here; RKNN, Horizon,
  TPU-MLIR from their folders in toolchains/, through `toolchains.TOOLCHAINS`);

The mixed-precision models are `quantscan.graph.mixed`, the output gain of every site
`quantscan.scanning.gain`; the public entry point (which also updates a scan's summary.md) is
`quantscan.api.run_bisect`.

The driver needs onnxruntime, onnx and pandas, so `BisectResult` is loaded on
first use: reading a session (`bisect --show`) or importing the state machine loads none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from quantscan.bisect.session import BisectSession, calibration_identity, describe, machine_for
from quantscan.bisect.state import Bisector, Outcome, SessionFileError, Step, Target

if TYPE_CHECKING:
    from quantscan.bisect.finish import BisectResult

_LAZY = {"BisectResult": "quantscan.bisect.finish"}

__all__ = [
    "BisectResult",
    "Bisector",
    "Outcome",
    "BisectSession",
    "SessionFileError",
    "Step",
    "Target",
    "calibration_identity",
    "describe",
    "machine_for",
]


def __getattr__(name: str) -> Any:
    """`BisectResult` comes from the driver, imported on first use (see above)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
