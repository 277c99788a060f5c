"""The sensitivity scan: which quantization sites of a model lose precision in int8, measured in three passes.

- `options`: the knobs (named as the CLI flags) and the progress hook;
- `prepare`: load, prepare, probe (pass 0), find the sites, apply a chip profile -> `ScanContext`;
- `calibrate`: ranges (pass 1) -> the quantization plan;
- `evaluate`: the analysis pass (pass 2): accumulators, output metrics, the headline;
- `tables`: the layers/tensors/ops/channels tables, each site's cause, the rank, the profile merge;
- `run`: `measure()` end to end, returning a `ScanResult`; `quantscan.api` writes its run folder.

Why `scanning` and not `scan`: `quantscan.scan` is the public function (the contract's Python API),
and Python binds a subpackage as an attribute of its parent when it is first imported, so a `scan/`
package would replace the function with a module the first time anything imported one of its files.
"""

from quantscan.scanning.run import ScanResult, measure

__all__ = ["ScanResult", "measure"]
