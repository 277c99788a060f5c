"""Issue 43 on the decoder LM: does `scheme_weight_bits_gain` rank the sites whose weights need int8?

The goal: keeping the top 10% of sites at int8 weights (the rest w4) recovers at least half of the w4 loss
in next-token agreement with FP32, measured on decode steps the ranking never saw. Ranking: layers.csv
from a scan on RANKING steps: `quantscan char_gpt_step.onnx --calib CALIB --eval RANKING --scheme
w4af-g32 --gain-samples 0 --task lm`, with `--state present.N=past.N` (N = 0..3) for the stateful gain
(each variant carries its own cache through the RANKING stream), without it for the per-step gain (each
step reads the FP32 cache its file holds). Held out: HELDOUT, disjoint steps of the same kind. Rows: all
w4, all int8 weights, top / bottom 10%, random 10% (seeded draws). With `--rank-by next_token` the sites
are instead ranked here by their own next-token gain on RANKING (each site alone at int8: agreement minus
all-w4's), the cheap task-level alternative to the cosine gain. `--pairs`: every pair of sites at int8,
measured on HELDOUT itself: the best pair is an upper bound on what any ranking's top 2 can recover there.
Every row is the QDQ model quantscan builds, run by its runner.
Data: benchmarks/zoo_export_lm.py `write_steps` over the held-out text (see RESULTS.md "decoder LM").
Run: python benchmarks/scheme_hybrid_lm.py MODEL CALIB RANKING HELDOUT LAYERS_CSV [--scheme w4af-g32] [--carry]
     [--pairs] [--curve N]
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
import pandas as pd

from quantscan import graph as qgraph
from quantscan.scanning import scheme_gain as sg
from quantscan.scanning.prepare import ScanContext, prepare_scan


def agreement(reference: np.ndarray, other: np.ndarray) -> float:
    """Share of steps whose argmax token matches FP32's (both [steps, vocab])."""
    return float(np.mean(reference.argmax(axis=1) == other.argmax(axis=1)))


CARRY = False
"""`--carry`: each model carries its own cache from step to step (the deployed decode), instead of every
step reading the FP32 stream's cache from its file; the first held-out step reads its file's."""


def run_logits(ctx: ScanContext, model: onnx.ModelProto, feeds: Sequence[Mapping[str, np.ndarray]],
               vocab: int) -> np.ndarray:
    """[steps, vocab] logits; with CARRY, present.N feeds the next step's past.N (feeds in stream order)."""
    if not CARRY:
        return sg.run_outputs(ctx.runner, model, feeds, ["logits"])["logits"].reshape(-1, vocab)
    session = ctx.runner.session(model, built=True)
    cache: dict[str, np.ndarray] = {}
    rows = []
    for step in feeds:
        names = [k.replace("past", "present") for k in step if k.startswith("past.")]
        out = session.run({**step, **cache}, ["logits", *names])
        cache = {k.replace("present", "past"): out[k] for k in names}
        rows.append(np.asarray(out["logits"], np.float64).reshape(-1, vocab))
    return np.concatenate(rows)


def logits_with_int8(ctx: ScanContext, feeds: Sequence[Mapping[str, np.ndarray]], nodes: Sequence[str],
                     vocab: int) -> np.ndarray:
    """[steps, vocab] logits of the scheme's QDQ model with `nodes`' weights at int8 (float model if None)."""
    prepared = ctx.graph.prepared.proto
    by_node = {s.node: s for s in ctx.graph.sites}
    plan = ctx.quant.plan
    for node in nodes:
        plan = sg.with_int8_weight(prepared, plan, by_node[node], ctx.chip.per_channel_weights)
    return run_logits(ctx, qgraph.build_qdq_model(prepared, ctx.graph.sites, plan), feeds, vocab)


def fp32_logits(ctx: ScanContext, feeds: Sequence[Mapping[str, np.ndarray]], vocab: int) -> np.ndarray:
    return run_logits(ctx, ctx.graph.prepared.proto, feeds, vocab)


def next_token_ranking(ctx: ScanContext, nodes: Sequence[str], vocab: int) -> list[str]:
    """Sites ordered by their alone-at-int8 agreement gain on ctx's eval set (ties: cosine order kept)."""
    feeds = list(sg.first_samples(ctx.data.eval_set, ctx.data.batch_size, 0))
    ref = fp32_logits(ctx, feeds, vocab)
    base = agreement(ref, logits_with_int8(ctx, feeds, [], vocab))
    gains = {n: agreement(ref, logits_with_int8(ctx, feeds, [n], vocab)) - base for n in nodes}
    for n in nodes:
        print(f"  next-token gain {n}: {gains[n]:+.4f}")
    return sorted(nodes, key=lambda n: -gains[n])


