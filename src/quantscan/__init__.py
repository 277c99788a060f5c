"""quantscan: which layers of an ONNX model lose precision in int8, and which ops an NPU rejects.

The typed API mirrors the CLI, options named as the flags; files are written only when `out=` is
given:

- `scan(model, calib, **options) -> ScanResult` (DataFrames `.layers`, `.tensors`, `.ops`, and
  `.output_metrics`);
- `check(model, profiles) -> CheckResult` (`.findings`, `.partitions`);
- `rewrite(model, rewrite_ids, ...) -> RewriteReport` (with its numeric proof);
- `compare(a, b, calib) -> CompareResult`;
- `extract(model, node, context=K) -> ExtractResult`;
- `run_bisect(model, calib, target_cosine=X, ...) -> BisectResult` (named so because
  `quantscan.bisect` is the bisection package).
"""

from typing import TYPE_CHECKING, Any

from quantscan.version import __version__

if TYPE_CHECKING:
    from quantscan.api import run_bisect, scan
    from quantscan.compare import compare
    from quantscan.compat.check import check
    from quantscan.extract import extract
    from quantscan.rewrites.pipeline import rewrite
    from quantscan.scanning import ScanResult

_LAZY = {
    "ScanResult": "quantscan.scanning",
    "scan": "quantscan.api",
    "compare": "quantscan.compare",
    "check": "quantscan.compat.check",
    "extract": "quantscan.extract",
    "run_bisect": "quantscan.api",
    "rewrite": "quantscan.rewrites.pipeline",
}
"""Public name -> its module, imported on first use: `import quantscan.bisect.state` (or any pure
submodule) must not load onnxruntime, onnx and pandas through the package."""

__all__ = ["ScanResult", "__version__", "check", "compare", "extract", "rewrite", "run_bisect", "scan"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
