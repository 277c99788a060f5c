"""Issue 32 part 1: does a held-out, rounding-robust plan land where it claims in RKNN, and which rounding
model predicts RKNN's per-sample spread?

Inputs: a bisect run folder's plan.json (made with `--profile rk3588 --limit N`) and a `quantscan vendor
rknn MODEL --calib DIR --target rk3588 --limit N --plan plan.json` run folder (its rknn/data samples,
rknn/sim_outputs.npz for all-int8 and rknn/hybrid/sim_outputs.npz for the plan). The FP32 reference is
recomputed here with onnxruntime on the vendor's own sample files.

Prints two markdown tables:
1. transfer: claimed cosine (held-out samples, quantscan's rounding), its interval, RKNN's pooled cosine of
   the plan on the same held-out samples and on all, |RKNN - claimed|, inside the interval or within 0.005;
2. rounding models: for each scale-jitter spread, the RMS over samples and realisations of (quantscan
   realisation r - realisation 0) per-sample cosine against the RMS of (RKNN - realisation 0), and the share
   of samples whose RKNN cosine lies inside the realisations' [min, max] (all-int8 and the plan).

Run: PYTHONPATH=src python benchmarks/plan_holdout.py MODEL CALIB --plan RUN/plan.json --vendor VENDOR_OUT
     [--limit 16] [--spreads 0.01,0.02,0.05] [--realisations 4]
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from quantscan.bisect.realise import RealisedEvaluator
from quantscan.bisect.robust import Rounding, Spread, sample_cosines, spread_of
from quantscan.bisect.state import Target
from quantscan.records import Plan
from quantscan.runfolder import parse_json
from quantscan.runner import Runner
from quantscan.scanning.gain import mixed_builder
from quantscan.scanning.prepare import ScanContext, prepare_scan

Sums = tuple[np.ndarray, np.ndarray, np.ndarray]


def vendor_sums(ctx: ScanContext, simulated: Path) -> Sums:
    """Per-sample (Σxy, Σx², Σy²) of RKNN's simulator against FP32 onnxruntime on the same samples
    (quantscan's loader, as `vendor` wrote them for the toolkit), worst output by pooled cosine."""
    session = Runner(threads=1).session(ctx.loaded.proto)
    got = dict(np.load(simulated))
    outputs: dict[int, list[tuple[float, float, float]]] = {}
    for i, feeds in enumerate(ctx.data.eval_set.samples()):
        ref = session.run(feeds)
        for k, o in enumerate(session.output_names):
            x = ref[o].reshape(-1).astype(np.float64)
            y = got[f"{i}:{k}"].reshape(-1).astype(np.float64)
            outputs.setdefault(k, []).append((float(x @ y), float(x @ x), float(y @ y)))
    candidates: list[Sums] = [(np.array([r[0] for r in rows]), np.array([r[1] for r in rows]),
                               np.array([r[2] for r in rows])) for rows in outputs.values()]
    return min(candidates, key=_pooled)


def _pooled(s: Sums) -> float:
    return float(s[0].sum() / math.sqrt(s[1].sum() * s[2].sum()))


def _take(s: Sums, idx: list[int]) -> Sums:
    return s[0][idx], s[1][idx], s[2][idx]


def quantscan_realisations(ctx: ScanContext, sites: list[str], spread: float, n: int) -> tuple[np.ndarray, Spread]:
    """[realisation, sample] cosines of quantscan's simulation with `sites` float, and the interval over
    realisations and all samples."""
    builder = mixed_builder(ctx)
    evaluator = RealisedEvaluator(ctx, builder, Target("cosine", 0.5), Rounding(n, spread, 0, holdout="none"))
    judged = evaluator.judge(builder.precisions(sites))
    sums = [m.sums[m.output] for m in judged.realisations]
    return np.vstack([sample_cosines(s) for s in sums]), spread_of(sums)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", type=Path)
    ap.add_argument("calib", type=Path)
    ap.add_argument("--plan", type=Path, required=True)
    ap.add_argument("--vendor", type=Path, required=True)
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--spreads", default="0.01,0.02,0.05")
    ap.add_argument("--realisations", type=int, default=4)
    args = ap.parse_args()
    plan = Plan.from_json(parse_json(args.plan.read_text(encoding="utf-8")))
    ctx = prepare_scan(args.model, args.calib, profile="rk3588", limit=args.limit, threads=1)
    int8 = vendor_sums(ctx, args.vendor / "rknn" / "sim_outputs.npz")
    hybrid = vendor_sums(ctx, args.vendor / "rknn" / "hybrid" / "sim_outputs.npz")
    held = list(range(1, int8[0].size, 2))
    claimed = (plan.achieved or {}).get("cosine", math.nan)
    interval = plan.interval or {}
    got = _pooled(_take(hybrid, held))
    inside = interval.get("low", math.inf) <= got <= interval.get("high", -math.inf)
    print("| model | float sites | claimed (held out) | interval | RKNN plan, held out | RKNN plan, all | "
          "RKNN all-int8, held out | abs(RKNN - claimed) | holds |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {args.model.stem} | {len(plan.sites)} | {claimed:.5f} | [{interval.get('low', math.nan):.5f}, "
          f"{interval.get('high', math.nan):.5f}] | {got:.5f} | {_pooled(hybrid):.5f} | "
          f"{_pooled(_take(int8, held)):.5f} | {abs(got - claimed):.5f} | "
          f"{'yes' if inside or abs(got - claimed) <= 0.005 else 'no'} |")
    print()
    print("| model | config | spread | RMS(qs_r - qs_0) | RMS(RKNN - qs_0) | RKNN inside [min, max] | "
          "qs interval (all samples) | RKNN pooled |")
    print("|---|---|---|---|---|---|---|---|")
    for config, sites, vendor in (("all-int8", [], int8), ("plan", [s.node for s in plan.sites], hybrid)):
        rk = sample_cosines(vendor)
        for spread in (float(v) for v in args.spreads.split(",")):
            qs, interval_all = quantscan_realisations(ctx, sites, spread, args.realisations)
            rms_model = float(np.sqrt(np.mean((qs[1:] - qs[0]) ** 2)))
            rms_rknn = float(np.sqrt(np.mean((rk - qs[0]) ** 2)))
            cover = float(np.mean((qs.min(0) <= rk) & (rk <= qs.max(0))))
            print(f"| {args.model.stem} | {config} | {spread} | {rms_model:.5f} | {rms_rknn:.5f} | {cover:.2f} | "
                  f"[{interval_all.low:.5f}, {interval_all.high:.5f}] | {_pooled(vendor):.5f} |")

if __name__ == "__main__":
    main()
