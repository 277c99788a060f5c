"""The prefix kit's dumps bar: where `quantscan dumps --prefixes` places a fault planted in one compiled kernel.

For one model and its calibration folder: the kit (`extract --prefixes --every K`), every prefix compiled
and run by onnxruntime (quantize_static QDQ, per-channel int8 weights: another toolchain's calibration and
rounding than quantscan's; tests/extract/prefix_board.py), then for each prefix's end kernel (or `--sites
N` of them) that kernel's conv weights doubled in every prefix holding it (a wrong weight scale): is the
first departure exactly that kernel, a later one, an earlier one, or none. Also the clean board's false
departures.

Run: python benchmarks/prefix_faults.py MODEL CALIB [--every K] [--samples S] [--sites N]
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "extract"))  # the onnxruntime "board" of the tests

from prefix_board import run_board  # noqa: E402

from quantscan.device import compare_with, simulate  # noqa: E402
from quantscan.prefixes import board_dumps, write_kit  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("calib")
    p.add_argument("--every", type=int, default=1)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--sites", type=int, default=0, help="end kernels drawn at random (0: every Conv-led one)")
    p.add_argument("--seed", type=int, default=44)
    args = p.parse_args()
    logging.disable(logging.WARNING)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        kit = write_kit(args.model, work / "kit", every=args.every, calib=args.calib, samples=args.samples)
        simulation = simulate(args.model, args.calib)
        clean = compare_with(simulation, board_dumps(kit, run_board(kit.folder, work / "clean", work / "w")))
        measured = set(clean.table[clean.table["dump"] != ""]["tensor"])
        candidates = [q for q in kit.prefixes if q.tensor in measured and q.kernel.split("+")[0] in ("Conv", "Gemm")]
        if args.sites:
            rng = np.random.default_rng(args.seed)
            candidates = [candidates[i] for i in sorted(rng.choice(len(candidates), args.sites, replace=False))]
        counts = {"exact": 0, "later": 0, "earlier": 0, "none": 0}
        misses = []
        order = dict(zip(clean.table["tensor"], clean.table["order"], strict=True))
        for i, target in enumerate(candidates):
            board = run_board(kit.folder, work / f"f{i}", work / f"w{i}", target.node, lambda w: w * np.float32(2))
            table = compare_with(simulation, board_dumps(kit, board)).table
            first = table[table["first_departure"].astype(bool)]
            where = ("none" if first.empty else "exact" if first["tensor"].iloc[0] == target.tensor
                     else "later" if first["order"].iloc[0] > order[target.tensor] else "earlier")
            counts[where] += 1
            if where != "exact":
                misses.append(f"{target.node} ({target.tensor}): {where}")
        departs = int((clean.table["verdict"] == "departs").sum())
    print(f"{args.model}: {len(kit.prefixes)} prefixes of {kit.kernels} kernels (every {args.every}), "
          f"{args.samples} samples; {len(measured)} aligned, {departs} departing on the clean board; "
          f"{len(candidates)} faults in {time.perf_counter() - t0:.0f} s")
    print()
    print("| fault | sites | located exactly | later | earlier | not found |")
    print("|---|---|---|---|---|---|")
    print(f"| conv weights x2 | {len(candidates)} | {counts['exact']} | {counts['later']} | {counts['earlier']} | "
          f"{counts['none']} |")
    for miss in misses:
        print(f"- {miss}")


if __name__ == "__main__":
    main()
