"""The scan: which quantization sites of a model lose precision in int8, measured in three passes.

- `options`: the knobs (named as the CLI flags) and the progress hook;
- `prepare`: load, prepare, probe (pass 0), find the sites, apply a chip profile -> `ScanContext`;
- `calibrate`: ranges (pass 1) -> the quantization plan;
- `evaluate`: the analysis pass (pass 2): accumulators, output metrics, the headline;
- `tables`: the layers/tensors/ops/channels tables, each site's cause, the rank, the profile merge;
- `run`: `scan()` end to end, returning a `ScanResult` that writes the run folder on `save(out)`.

Note: `quantscan.scan` at the package top is the `scan` function (the public API), which shadows
this package as an attribute; import submodules by their full path (`from quantscan.scan.prepare
import ...`), which goes through sys.modules and always works.
"""

from quantscan.scan.run import ScanResult, scan

__all__ = ["ScanResult", "scan"]
