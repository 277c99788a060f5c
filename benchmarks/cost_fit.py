"""Fit the cost model's free figures to the RKNN Model Zoo's measured latencies, and say how well it fits.

    python benchmarks/cost_fit.py [--chip rk3588|rk3568|rk3576|all]

Reads benchmarks/cost_zoo_layers.json (per-kernel sizes, benchmarks/cost_zoo_layers.py) and the zoo's
FPS table below. Per chip, the datasheet figures stay as the profile gives them (clock, cores, MACs per
cycle, on-chip buffer); the free ones (`FREE`) are fitted on the FIT models only, by least squares on
log(estimated / measured); every other model is held out. Printed: the residual table (fit / held-out
rows marked), Spearman and the median ratio on the held-out rows, against the baseline of MACs times one
constant (fitted on the same rows), and the fitted figures to copy into the profile's [cost] table.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from scipy.optimize import minimize
from scipy.stats import spearmanr

from quantscan.compat.profiles import load_profile
from quantscan.cost.kernels import Kernel
from quantscan.cost.roofline import kernel_time
from quantscan.cost.table import CostTable

# airockchip/rknn_model_zoo README v2.3.2 (commit bad6c73), "Model performance benchmark (FPS)", inference
# only, max NPU frequency. Columns: RK3566/RK3568, RK3588 @single_core, RK3576 @single_core; dtype.
FPS: dict[str, tuple[float, float, float, str]] = {
    "mobilenetv2-12": (180.7, 450.7, 467.0, "int8"), "resnet50-v2-7": (37.9, 110.1, 99.0, "int8"),
    "yolov5s_relu": (25.5, 66.1, 65.0, "int8"), "yolov5n": (39.7, 82.5, 112.7, "int8"),
    "yolov5s": (19.3, 48.4, 57.5, "int8"), "yolov5m": (8.6, 20.9, 23.7, "int8"),
    "yolov6n": (48.8, 106.4, 109.1, "int8"), "yolov6s": (15.2, 36.4, 35.0, "int8"),
    "yolov6m": (7.2, 17.8, 17.4, "int8"), "yolov8n": (34.0, 73.5, 90.2, "int8"),
    "yolov8s": (15.1, 38.0, 40.8, "int8"), "yolov8m": (6.5, 16.2, 16.7, "int8"),
    "yolov8n-obb": (33.9, 74.0, 90.2, "int8"), "yolov10n": (20.7, 61.2, 80.2, "int8"),
    "yolov10s": (10.3, 33.8, 39.9, "int8"), "yolo11n": (20.6, 60.0, 77.9, "int8"),
    "yolo11s": (10.2, 33.0, 38.2, "int8"), "yolo11m": (4.6, 12.7, 14.6, "int8"),
    "yolov8n-pose": (22.6, 55.9, 66.8, "int8"), "yolov5n-seg": (32.2, 69.3, 88.3, "int8"),
    "yolov5s-seg": (15.0, 36.8, 41.6, "int8"), "yolov5m-seg": (6.8, 16.4, 18.0, "int8"),
    "yolov8n-seg": (27.8, 60.8, 71.1, "int8"), "yolov8s-seg": (11.7, 28.9, 30.8, "int8"),
    "yolov8m-seg": (5.2, 12.6, 12.7, "int8"), "ppocrv4_det": (22.1, 50.7, 64.3, "int8"),
    "ppocrv4_rec": (19.5, 73.9, 96.8, "fp16"),
}
CHIPS = {"rk3568": 0, "rk3588": 1, "rk3576": 2}
FIT = ("mobilenetv2-12", "resnet50-v2-7", "yolov5n", "yolov5s_relu", "yolov5m", "yolov8s", "yolov6s", "yolo11n")
"""Fitted on: two classifiers, the three yolov5 widths (one with ReLU), one each of v6/v8/11."""
NOT_SCORED = {"yolov6m": "ultralytics' yolov6.yaml at scale m has 80 GMAC; meituan's YOLOv6m has 43 (85.8 GFLOPs): "
                          "not the zoo's architecture"}
"""Rows printed but left out of the held-out figures, and why."""
FREE = {"compute_efficiency": (0.05, 1.0), "elementwise_per_cycle": (1, 256),
        "dram_gbps": (1, 34), "layer_overhead_us": (1, 200), "run_overhead_us": (10, 3000)}
"""The fitted figures and the physically plausible range each is searched in."""
STARTS = (
    {"compute_efficiency": 0.5, "elementwise_per_cycle": 8.0, "dram_gbps": 10.0,
     "layer_overhead_us": 30.0, "run_overhead_us": 300.0},
    {"compute_efficiency": 0.9, "elementwise_per_cycle": 8.0, "dram_gbps": 34.0,
     "layer_overhead_us": 27.0, "run_overhead_us": 10.0},
    {"compute_efficiency": 0.3, "elementwise_per_cycle": 30.0, "dram_gbps": 5.0,
     "layer_overhead_us": 10.0, "run_overhead_us": 1000.0},
)
"""Where the search starts, for every chip (not the profile's current figures: a rerun gives the same fit);
Powell stops in local minima, so the best of these starts (loss on the FIT rows) is kept."""
LAYERS = Path(__file__).with_name("cost_zoo_layers.json")


def load_kernels() -> dict[str, list[Kernel]]:
    doc = json.loads(LAYERS.read_text(encoding="utf-8"))
    fields = doc["fields"]
    return {name: [Kernel.from_json(dict(zip(fields, row, strict=True))) for row in m["kernels"]]
            for name, m in doc["models"].items()}


def model_ms(kernels: list[Kernel], precision: str, table: CostTable) -> float:
    return table.run_overhead_us * 1e-3 + sum(kernel_time(k, precision, "npu", table).est_ms for k in kernels)


ALIGNS = (8, 16, 32)
"""channel_align is picked among these by the loss on the FIT rows (each with its own fit)."""


def fit(table: CostTable, models: dict[str, list[Kernel]], measured: dict[str, float],
        precision: dict[str, str]) -> CostTable:
    """The best of `fit_free` over ALIGNS and STARTS, judged on the FIT rows only."""
    fits = [fit_free(aligned(table, a), models, measured, precision, start)
            for a in ALIGNS for start in STARTS]
    return min(fits, key=lambda t: fit_loss(t, models, measured, precision))


def aligned(table: CostTable, align: int) -> CostTable:
    """The table at one channel alignment. A depthwise Conv has one input channel per group, so it fills one of
    the array's `align` input-channel lanes: its efficiency is 1/align, set by the array's shape, not fitted.
    (Fitted freely it sat on its bound, 1.0, on rk3588 and rk3576: the classifiers' overhead absorbed it.)"""
    return table.with_figures(channel_align=align, depthwise_efficiency=1.0 / align)


def fit_loss(table: CostTable, models: dict[str, list[Kernel]], measured: dict[str, float],
             precision: dict[str, str]) -> float:
    return sum(math.log(model_ms(models[m], precision[m], table) / measured[m]) ** 2 for m in FIT)


def fit_free(table: CostTable, models: dict[str, list[Kernel]], measured: dict[str, float],
             precision: dict[str, str], start_at: dict[str, float]) -> CostTable:
    """Least squares on log ratios over FIT, the free figures searched in log space within their ranges."""
    bounds = [(math.log(lo), math.log(hi)) for lo, hi in FREE.values()]
    start = np.log([start_at[k] for k in FREE])

    def loss(x: np.ndarray) -> float:
        return fit_loss(table.with_figures(**dict(zip(FREE, np.exp(x), strict=True))), models, measured, precision)

    best = minimize(loss, start, method="Powell", bounds=bounds, options={"maxiter": 20000, "xtol": 1e-4})
    return table.with_figures(**dict(zip(FREE, np.exp(best.x), strict=True)))


def summary(rows: list[tuple[str, float, float]]) -> tuple[float, float]:
    """(Spearman, median ratio as a factor >= 1) of (name, estimated, measured) rows."""
    est, meas = np.array([r[1] for r in rows]), np.array([r[2] for r in rows])
    rho = float(spearmanr(est, meas).statistic)
    return rho, float(np.exp(np.median(np.abs(np.log(est / meas)))))


def run_chip(chip: str, models: dict[str, list[Kernel]], macs: dict[str, int]) -> None:
    col = CHIPS[chip]
    table = CostTable.of(load_profile(chip))
    names = [m for m in FPS if m in models]
    measured = {m: 1000.0 / float(FPS[m][col]) for m in names}
    precision = {m: FPS[m][3] for m in names}
    fitted = fit(table, models, measured, precision)
    # baseline: MACs x one constant, the constant fitted on the same rows (geometric mean of ratios)
    per_mac = math.exp(np.mean([math.log(measured[m] / macs[m]) for m in FIT]))
    print(f"\n## {chip} ({['RK3566/RK3568', 'RK3588 single core', 'RK3576 single core'][col]})\n")
    print("| model | set | GMAC | measured ms | estimated ms | est/meas | MACs x c est/meas |")
    print("|---|---|---|---|---|---|---|")
    held, held_base = [], []
    for m in names:
        est = model_ms(models[m], precision[m], fitted)
        base = per_mac * macs[m]
        kind = "fit" if m in FIT else "not scored" if m in NOT_SCORED else "held-out"
        print(f"| {m} | {kind} | {macs[m] / 1e9:.2f} | {measured[m]:.2f} | {est:.2f} | {est / measured[m]:.2f} | "
              f"{base / measured[m]:.2f} |")
        if kind == "held-out":
            held.append((m, est, measured[m]))
            held_base.append((m, base, measured[m]))
    for m, why in NOT_SCORED.items():
        print(f"not scored: {m}: {why}")
    rho, ratio = summary(held)
    brho, bratio = summary(held_base)
    print(f"\nheld-out ({len(held)} models): Spearman {rho:.3f}, median |log(est/meas)| = log {ratio:.3f}"
          f"  | baseline MACs x c: Spearman {brho:.3f}, log {bratio:.3f}")
    if "yolov5s" in models and "yolov5s_relu" in models:
        silu = model_ms(models["yolov5s"], "int8", fitted) / model_ms(models["yolov5s_relu"], "int8", fitted)
        real = measured["yolov5s"] / measured["yolov5s_relu"]
        print(f"yolov5s SiLU / ReLU: estimated x{silu:.2f}, measured x{real:.2f}")
    print("fitted figures: " + ", ".join(f"{k} = {getattr(fitted, k):.4g}"
                                         for k in (*FREE, "channel_align", "depthwise_efficiency")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chip", default="all", choices=[*CHIPS, "all"])
    args = parser.parse_args()
    doc = json.loads(LAYERS.read_text(encoding="utf-8"))
    macs = {name: int(m["macs"]) for name, m in doc["models"].items()}
    models = load_kernels()
    for chip in CHIPS if args.chip == "all" else [args.chip]:
        run_chip(chip, models, macs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
