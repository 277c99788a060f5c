"""Vendor conversion logs read into quantscan's findings (`quantscan log FILE [--model M]`).

One parser per tool (`rknn.py`: RKNN-Toolkit2 2.x; `horizon.py`: hb_mapper; `tpumlir.py`: tpu-mlir), one shared shape
(`parsed.py`), one name mapping back to ONNX (`mapping.py`) and one finding builder
(`findings.py`) that writes `check`'s own `Finding` records. `read.py` ties them together.
"""

from quantscan.vendorlog.parsed import Failure, LayerSimilarity, ParsedLog, Stage, VendorLayer
from quantscan.vendorlog.read import LogReading, read_log
from quantscan.vendorlog.rknn import parse_accuracy_analysis

__all__ = ["Failure", "LayerSimilarity", "LogReading", "ParsedLog", "Stage", "VendorLayer",
           "parse_accuracy_analysis", "read_log"]
