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
  `quantscan.bisect` is the bisection state-machine module).
"""

__version__ = "0.1.0"

from quantscan.compare import compare  # noqa: E402
from quantscan.compat import check  # noqa: E402
from quantscan.extract import extract  # noqa: E402
from quantscan.gain import run_bisect  # noqa: E402
from quantscan.rewrite import rewrite  # noqa: E402
from quantscan.scan import ScanResult, scan  # noqa: E402  (binds the function over the package name)

__all__ = ["ScanResult", "__version__", "check", "compare", "extract", "rewrite", "run_bisect", "scan"]
