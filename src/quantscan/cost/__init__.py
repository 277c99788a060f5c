"""Estimated board time: per kernel, per precision boundary and per plan, from a profile's `[cost]` table.

Pure: graph logic and arithmetic, no onnxruntime (`runner.py` measures; `benchmarks/cost_fit.py`
fits the figures to published latencies and says how well they fit).
"""

from quantscan.cost.estimate import BoundaryCost, CostEstimate, Pricer, SiteCost, estimate
from quantscan.cost.kernels import Kernel, find_kernels
from quantscan.cost.roofline import KernelTime, kernel_time
from quantscan.cost.table import CostTable

__all__ = [
    "BoundaryCost", "CostEstimate", "CostTable", "Kernel", "KernelTime", "Pricer", "SiteCost", "estimate",
    "find_kernels", "kernel_time",
]
