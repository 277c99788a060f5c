"""Where `quantscan dumps` places a planted fault, on real vendor dumps (issue 28's goals).

For one model, its calibration folder and a dump folder (e.g. RKNN accuracy_analysis folders, recorded
with tests/fixtures/device/record_rknn.py): how many quantization sites the dumps align on, how many
sites depart with the dumps unmodified (false departures), and for every measured site (or `--sites N`
drawn at random) and each fault kind of `quantscan.device.faults` planted from that site on, whether
`first_departure` is exactly that site, a later one, an earlier one, or none.

Run: python benchmarks/device_faults.py MODEL CALIB DUMPS [--sites N] [--seed S]
Prints one markdown table and the misses.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from quantscan.device import compare_with, simulate
from quantscan.device.dumps import open_dumps
from quantscan.device.faults import KINDS, planted


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("calib")
    p.add_argument("dumps")
    p.add_argument("--sites", type=int, default=0, help="sites drawn at random (0: every measured site)")
    p.add_argument("--seed", type=int, default=28)
    args = p.parse_args()
    t0 = time.perf_counter()
    simulation = simulate(args.model, args.calib)
    dumps = open_dumps(args.dumps)
    clean = compare_with(simulation, dumps)
    table = clean.table
    measured = table[table["dump"] != ""].reset_index(drop=True)
    picks = range(len(measured))
    if args.sites:
        picks = sorted(np.random.default_rng(args.seed).choice(len(measured), args.sites, replace=False))
    counts = {k: {"exact": 0, "later": 0, "earlier": 0, "none": 0} for k in KINDS}
    misses = []
    for i in picks:
        site = measured.iloc[i]
        later = set(measured[measured["order"] >= site["order"]]["dump"])
        for kind in KINDS:
            got = compare_with(simulation, planted(dumps, later, kind)).table
            first = got[got["first_departure"].astype(bool)]
            where = ("none" if first.empty else "exact" if first["tensor"].iloc[0] == site["tensor"]
                     else "later" if first["order"].iloc[0] > site["order"] else "earlier")
            counts[kind][where] += 1
            if where != "exact":
                misses.append(f"{kind} at {site['node']} ({site['tensor']}): {where}"
                              + ("" if first.empty else f" ({first['node'].iloc[0]})"))
    departs = int((table["verdict"] == "departs").sum())
    print(f"{args.model}: {dumps.format} dumps of {len(dumps.keys)} samples, {clean.aligned_sites}/{clean.sites} "
          f"sites aligned ({100 * clean.aligned_sites / clean.sites:.1f}%), {departs} departing unmodified; "
          f"{len(picks)} sites x {len(KINDS)} faults in {time.perf_counter() - t0:.0f} s")
    print()
    print("| fault | sites | located exactly | later | earlier | not found |")
    print("|---|---|---|---|---|---|")
    for kind, c in counts.items():
        print(f"| {kind} | {sum(c.values())} | {c['exact']} | {c['later']} | {c['earlier']} | {c['none']} |")
    for miss in misses:
        print(f"- {miss}")


if __name__ == "__main__":
    main()
