"""Speculative bisect rounds (issue 29 item 4): builds, rounds and wall for 1 and more workers.

Runs `quantscan bisect MODEL --calib DIR --workers W ...` once per W (each a fresh child process, the
extra flags passed as they are, e.g. `--evaluator rknn --vendor-python ~/venv-rknn/bin/python --profile
rk3588`), or reads run folders already made (`--read W=DIR`), and prints one row per W: evaluations (the
search's steps, the same for every W), toolchain builds (folders under the run's toolchain/), rounds
(one per evaluation with one worker), sets measured ahead and never asked for, search seconds, wall,
and wall and rounds against W=1. Also checks that every W found the same steps and plan.

    python benchmarks/speculate.py MODEL --calib DIR --workers 1 2 --out /tmp/spec -- --evaluator rknn ...
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def run(model: str, calib: str, workers: int, out: Path, extra: list[str]) -> float:
    """One bisect in a child process; its wall seconds."""
    cmd = [sys.executable, "-m", "quantscan", "bisect", model, "--calib", calib, "--workers", str(workers),
           "--out", str(out), "--quiet", *extra]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), check=False)
    wall = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"bisect --workers {workers} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return wall


def row(workers: int, out: Path, wall: float | None) -> dict[str, Any]:
    plan = json.loads((out / "plan.json").read_text())
    spec = plan.get("speculation") or {}
    builds = len(list((out / "toolchain").glob("eval-*"))) if (out / "toolchain").is_dir() else None
    return {"workers": workers, "evaluations": plan["evaluations"], "builds": builds,
            "rounds": spec.get("rounds", plan["evaluations"]), "unused": spec.get("unused", 0),
            "search_s": plan["search_seconds"], "wall_s": wall, "steps": [s["sites"] for s in plan["steps"]],
            "sites": [s["node"] for s in plan["sites"]], "achieved": plan["achieved"]}


def table(rows: list[dict[str, Any]]) -> str:
    base = rows[0]
    lines = ["| workers | evaluations | builds | rounds | unused | search s | wall s | rounds vs W=1 | wall vs W=1 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        wall = f"{r['wall_s']:.0f}" if r["wall_s"] is not None else "-"
        ratio = f"{r['wall_s'] / base['wall_s']:.2f}" if r["wall_s"] and base["wall_s"] else "-"
        lines.append(f"| {r['workers']} | {r['evaluations']} | {r['builds'] if r['builds'] is not None else '-'} | "
                     f"{r['rounds']} | {r['unused']} | {r['search_s']:.0f} | {wall} | "
                     f"{r['rounds'] / base['rounds']:.2f} | {ratio} |")
    return "\n".join(lines)


def replay(session_path: Path, widths: list[int]) -> str:
    """Rounds each W would take on a finished session's measured values, without measuring: the serial
    steps are the value table; a set the serial search never asked for (measured ahead, never fed) gets
    the verdict `unknown` (pass, then fail: the two bounds)."""
    from quantscan.bisect.session import BisectSession, machine_for
    from quantscan.bisect.speculate import Spare, SpeculativeFeed

    stored = BisectSession.load(session_path)
    values = {s.sites: s.value for s in stored.steps()}
    rows = ["| workers | steps | rounds (unasked sets pass) | rounds (unasked sets fail) | sets measured |",
            "|---|---|---|---|---|"]
    for width in widths:
        got = []
        for unknown in (float("inf"), float("-inf")):
            fresh = machine_for(BisectSession.from_json({**stored.to_json(), "events": [], "format": 1}, session_path))

            def measure(cands: Any, unknown: float = unknown) -> list[Any]:
                return [Spare(values.get(c.sites, unknown), {}, 0.0) for c in cands]

            feed = SpeculativeFeed(fresh, measure, width)
            while feed.machine.next() is not None:
                feed.round()
                list(feed.feed())
            assert [s.sites for s in feed.machine.steps] == [s.sites for s in stored.steps()]
            assert feed.counts is not None
            got.append((feed.counts.rounds, feed.counts.measured))
        rows.append(f"| {width} | {len(values)} | {got[0][0]} | {got[1][0]} | {got[0][1]}-{got[1][1]} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?")
    parser.add_argument("--calib")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path, default=Path("/tmp/speculate"))
    parser.add_argument("--read", nargs="+", default=[], metavar="W=DIR[:WALL]",
                        help="rows from run folders already made (WALL: their measured wall seconds)")
    parser.add_argument("--replay", type=Path, default=None, metavar="SESSION",
                        help="rounds per --workers W on a finished session's values (no measurement)")
    args, extra = parser.parse_known_args()
    extra = [e for e in extra if e != "--"]
    if args.replay is not None:
        print(replay(args.replay, args.workers))
        return
    rows = []
    for given in args.read:
        workers, rest = given.split("=", 1)
        folder, _, wall = rest.partition(":")
        rows.append(row(int(workers), Path(folder), float(wall) if wall else None))
    for workers in args.workers if not args.read else []:
        out = args.out / f"w{workers}"
        rows.append(row(workers, out, run(args.model, args.calib, workers, out, extra)))
    print(table(rows))
    first = rows[0]
    same = all((r["steps"], r["sites"], r["achieved"]) == (first["steps"], first["sites"], first["achieved"])
               for r in rows)
    print(f"same steps, plan and achieved figures for every W: {same}")


if __name__ == "__main__":
    main()
