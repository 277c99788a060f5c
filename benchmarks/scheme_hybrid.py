"""Does `scheme_weight_bits_gain` rank the layers that need 8-bit weights? (RKLLM's hybrid_rate question)

Scan MODEL under a w4 scheme (layers.csv from `quantscan MODEL --calib DIR --scheme w4af-g128`: the ranking
comes from the first `--gain-samples` evaluation samples, 8 by default), then keep the top 10% of the
weighted sites at int8 and measure the output cosine on the samples after those (held out), beside all-w4,
all-w8, the bottom 10% and random 10% (mean of 3 draws): the share of the w4 loss each recovers.
Run: python benchmarks/scheme_hybrid.py MODEL CALIB LAYERS_CSV [--scheme w4af-g128] [--ranked-on 8]
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import pandas as pd

from quantscan import graph as qgraph
from quantscan.scanning import scheme_gain as sg
from quantscan.scanning.prepare import prepare_scan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("calib")
    parser.add_argument("layers")
    parser.add_argument("--scheme", default="w4af-g128")
    parser.add_argument("--ranked-on", type=int, default=8, help="samples the ranking was measured on")
    args = parser.parse_args()
    ctx = prepare_scan(args.model, args.calib, scheme=args.scheme)
    ranked = pd.read_csv(args.layers).dropna(subset=[sg.WEIGHT_GAIN]).sort_values(sg.WEIGHT_GAIN, ascending=False)
    by_node = {s.node: s for s in ctx.graph.sites}
    prepared = ctx.graph.prepared.proto
    feeds = list(sg.first_samples(ctx.data.eval_set, ctx.data.batch_size, 0))
    feeds = feeds[math.ceil(args.ranked_on / ctx.data.batch_size):]
    outputs = ctx.headline_outputs()
    reference = sg.run_outputs(ctx.runner, prepared, feeds, outputs)

    def cosine_with_int8(nodes: list[str]) -> float:
        plan = ctx.quant.plan
        for node in nodes:
            plan = sg.with_int8_weight(prepared, plan, by_node[node], ctx.chip.per_channel_weights)
        model = qgraph.build_qdq_model(prepared, ctx.graph.sites, plan)
        return sg.headline_cosine(reference, sg.run_outputs(ctx.runner, model, feeds, outputs))

    k = max(1, round(0.1 * len(ranked)))
    nodes = list(ranked["node"])
    w4, w8 = cosine_with_int8([]), cosine_with_int8(nodes)
    rng = np.random.default_rng(0)
    rows = {"top": cosine_with_int8(nodes[:k]), "bottom": cosine_with_int8(nodes[-k:]),
            "random": float(np.mean([cosine_with_int8(list(rng.choice(nodes, k, replace=False))) for _ in range(3)]))}
    print(f"{len(nodes)} weighted sites, {k} kept at int8, {sum(sg.sample_count(f) for f in feeds)} held-out samples")
    print(f"all w4 {w4:.5f}, all w8 {w8:.5f}")
    for name, cos in rows.items():
        print(f"{name} {k}: {cos:.5f}, {(cos - w4) / (w8 - w4):.1%} of the w4 loss recovered")


if __name__ == "__main__":
    main()
