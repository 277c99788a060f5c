"""quantscan: which layers of an ONNX model lose precision in int8, and which ops an NPU rejects.

The typed API mirrors the CLI: `scan(model, calib, **options) -> ScanResult` (DataFrames
`.layers`, `.tensors`, `.ops`, `.output_metrics`); files are written only when `out=` is given.
"""

__version__ = "0.1.0"

from quantscan.analyze import ScanResult, scan  # noqa: E402

__all__ = ["ScanResult", "__version__", "scan"]
