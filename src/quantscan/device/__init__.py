"""What the chip computed: per-layer dumps of a board or a vendor runtime beside FP32 and the simulation.

`compare_dumps(model, calib, dumps)` reads the dumps (one reader per format: `npy` here, a toolchain's in
its folder, `toolchains/<tool>/dumps.py`), lines their tensors up with quantscan's sites (`align`), runs
the FP32 model and quantscan's cumulative QDQ simulation on the same samples, and returns the device
table (`table`, device.csv).
"""

from quantscan.device.run import DeviceResult, Simulation, compare_dumps, compare_with, simulate

__all__ = ["DeviceResult", "Simulation", "compare_dumps", "compare_with", "simulate"]