def best_pairs(measure: Callable[[list[str]], tuple[float, float]], nodes: list[str]) -> None:
    """Every pair of sites at int8 on the held-out steps: the best five and how many recover half."""
    w4, w8 = measure([])[0], measure(nodes)[0]
    shares = {(a, b): (measure([a, b])[0] - w4) / (w8 - w4) for a, b in itertools.combinations(nodes, 2)}
    ranked = sorted(shares.items(), key=lambda kv: -kv[1])
    print(f"every pair ({len(shares)}): best", "; ".join(f"{a} + {b}: {v:.0%}" for (a, b), v in ranked[:5]),
          f"| mean {np.mean(list(shares.values())):.0%}, {sum(v >= 0.5 for v in shares.values())} recover half")


def table(measure: Callable[[list[str]], tuple[float, float]], nodes: list[str], k: int, draws: int,
          curve_length: int = 0) -> None:
    """Print agreement / cosine and the share of the w4 agreement loss each row recovers."""
    w4, w8 = measure([]), measure(nodes)
    rng = np.random.default_rng(0)
    randoms = [measure(list(rng.choice(nodes, k, replace=False))) for _ in range(draws)]
    rows = {"all w4": w4, f"top {k}": measure(nodes[:k]), f"bottom {k}": measure(nodes[-k:]),
            f"random {k} (mean of {draws})": (float(np.mean([r[0] for r in randoms])),
                                              float(np.mean([r[1] for r in randoms]))),
            "all int8 weights": w8}
    print("| row | next_token_agreement | cosine | share of the w4 agreement loss recovered |")
    print("|---|---|---|---|")
    for name, (agree, cos) in rows.items():
        share = (agree - w4[0]) / (w8[0] - w4[0]) if w8[0] != w4[0] else float("nan")
        print(f"| {name} | {agree:.4f} | {cos:.5f} | {share:.0%} |")
    print("random draws (agreement):", ", ".join(f"{r[0]:.4f}" for r in randoms))
    curve = [measure(nodes[:n])[0] for n in range(1, min(len(nodes), curve_length or 3 * k) + 1)]
    print("top n at int8, n = 1..: agreement", ", ".join(f"{a:.4f}" for a in curve), "; share recovered",
          ", ".join(f"{(a - w4[0]) / (w8[0] - w4[0]):.0%}" for a in curve))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("model", "calib", "ranking", "heldout", "layers"):
        parser.add_argument(name)
    parser.add_argument("--scheme", default="w4af-g32")
    parser.add_argument("--share", type=float, default=0.1, help="share of the weighted sites kept at int8")
    parser.add_argument("--draws", type=int, default=5, help="random draws (seed 0)")
    parser.add_argument("--rank-by", choices=("cosine", "next_token"), default="cosine")
    parser.add_argument("--carry", action="store_true", help="each model carries its own cache (see CARRY)")
    parser.add_argument("--pairs", action="store_true", help="also measure every pair of sites (see best_pairs)")
    parser.add_argument("--curve", type=int, default=0, help="top n at int8 for n = 1..N (default 3 x the share)")
    args = parser.parse_args()
    global CARRY
    CARRY = args.carry
    held = prepare_scan(args.model, args.calib, eval=args.heldout, scheme=args.scheme)
    logits = next(o for o in onnx.load(args.model).graph.output if o.name == "logits")
    vocab = int(logits.type.tensor_type.shape.dim[-1].dim_value)
    ranked = pd.read_csv(args.layers).dropna(subset=[sg.WEIGHT_GAIN]).sort_values(sg.WEIGHT_GAIN, ascending=False)
    nodes = list(ranked["node"])
    if args.rank_by == "next_token":
        nodes = next_token_ranking(prepare_scan(args.model, args.calib, eval=args.ranking, scheme=args.scheme),
                                   nodes, vocab)
    feeds = list(sg.first_samples(held.data.eval_set, held.data.batch_size, 0))
    reference = fp32_logits(held, feeds, vocab)

    def measure(kept: list[str]) -> tuple[float, float]:
        got = logits_with_int8(held, feeds, kept, vocab)
        return agreement(reference, got), sg.headline_cosine({"l": reference.ravel()}, {"l": got.ravel()})

    k = max(1, round(args.share * len(nodes)))
    print(f"{len(nodes)} weighted sites ranked by {args.rank_by} gain, {k} kept at int8: {nodes[:k]}; "
          f"{len(reference)} held-out steps, scheme {args.scheme}, {'own' if CARRY else 'FP32'} cache")
    table(measure, nodes, k, args.draws, args.curve)
    if args.pairs:
        best_pairs(measure, nodes)


if __name__ == "__main__":
    main()
