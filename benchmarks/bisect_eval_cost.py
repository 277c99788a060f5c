"""What one bisection evaluation costs, two source trees side by side, on the same candidates (issue 41 part 8).

Why: on a shared machine a bisect's wall follows the load, and main's and this branch's searches run at other
times. Here both trees judge the same candidate sets (the first `--count` steps of a finished session, in its
order) with the search's judge (RealisedEvaluator, default rounding: 4 realisations, a failing candidate
stopped at its first realisation under the target), each tree in its own child process, alternated
`--rounds` times, and the table gives the children's CPU seconds per candidate and their ratio, and the
realisation sweeps the candidates took. The verdicts must be the same in both trees, and so must every passing
candidate's value; a failing candidate's value is the bound over the realisations it measured, which the
order they are measured in (robust.judging_order) may change: the table says how many differ.

Run: OMP_NUM_THREADS=1 nice python benchmarks/bisect_eval_cost.py --session S/session.json \
         --before /work/main/src --after src --model ppocrv4_rec --limit 16 --count 24 [--stride 6]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, run_own_child  # noqa: E402  (benchmarks/ is not a package)

ASSETS = Path(__file__).resolve().parents[2] / "shared" / "assets"
MARKER = "@@eval-cost "


def child(spec: dict[str, Any]) -> None:
    """Judge the candidate sets as the search does; print CPU seconds and values."""
    from quantscan.bisect.realise import RealisedEvaluator, split_context
    from quantscan.bisect.robust import Rounding
    from quantscan.bisect.state import Target
    from quantscan.scanning.gain import mixed_builder
    from quantscan.scanning.options import ScanOptions
    from quantscan.scanning.prepare import prepare_scan

    model, calib = spec["paths"]
    ctx = prepare_scan(model, calib, opts=ScanOptions(limit=spec["limit"]))
    rounding = Rounding()
    split = split_context(ctx, rounding, False)
    builder = mixed_builder(ctx, "float")
    judge = RealisedEvaluator(split.search, builder, Target("cosine", spec["target"]), rounding,
                              "cached_reference", stop_early=True)
    judge.judge(builder.precisions(()))  # the FP32 outputs and onnxruntime's first session, not timed
    nodes = [s.node for s in ctx.graph.sites]
    sets = spec["sets"] or [nodes[:round(f * len(nodes))] for f in spec["fractions"]]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    judged = [judge.judge(builder.precisions(sites)) for sites in sets]
    print(MARKER + json.dumps({"cpu": time.process_time() - cpu0, "wall": time.perf_counter() - wall0,
                               "values": [j.value for j in judged],
                               "sweeps": sum(len(j.realisations) for j in judged)}), flush=True)


def run(tree: str, spec: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": tree, "OMP_NUM_THREADS": "1"}
    answer = run_own_child(__file__, spec, MARKER, env)
    if "error" in answer:
        raise SystemExit(f"child on {tree} failed: {answer['error']}")
    return answer


def _agreement(got: dict[str, list[dict[str, Any]]], target: float) -> tuple[str, str]:
    """(verdicts, values) of every run against the first `before` run: verdicts `same` or `DIFFER`; values
    `same` bit for bit, or how many differ and whether any of them is a passing candidate's."""
    first = got["before"][0]["values"]
    runs = [r["values"] for v in got.values() for r in v]
    verdicts = all([x >= target for x in r] == [x >= target for x in first] for r in runs)
    differ = {i for r in runs for i, (x, y) in enumerate(zip(r, first, strict=True)) if x != y}
    passing = sum(first[i] >= target for i in differ)
    values = "same" if not differ else f"{len(differ)} failing differ" if not passing else f"{passing} PASSING DIFFER"
    return ("same" if verdicts else "DIFFER"), values


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--session", type=Path, help="a finished bisect's session.json (its steps are the candidates)")
    p.add_argument("--before", default="/work/main/src")
    p.add_argument("--after", default=str(Path(__file__).resolve().parents[1] / "src"))
    p.add_argument("--model", default="ppocrv4_rec", help="an asset name, or a name for --model-path")
    p.add_argument("--model-path", type=Path, default=None, help="with --calib-path: a model outside the assets")
    p.add_argument("--calib-path", type=Path, default=None)
    p.add_argument("--target", type=float, default=None, help="cosine target without --session")
    p.add_argument("--fractions", type=float, nargs="+", default=[1.0, 0.5],
                   help="without --session: candidates keeping these fractions of the sites float, in graph order")
    p.add_argument("--limit", type=int, default=16)
    p.add_argument("--count", type=int, default=24)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--stride", type=int, default=1,
                   help="with --session: every STRIDE-th step (a sample of the whole search, not its first steps)")
    args = p.parse_args()
    if args.child:
        child(json.loads(args.child))
        return 0
    paths = [str(args.model_path), str(args.calib_path)] if args.model_path else [
        str(ASSETS / "models" / f"{args.model}.onnx"), str(ASSETS / "calib" / args.model)]
    if args.session is not None:
        session = json.loads(args.session.read_text())
        evals = [e for e in session["events"] if e.get("kind") == "eval"]
        steps = evals[2::args.stride][:args.count]  # past all-float/int8
        spec = {"paths": paths, "limit": args.limit, "target": session["options"]["target_value"],
                "sets": [e["sites"] for e in steps]}
        passed = str(sum(bool(e["passed"]) for e in steps))
    else:
        spec = {"paths": paths, "limit": args.limit, "target": args.target, "fractions": args.fractions, "sets": []}
        passed = "?"
    got: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for _ in range(args.rounds):
        for name, tree in (("before", args.before), ("after", args.after)):
            got[name].append(run(tree, spec))
    n = len(spec["sets"]) or len(args.fractions)
    if passed == "?":
        passed = str(sum(v >= spec["target"] for v in got["before"][0]["values"]))
    cpu = {k: min(r["cpu"] for r in v) / n for k, v in got.items()}
    print(markdown_table(
        ["model", "candidates (passing)", "before CPU s / candidate", "after CPU s / candidate", "after / before",
         "sweeps before, after", "verdicts", "values", "load"],
        [[args.model, f"{n} ({passed})", f"{cpu['before']:.3f}", f"{cpu['after']:.3f}",
          f"{cpu['after'] / cpu['before']:.2f}", f"{got['before'][0]['sweeps']}, {got['after'][0]['sweeps']}",
          *_agreement(got, spec["target"]), f"{os.getloadavg()[0]:.1f}"]]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
