"""`bisect --menu` on a real model: the front's sizes and figures, and the chosen point's exported models
re-run by onnxruntime on the same held-out samples (issue 43 parts 3 and 5).

Prints the front (weight bytes as a share of all-float fp16, sites per precision, searched / held-out
figure) and, for `menu_weights_qdq.onnx` and `menu_matmulnbits.onnx`, the pooled cosine of every output
(worst counts, as the headline's) on the even (searched) and odd (held-out) samples beside the claim.
Run: python benchmarks/menu_front.py MODEL CALIB --scheme S [--profile P] [--target-cosine X] [--limit N]
      [--out DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from _common import markdown_table

from quantscan.bisect.menu_run import run_menu, write_menu
from quantscan.bisect.state import Target
from quantscan.calib import load_calibration
from quantscan.model import graph_inputs, read_model_file
from quantscan.scanning.prepare import prepare_scan


def worst_cosine(model: str, other: Path, feeds: list[dict[str, np.ndarray]]) -> float:
    """min over outputs of the pooled cosine Σxy / sqrt(Σx² Σy²), both run at ORT_ENABLE_BASIC."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.intra_op_num_threads = 1
    a = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(other), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in a.get_outputs()]
    sums = {n: np.zeros(3) for n in names}
    for feed in feeds:
        for n, x, y in zip(names, a.run(None, feed), b.run(None, feed), strict=True):
            x64, y64 = x.astype(np.float64), y.astype(np.float64)
            sums[n] += [(x64 * y64).sum(), (x64 * x64).sum(), (y64 * y64).sum()]
    return min(float(s[0] / np.sqrt(s[1] * s[2])) for s in sums.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("model")
    p.add_argument("calib")
    p.add_argument("--scheme", required=True)
    p.add_argument("--profile", default=None)
    p.add_argument("--target-cosine", type=float, default=0.999)
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--out", default="reports/menu_front")
    args = p.parse_args()
    started = time.perf_counter()
    ctx = prepare_scan(args.model, args.calib, scheme=args.scheme, profile=args.profile, limit=args.limit, threads=1)
    result = run_menu(ctx, Target("cosine", args.target_cosine))
    out = Path(args.out)
    write_menu(result, ctx, out, ["qdq-blocked", "matmulnbits"])
    all_float = next(pt.bytes for pt in result.points if pt.how == "all float")
    precisions = result.menu.precisions
    rows = [[str(pt.bytes), f"{pt.bytes / all_float:.3f}", " ".join(f"{k}={v}" for k, v in pt.counts(precisions).items()
                                                                    if v),
             f"{pt.value:.6f}", f"{pt.held_value:.6f}", "chosen" if pt is result.chosen else ""] for pt in result.front]
    print(f"{args.model}: scheme {result.scheme}, menu {'/'.join(result.menu.precisions)} "
          f"(int4 group {result.menu.int4_group}), {len(result.sites)} weighted sites, {len(result.points)} "
          f"evaluations, search {result.seconds} s, total {time.perf_counter() - started:.1f} s")
    print(markdown_table(["weight bytes", "of fp16", "sites", "cosine searched", "cosine held out", ""], rows))
    if result.chosen is None:
        print(f"no front point meets cosine >= {args.target_cosine} held out")
        return
    feeds = list(load_calibration(args.calib, graph_inputs(read_model_file(args.model)), limit=args.limit).samples())
    checks = []
    for name in ("menu_weights_qdq.onnx", "menu_matmulnbits.onnx"):
        searched = worst_cosine(args.model, out / name, feeds[0::2])
        held = worst_cosine(args.model, out / name, feeds[1::2])
        claimed = result.chosen.held_value or 0.0
        diff = max(abs(searched - result.chosen.value), abs(held - claimed))
        checks.append([name, f"{searched:.7f}", f"{result.chosen.value:.7f}", f"{held:.7f}", f"{claimed:.7f}",
                       f"{diff:.1e}"])
    print(markdown_table(["export", "searched (ORT)", "claimed", "held out (ORT)", "claimed", "max |diff|"], checks))


if __name__ == "__main__":
    main()
